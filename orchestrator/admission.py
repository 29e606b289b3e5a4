"""Admission of Generate streams: at most max_sessions generate at once, at most max_queue wait for a
slot; beyond them RESOURCE_EXHAUSTED at once, before any work (docs/batching.md). A stream waits
no longer than its client's deadline."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from specpipe.config.services import AdmissionConfig  # its settings: generations running, and waiting
from specpipe.core.errors import DeadlineExceeded, ResourceExhausted
from specpipe.runtime import metrics

REASONS = ("full", "deadline")  # why a stream is refused (specpipe_admission_rejections_total)


class Admission:
    def __init__(self, config: AdmissionConfig = AdmissionConfig()):
        self.config = config
        metrics.zero(metrics.ADMISSION_REJECTIONS, *({"role": "orchestrator", "reason": r} for r in REASONS))
        self._running = 0
        self._waiting = 0
        self._cond = threading.Condition()

    @property
    def waiting(self) -> int:
        return self._waiting

    @contextlib.contextmanager
    def slot(self, timeout_s: float | None = None) -> Iterator[None]:
        """Hold one generation slot for the body; timeout_s: how long a queued stream may wait."""
        start = time.perf_counter()
        with self._cond:
            if self._running >= self.config.max_sessions:
                if self._waiting >= self.config.max_queue:
                    metrics.ADMISSION_REJECTIONS.labels(role="orchestrator", reason="full").inc()
                    raise ResourceExhausted(
                        f"orchestrator is full: {self._running} generations running (max {self.config.max_sessions}) "
                        f"and {self._waiting} waiting (max {self.config.max_queue}); retry later")
                self._waiting += 1
                metrics.QUEUE_DEPTH.labels(role="orchestrator").set(self._waiting)
                try:
                    if not self._cond.wait_for(lambda: self._running < self.config.max_sessions, timeout_s):
                        metrics.ADMISSION_REJECTIONS.labels(role="orchestrator", reason="deadline").inc()
                        raise DeadlineExceeded(f"no generation slot freed within the deadline ({timeout_s:.1f} s)")
                finally:
                    self._waiting -= 1
                    metrics.QUEUE_DEPTH.labels(role="orchestrator").set(self._waiting)
            self._running += 1
        metrics.QUEUE_WAIT_MS.labels(role="orchestrator").observe((time.perf_counter() - start) * 1e3)
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify()

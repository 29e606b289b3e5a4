"""Admission of generations, both APIs through one queue: at most max_sessions generate at once, at
most max_queue wait for a slot; beyond them RESOURCE_EXHAUSTED at once, before any work
(docs/batching.md, docs/http-api.md). A gRPC stream waits on its thread, an HTTP request on the
event loop (no thread held while queued); both wait in one FIFO, no longer than their deadline, and
leave it when their client goes away. A freed slot passes straight to the first waiter."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from specpipe.config.services import AdmissionConfig  # its settings: generations running, and waiting
from specpipe.core.errors import Cancelled, DeadlineExceeded, ResourceExhausted
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import Cancellation

RETRY_AFTER_S = 1  # what a refused client is told to wait (HTTP Retry-After)


class Ticket:
    """A slot held: release() (idempotent, from any thread) gives it to the next waiter."""

    def __init__(self, admission: Admission):
        self._admission = admission
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._admission._leave()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Waiter:
    """One queued request; granted() is called under the admission's lock when a slot passes to it."""

    def __init__(self, wake: Callable[[], None]):
        self.granted = False
        self._wake = wake

    def grant(self) -> None:
        self.granted = True
        self._wake()


REASONS = ("full", "deadline")  # why a stream is refused (specpipe_admission_rejections_total)


class Admission:
    def __init__(self, config: AdmissionConfig = AdmissionConfig()):
        self.config = config
        metrics.zero(metrics.ADMISSION_REJECTIONS, *({"role": "orchestrator", "reason": r} for r in REASONS))
        self._running = 0
        self._queue: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return self._running

    def admit(self, timeout_s: float | None = None, cancellation: Cancellation | None = None) -> Ticket:
        """A slot, waiting on this thread up to timeout_s (None: no limit) unless cancellation is set first."""
        start = time.perf_counter()
        woken = threading.Event()
        waiter = self._enter(woken.set)
        if waiter is not None:
            forget = cancellation.on_cancel(woken.set) if cancellation is not None else lambda: None
            try:
                woken.wait(timeout_s)
            finally:
                forget()
            self._settle(waiter, timeout_s, cancelled=cancellation is not None and cancellation.cancelled)
        return self._ticket(start)

    async def admit_async(self, timeout_s: float | None = None) -> Ticket:
        """A slot, waiting on the event loop up to timeout_s; a cancelled task leaves the queue."""
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        granted = loop.create_future()

        def grant() -> None:
            if not granted.done():
                granted.set_result(None)

        def wake() -> None:  # called under the lock, maybe on another thread
            loop.call_soon_threadsafe(grant)

        waiter = self._enter(wake)
        if waiter is not None:
            try:
                await asyncio.wait_for(asyncio.shield(granted), timeout_s)
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if self._abandon(waiter):
                    raise
                self._leave()  # the slot came as the client left: pass it on
                raise
            self._settle(waiter, timeout_s, cancelled=False)
        return self._ticket(start)

    @contextlib.contextmanager
    def slot(self, timeout_s: float | None = None, cancellation: Cancellation | None = None) -> Iterator[None]:
        """Hold one slot for the body (admit() and its release)."""
        with self.admit(timeout_s, cancellation):
            yield

    def _enter(self, wake: Callable[[], None]) -> _Waiter | None:
        """None: a slot is taken now; else the waiter queued; RESOURCE_EXHAUSTED when the queue is full."""
        with self._lock:
            if self._running < self.config.max_sessions and not self._queue:
                self._running += 1
                return None
            if len(self._queue) >= self.config.max_queue:
                metrics.ADMISSION_REJECTIONS.labels(role="orchestrator", reason="full").inc()
                raise ResourceExhausted(
                    f"orchestrator is full: {self._running} generations running (max {self.config.max_sessions}) "
                    f"and {len(self._queue)} waiting (max {self.config.max_queue}); retry later")
            waiter = _Waiter(wake)
            self._queue.append(waiter)
            self._publish()
            return waiter

    def _settle(self, waiter: _Waiter, timeout_s: float | None, cancelled: bool) -> None:
        """After the wait: granted, or out of the queue with why."""
        if not self._abandon(waiter):
            return
        if cancelled:
            raise Cancelled("the client went away while waiting for a generation slot")
        metrics.ADMISSION_REJECTIONS.labels(role="orchestrator", reason="deadline").inc()
        raise DeadlineExceeded(f"no generation slot freed within the deadline ({timeout_s:.1f} s)")

    def _abandon(self, waiter: _Waiter) -> bool:
        """Take a waiter that gave up out of the queue; False if a slot reached it first (it holds one)."""
        with self._lock:
            if waiter.granted:
                return False
            self._queue.remove(waiter)
            self._publish()
            return True

    def _leave(self) -> None:
        with self._lock:
            if self._queue:  # the slot passes on: running stays the same
                self._queue.popleft().grant()
                self._publish()
            else:
                self._running -= 1

    def _ticket(self, start: float) -> Ticket:
        metrics.QUEUE_WAIT_MS.labels(role="orchestrator").observe((time.perf_counter() - start) * 1e3)
        return Ticket(self)

    def _publish(self) -> None:
        metrics.QUEUE_DEPTH.labels(role="orchestrator").set(len(self._queue))

"""A circuit breaker for calls whose failure costs only speed (the n-gram store's lookups): after a
failure the calls are skipped for a pause that doubles with each failure in a row, up to a cap, so a
store that is down or partitioned costs one call timeout per pause instead of one per round
(docs/security.md, "Faults"). The first call after a pause is the probe: it closes the breaker if it
succeeds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class BreakerConfig:
    first_pause_s: float = 0.5  # after the first failure
    max_pause_s: float = 30.0   # the pause stops doubling here


def pause_after(failures: int, config: BreakerConfig) -> float:
    """Seconds to skip the calls after `failures` failures in a row (0: none failed)."""
    if failures <= 0:
        return 0.0
    return min(config.max_pause_s, config.first_pause_s * 2.0 ** (failures - 1))


class Breaker:
    def __init__(self, config: BreakerConfig = BreakerConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._failures = 0
        self._closed_at = 0.0  # calls are skipped until this time
        self._lock = threading.Lock()

    def allows(self) -> bool:
        with self._lock:
            return self._clock() >= self._closed_at

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            self._closed_at = self._clock() + pause_after(self._failures, self.config)

    def succeeded(self) -> None:
        with self._lock:
            self._failures, self._closed_at = 0, 0.0

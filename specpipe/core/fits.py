"""Online fits of measured costs, weighted toward recent samples so they follow a machine whose
speed changes: the verifier's forward time against tokens (adaptive control, orchestrator/costs.py;
the batch scheduler's prompt chunks, specpipe/engine/scheduler.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class LinearFit:
    """y = a + b*x by exponentially weighted least squares: each new sample multiplies the weight of
    the older ones by `decay`, so the fit follows a machine whose speed changes."""

    decay: float = 0.97
    proportional: bool = False  # while one x only has been seen: y = b*x through it (else a level line)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wx, wy, wxx, wxy
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, x: float, y: float) -> None:
        with self._lock:
            s = [v * self.decay for v in self._sums]
            self._sums = [s[0] + 1, s[1] + x, s[2] + y, s[3] + x * x, s[4] + x * y]

    def line(self) -> tuple[float, float] | None:
        """(a, b); None before the first sample."""
        with self._lock:
            w, wx, wy, wxx, wxy = self._sums
        if w <= 0:
            return None
        var = w * wxx - wx * wx
        if var <= 1e-9 * max(1.0, w * wxx):  # one x so far
            return (0.0, wy / wx) if self.proportional and wx > 0 else (wy / w, 0.0)
        b = max(0.0, (w * wxy - wx * wy) / var)  # time never falls with more tokens
        return (wy - b * wx) / w, b

    def predict(self, x: float, default: float = 0.0) -> float:
        fit = self.line()
        return default if fit is None else max(0.0, fit[0] + fit[1] * x)


class Ewma:
    """An exponentially weighted mean of recent samples, thread-safe."""

    def __init__(self, decay: float = 0.9):
        self._decay = decay
        self._sums = (0.0, 0.0)  # weight, weighted sum
        self._lock = threading.Lock()

    def add(self, value: float) -> None:
        with self._lock:
            w, total = self._sums
            self._sums = (w * self._decay + 1.0, total * self._decay + value)

    def mean(self, default: float = 0.0) -> float:
        with self._lock:
            w, total = self._sums
        return total / w if w else default

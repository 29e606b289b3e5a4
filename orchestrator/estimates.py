"""The one acceptance model: P(a draft node is accepted), learned online from verified rounds.

Adaptive control (orchestrator/adaptive.py) and the calibrated branch predictor
(orchestrator/predictors.py) both estimate rates keyed by features of a draft node (its depth, its
source, the drafter's confidence, the verifier's entropy). Both estimate them the same way: the
rounds of all sessions together (Rates shared per orchestrator), leaning on a prior until there is
evidence, and each session on the shared estimate until it has evidence of its own.
"""

from __future__ import annotations

import threading
from collections import defaultdict

MAX_DEPTH = 16  # rates are learned per depth up to this one; deeper nodes share its key


def depth_key(depth: int) -> int:
    return min(depth, MAX_DEPTH)


def confidence_bin(p: float) -> int:
    """Tenths of a drafter's confidence (-1: none)."""
    return -1 if p < 0 else min(9, int(p * 10))


def shrink(hits: int, trials: int, prior: float, weight: float) -> float:
    """The hit rate with `weight` pseudo-trials at `prior` (a Beta prior)."""
    return (hits + weight * prior) / (trials + weight)


class Rates:
    """Hit counts by feature key, thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])  # key -> [hits, trials]

    def add(self, key: tuple, hit: bool) -> None:
        with self._lock:
            counts = self._counts[key]
            counts[0] += hit
            counts[1] += 1

    def get(self, key: tuple) -> tuple[int, int]:
        with self._lock:
            hits, trials = self._counts.get(key, (0, 0))
            return hits, trials


class Acceptance:
    """One generation's view of a shared Rates: rate(key) = the session's hit rate, shrunk toward the
    shared one, itself shrunk toward a prior."""

    def __init__(self, shared: Rates, session_weight: float):
        self.shared = shared
        self.session = Rates()
        self._session_weight = session_weight  # pseudo-trials of the shared estimate in the session's

    def rate(self, key: tuple, prior: float, prior_weight: float) -> float:
        estimate = shrink(*self.shared.get(key), prior, prior_weight)
        return shrink(*self.session.get(key), estimate, self._session_weight)

    def add(self, key: tuple, hit: bool) -> None:
        self.shared.add(key, hit)
        self.session.add(key, hit)

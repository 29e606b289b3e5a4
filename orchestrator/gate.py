"""The speculation gate (docs/adaptive.md, "The orchestrator's own cost"): whether an orchestrator's
generations of one drafter kind draft at all, decided from what the orchestrator as a whole emits.

Adaptive control prices a round by what its session sees: the verifier's forward and the drafter's time.
What a drafted round costs the orchestrator's own CPU (the lookup, the tree budget over every node,
bigger messages) slows every session's turnaround alike, so a session's rounds with a draft and
without take about as long and its drafts look free to it. Where the verifier is fast (a GPU) and many
generations share one orchestrator, that CPU is the price: chat drafts there gave 0.68x plain decoding
at 16 users (docs/results/2026-12-07-speculation-gpu-cost.md).

The gate measures instead of modelling. While at least two generations run, it runs windows of one
arm, drafting as adaptive control chooses (on) or plain rounds (off), and counts the tokens a second
the kind's generations emit in each. It keeps the arm that gave more (at first: on), and runs the other
for one window after `hold` windows of it. That window is compared with the mean of the windows either
side (so a trend in the load does not decide, and a window at another load is no comparison); where
it gave at least MARGIN more, its arm takes over. The wait doubles each time the kept arm wins, and is
at least as long as keeps what the explored windows lose within EXPLORE_SHARE (up to MAX_HOLD); it
starts again from that floor when the load moved, and from MIN_HOLD after a switch. A window lasts
WINDOW_S and at least WINDOW_ROUNDS rounds a generation; one in which the generations paused is
dropped. One generation alone is never gated: its own rounds show what its drafts cost it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specpipe.runtime import metrics

log = logging.getLogger("specpipe.orchestrator")

WINDOW_S = 0.5         # a window's shortest wall time
WINDOW_ROUNDS = 4      # ... and its fewest rounds a generation
MARGIN = 0.05          # the other arm takes over where it gave this much more tokens a second
MIN_HOLD = 2           # windows of the kept arm before the other is tried again (after a switch, a new load)
MAX_HOLD = 32          # ... doubling each time the kept arm wins, up to this many
EXPLORE_SHARE = 0.02   # ... and at least as many as keep what the explored windows lose within this share
LOAD_TOLERANCE = 0.25  # windows whose mean loads differ by more are not compared; the load moved
GATED_LOAD = 2         # generations running from which the gate decides
IDLE_S = 1.0           # a window with no round for this long is dropped: the generations paused


@dataclass
class Window:
    """One arm's window: what the kind's generations emitted in it."""

    drafting: bool
    start: float
    tokens: int = 0
    rounds: int = 0
    load_sum: float = 0.0  # generations running, summed over its rounds
    last: float = 0.0      # its last round's time

    @property
    def load(self) -> float:
        return self.load_sum / max(1, self.rounds)

    def rate(self, end: float) -> float:
        return self.tokens / max(1e-9, end - self.start)


@dataclass(frozen=True)
class Reading:
    """A closed window: tokens a second at a mean load."""

    rate: float
    load: float


def same_load(a: float, b: float) -> bool:
    return abs(a - b) <= LOAD_TOLERANCE * max(a, b)


def other_wins(explored: Reading, before: Reading | None, after: Reading) -> bool | None:
    """Whether the explored arm beat the kept arm's windows either side by MARGIN; None where they are
    no comparison (a neighbour missing, or at another load)."""
    if before is None or not (same_load(explored.load, before.load) and same_load(explored.load, after.load)):
        return None
    return explored.rate >= (1 + MARGIN) * (before.rate + after.rate) / 2


class SpeculationGate:
    """One drafter kind's gate in one orchestrator (shared by its generations; thread-safe)."""

    def __init__(self, kind: str, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S,
                  drafting: bool = True):
        """drafting: the arm kept at first."""
        self.kind = kind
        self.kept = drafting     # the arm run between explorations (True: drafting)
        self._clock = clock
        self._window_s = window_s
        self._hold = MIN_HOLD    # windows of the kept arm before the next exploration
        self._held = 0           # ... run since the last one
        self._before: Reading | None = None    # the kept arm's window before an exploration
        self._explored: Reading | None = None  # the explored window, awaiting the one after it
        self._decided_load = 0.0               # the load of the last comparison
        self._window = Window(drafting, clock())
        self._lock = threading.Lock()
        self._gauge = metrics.SPECULATION_GATE.labels(drafter=kind)
        self._gauge.set(int(drafting))

    def drafting(self, load: int) -> bool:
        """Whether a round of a generation may draft now (load: generations running)."""
        return load < GATED_LOAD or self._window.drafting

    def record(self, tokens: int, load: int) -> None:
        """A round of one of the kind's generations emitted tokens while load generations ran."""
        with self._lock:
            window, now = self._window, self._clock()
            if now - max(window.start, window.last) > IDLE_S:  # not a window of steady work: start again
                self._before = self._explored = None
                window = self._window = Window(window.drafting, now)
            window.tokens += tokens
            window.rounds += 1
            window.load_sum += load
            window.last = now
            if now - window.start >= self._window_s and window.rounds >= WINDOW_ROUNDS * window.load:
                self._window = Window(self._close(window, now), now)
                self._gauge.set(int(self._window.drafting))

    def _close(self, window: Window, now: float) -> bool:
        """Take a closed window's reading; the next window's arm."""
        reading = Reading(window.rate(now), window.load)
        if reading.load < GATED_LOAD:  # not gated: what it shows is no comparison
            self._before = self._explored = None
            return self.kept
        if window.drafting != self.kept:  # an explored window: the next one (the kept arm) decides
            self._explored = reading
            return self.kept
        if self._explored is not None:
            self._decide(self._explored, reading)
            self._explored = None
        if window.drafting != self.kept:  # the arm switched: this window is the other arm's
            self._before = None
            return self.kept
        self._before, self._held = reading, self._held + 1
        if self._held < self._hold:
            return self.kept
        self._held = 0
        return not self.kept

    def _decide(self, explored: Reading, after: Reading) -> None:
        wins = other_wins(explored, self._before, after)
        if wins is None or self._before is None:
            return
        moved, self._decided_load = not same_load(explored.load, self._decided_load), explored.load
        if not wins:
            lost = 1 - explored.rate / max(1e-9, (self._before.rate + after.rate) / 2)  # in the explored window
            floor = min(MAX_HOLD, math.ceil(lost / EXPLORE_SHARE))  # explorations costing at most EXPLORE_SHARE
            self._hold = max(MIN_HOLD, floor) if moved else min(MAX_HOLD, max(2 * self._hold, floor))
            return
        self.kept, self._hold, self._held = not self.kept, MIN_HOLD, 0
        log.info("speculation gate switched", extra={
            "drafter": self.kind, "drafting": self.kept, "load": round(explored.load, 1),
            "tokens_per_s": round(explored.rate, 1),
            "other_arm_tokens_per_s": round((self._before.rate + after.rate) / 2, 1)})

"""Branch predictors: the outcomes of a round worth drafting the next round for (docs/design.md,
"Branch-prediction scheduling").

An outcome of a round is (gamma, g): gamma tokens of the draft's main chain accepted, then the
correction g. Candidates, one per gamma: g = the drafter's runner-up at position gamma + 1 when
gamma < n, and g = the drafter's own next token (BONUS: known once the pre-draft has drafted it) when
gamma = n. Both predictors learn from every round they observe and rank the candidates:

- calibrated: a_i = P(node i accepted | the nodes before it were), from the drafter's confidence
  (and the node's depth and source) calibrated online (per session, leaning on the global estimate until the
  session has its own evidence); P(gamma) = a_1...a_gamma (1 - a_{gamma+1}) times P(c = g | gamma), calibrated
  the same way.
- paper: Duan et al. 2024, eq. 12, phi(x) = a p^x (1 - p) + c for x < n and the rest of the mass at n, with p,
  a and c fitted to the accepted counts observed so far; it ranks by phi(gamma) alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from orchestrator.estimates import Acceptance, Rates, confidence_bin, depth_key
from specpipe.core.trees import common_prefix, first_path_nodes
from specpipe.core.types import ALL_HYPOTHESES, ProposeResult, VerifyResult

BONUS = -1  # g of the all-accepted outcome: the drafter's own next token, drafted by the pre-draft


@dataclass(frozen=True)
class Hypothesis:
    accepted: tuple[int, ...]  # the gamma main-chain tokens predicted accepted
    correction: int            # g, or BONUS
    probability: float


@dataclass(frozen=True)
class Outcome:
    """What a round's verdict says about its main chain."""

    accepted: int          # leading main-chain nodes accepted
    on_chain: bool         # the accepted path is that main-chain prefix (not a side branch)
    correction: int


def outcome(proposal: ProposeResult, result: VerifyResult) -> Outcome:
    accepted = common_prefix(first_path_nodes(proposal.draft), result.accepted_nodes)
    return Outcome(accepted, accepted == len(result.accepted_nodes), result.correction_token)


def candidates(proposal: ProposeResult) -> list[tuple[int, int]]:
    """(gamma, g) for every outcome of the main chain with a known g."""
    chain = first_path_nodes(proposal.draft)
    runner_up = proposal.draft.runner_up or (-1,) * len(proposal.draft)
    found = [(gamma, runner_up[node]) for gamma, node in enumerate(chain) if runner_up[node] >= 0]
    return found + [(len(chain), BONUS)]


def top(proposal: ProposeResult, scored: Sequence[tuple[int, int, float]], m: int) -> list[Hypothesis]:
    """The m most likely (gamma, g, probability), or all of them for m = ALL_HYPOTHESES."""
    chain = [proposal.draft.tokens[n] for n in first_path_nodes(proposal.draft)]
    ranked = sorted(scored, key=lambda s: -s[2])
    if m != ALL_HYPOTHESES:
        ranked = ranked[:m]
    return [Hypothesis(tuple(chain[:gamma]), g, p) for gamma, g, p in ranked]


class Predictor(Protocol):
    def hypotheses(self, proposal: ProposeResult, m: int) -> list[Hypothesis]:
        """The m most likely outcomes of verifying proposal, most likely first."""

    def observe(self, proposal: ProposeResult, result: VerifyResult, bonus: int | None) -> None:
        """Learn from a round; bonus: the drafter's own token after the whole chain, if drafted."""


class CalibratedPredictor:
    PRIOR_WEIGHT = 4.0    # pseudo-trials of the drafter's own confidence in the global estimate
    SESSION_WEIGHT = 8.0  # pseudo-trials of the global estimate in the session's
    BONUS_PRIOR = 0.7     # P(correction = the drafter's own next token | all accepted), before evidence
    UNKNOWN_PRIOR = 0.5   # acceptance of a node without confidence (n-gram), before evidence

    def __init__(self, shared: Rates):
        self._acceptance = Acceptance(shared, self.SESSION_WEIGHT)

    def _rate(self, key: tuple, prior: float) -> float:
        return self._acceptance.rate(key, prior, self.PRIOR_WEIGHT)

    def _add(self, key: tuple, hit: bool) -> None:
        self._acceptance.add(key, hit)

    @staticmethod
    def _keys(proposal: ProposeResult, node: int, depth: int) -> tuple[tuple, float, tuple, float]:
        """(acceptance key, its prior, runner-up key, its prior) of the main-chain node at depth."""
        draft = proposal.draft
        confidence = draft.confidence[node] if draft.confidence else -1.0
        source = draft.sources[node] if draft.sources else "model"
        runner_up = draft.runner_up_confidence[node] if draft.runner_up_confidence else 0.0
        # P(runner-up | the node's token rejected), as the drafter sees it
        conditional = runner_up / max(1e-6, 1.0 - confidence) if confidence >= 0 else -1.0
        return (("accept", source, confidence_bin(confidence), depth_key(depth)),
                confidence if confidence >= 0 else CalibratedPredictor.UNKNOWN_PRIOR,
                ("runner_up", source, confidence_bin(min(conditional, 1.0))),
                min(max(conditional, 0.0), 1.0) if conditional >= 0 else CalibratedPredictor.UNKNOWN_PRIOR)

    def hypotheses(self, proposal: ProposeResult, m: int) -> list[Hypothesis]:
        chain = first_path_nodes(proposal.draft)
        reach = 1.0  # P(the first gamma nodes accepted)
        prob_gamma = []
        for depth, node in enumerate(chain):
            accept_key, accept_prior, _, _ = self._keys(proposal, node, depth)
            a = self._rate(accept_key, accept_prior)
            prob_gamma.append(reach * (1.0 - a))
            reach *= a
        prob_gamma.append(reach)
        scored = []
        for gamma, g in candidates(proposal):
            if g == BONUS:
                scored.append((gamma, g, prob_gamma[gamma] * self._rate(("bonus",), self.BONUS_PRIOR)))
            else:
                _, _, runner_key, runner_prior = self._keys(proposal, chain[gamma], gamma)
                scored.append((gamma, g, prob_gamma[gamma] * self._rate(runner_key, runner_prior)))
        return top(proposal, scored, m)

    def observe(self, proposal: ProposeResult, result: VerifyResult, bonus: int | None) -> None:
        chain = first_path_nodes(proposal.draft)
        seen = outcome(proposal, result)
        for i, node in enumerate(chain[:seen.accepted + 1]):
            accept_key, _, runner_key, _ = self._keys(proposal, node, i)
            self._add(accept_key, i < seen.accepted)
            runner_up = proposal.draft.runner_up
            if i == seen.accepted and seen.on_chain and runner_up and runner_up[node] >= 0:
                self._add(runner_key, runner_up[node] == seen.correction)
        if seen.accepted == len(chain) and bonus is not None:
            self._add(("bonus",), bonus == seen.correction)


class AcceptedCounts:
    """Histograms of accepted main-chain tokens per chain length, shared by all sessions."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[int, list[int]] = {}

    def add(self, n: int, accepted: int) -> None:
        with self._lock:
            self._counts.setdefault(n, [0] * (n + 1))[accepted] += 1

    def get(self, n: int) -> list[int]:
        with self._lock:
            return list(self._counts.get(n, [0] * (n + 1)))


PRIOR_ACCEPTANCE = 0.8  # p before any round was observed


def fit_phi(counts: Sequence[int]) -> list[float]:
    """Eq. 12 fitted to a histogram of accepted counts x = 0..n: p by maximum likelihood under the IID
    model (each x < n is x successes and one failure, x = n is n successes), then the correction
    terms a and c by least squares of the empirical frequencies of x < n on p^x (1 - p)."""
    n = len(counts) - 1
    total = sum(counts)
    successes = sum(x * c for x, c in enumerate(counts))
    failures = sum(counts[:n])
    p = successes / (successes + failures) if successes + failures else PRIOR_ACCEPTANCE
    basis = [p ** x * (1 - p) for x in range(n)]
    freq = [c / total for c in counts[:n]] if total else basis
    a, c = least_squares_line(basis, freq) if n >= 2 else (1.0, 0.0)
    phi = [max(0.0, a * b + c) for b in basis]
    phi.append(max(0.0, 1.0 - sum(phi)))
    norm = sum(phi) or 1.0
    return [v / norm for v in phi]


def least_squares_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line; slope 1, intercept 0 when xs are all equal."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var < 1e-12:
        return 1.0, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var
    return slope, mean_y - slope * mean_x


class PaperPredictor:
    def __init__(self, shared: AcceptedCounts):
        self._counts = shared

    def hypotheses(self, proposal: ProposeResult, m: int) -> list[Hypothesis]:
        phi = fit_phi(self._counts.get(len(first_path_nodes(proposal.draft))))
        return top(proposal, [(gamma, g, phi[gamma]) for gamma, g in candidates(proposal)], m)

    def observe(self, proposal: ProposeResult, result: VerifyResult, bonus: int | None) -> None:
        self._counts.add(len(first_path_nodes(proposal.draft)), outcome(proposal, result).accepted)


def new_predictor(kind: str, shared: Any) -> Predictor:
    return CalibratedPredictor(shared) if kind == "calibrated" else PaperPredictor(shared)


def new_shared(kind: str) -> Any:
    """The state a predictor kind shares across sessions."""
    return Rates() if kind == "calibrated" else AcceptedCounts()

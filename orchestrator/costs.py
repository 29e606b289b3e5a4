"""The cost model of adaptive speculation (pure functions and online fits): what a round of k draft
tokens yields and costs, and which k or which draft nodes give the most tokens per millisecond.

- Cost (ProPD section 4.2): the verifier's forward time is linear in the tokens it feeds,
  T(n) = a + b*n, fitted online by least squares weighted toward recent rounds (LinearFit). With
  batched verification n counts every session's tokens in the forward.
- Yield: E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens for a round of k drafts, a_i the
  acceptance rates (orchestrator/estimates.py).
- Sharing (goodput, as SmartSpec / TurboSpec): a session whose forward is shared with others adds
  its k + 1 tokens to a forward that also feeds others_fed tokens and emits others_emitted tokens
  for them. Its choice maximises the tokens of the whole forward per millisecond of its round,
  (others_emitted + E(k)) / round(k), the round spanning T(others_fed + k + 1) and the draft time
  not hidden: a draft token is verified only where its expected yield beats what the same time
  gives the batch, so under heavy load speculation falls to plain batched decoding (k = 0). A
  draft's time is charged to the whole batch, which overstates it (the others' forwards run while
  it drafts); charging it to the session's own tokens lost at 16 users
  (docs/results/2026-11-25-load-curve-256-tokens.md). A verifier that runs one session at a time
  instead makes the others take turns (turns), which stretches a round without changing k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Sequence

from specpipe.core.types import ROOT

CostCurve = Callable[[float], float]  # milliseconds of a forward (or a draft) of n tokens (n: a mean may be fractional)


@dataclass(frozen=True)
class Sharing:
    """What a session's round shares with other sessions (estimated from recent rounds)."""

    others_fed: float = 0.0      # tokens other sessions feed into the same verifier forward
    others_emitted: float = 0.0  # tokens that forward emits for the other sessions
    turns: float = 1.0           # verifier forwards per round of this session (others' forwards in between)
    drafter_turns: float = 1.0   # likewise for the drafter, which drafts for one session at a time


ALONE = Sharing()


def serial(load: float) -> Sharing:
    """load sessions taking turns on a verifier and a drafter that serve one at a time."""
    return Sharing(turns=load, drafter_turns=load)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{i=1..k} a_1 ... a_i: tokens emitted by a round of k drafts (the correction
    or bonus token always comes)."""
    total, reach = 1.0, 1.0
    for a in acceptance[:k]:
        reach *= a
        total += reach
    return total


def round_ms(k: int, verify_ms: float, draft_ms: float, hit_rate: float, sharing: Sharing = ALONE,
             overhead_ms: float = 0.0) -> float:
    """Expected time of a round of k drafts: verify_ms = the forward's T(n) with this round's k + 1
    tokens in it, draft_ms = drafting k tokens, overhead_ms = what a round costs besides the forward
    passes (network, orchestration). The branch schedule hides min(draft, verify) of a round whose
    draft was pre-drafted (hit_rate; 0 for the sequential schedule). Other sessions' forwards and
    drafts in between (sharing.turns, drafter_turns) stretch a round."""
    if k == 0:
        draft_ms = 0.0
    alone = verify_ms + overhead_ms + draft_ms - hit_rate * min(draft_ms, verify_ms)
    return max(alone, sharing.turns * verify_ms, sharing.drafter_turns * draft_ms)


def round_rate(acceptance: Sequence[float], k: int, verify_ms: CostCurve, draft_ms: CostCurve, hit_rate: float = 0.0,
               sharing: Sharing = ALONE, overhead_ms: float = 0.0) -> float:
    """Expected tokens per millisecond of a round of k drafts, the tokens of the whole forward counted
    (sharing). verify_ms(n): T(n) for n tokens fed; draft_ms(k): time to draft k tokens;
    acceptance: a_1..a_kmax."""
    cost = round_ms(k, verify_ms(sharing.others_fed + k + 1), draft_ms(k), hit_rate, sharing, overhead_ms)
    return (sharing.others_emitted + expected_tokens(acceptance, k)) / max(1e-6, cost)


def choose_draft_len(acceptance: Sequence[float], verify_ms: CostCurve, draft_ms: CostCurve, k_max: int,
                     hit_rate: float = 0.0,
                     sharing: Sharing = ALONE, overhead_ms: float = 0.0) -> int:
    """The k in 0..k_max with the most expected tokens per millisecond (round_rate)."""
    best_k, best_rate = 0, 0.0
    for k in range(0, k_max + 1):
        rate = round_rate(acceptance, k, verify_ms, draft_ms, hit_rate, sharing, overhead_ms)
        if rate > best_rate * (1 + 1e-9):  # ties go to the shorter draft
            best_k, best_rate = k, rate
    return best_k


def node_acceptance(parents: Sequence[int], rate: Callable[[int, int, int], float]) -> list[float]:
    """P(node accepted) for each node of a draft tree (parents[v] < v, ROOT for the first level):
    P(parent accepted) * P(no earlier sibling was) * rate(v, depth, rank), where rate is P(v accepted
    | its parent was and its earlier siblings were not) and rank is v's place among its siblings."""
    probs: list[float] = []
    depth: dict[int, int] = {ROOT: 0}
    children: dict[int, int] = {}
    missed: dict[int, float] = {}  # parent -> P(none of its children so far was accepted | it was)
    for v, parent in enumerate(parents):
        depth[v] = depth[parent] + 1
        rank = children.get(parent, 0)
        children[parent] = rank + 1
        c = rate(v, depth[v], rank)
        before = missed.get(parent, 1.0)
        probs.append((1.0 if parent == ROOT else probs[parent]) * before * c)
        missed[parent] = before * (1.0 - c)
    return probs


def best_budget(probs: Sequence[float], verify_ms: CostCurve, spent_ms: float, sharing: Sharing = ALONE) -> list[int]:
    """After drafting: the nodes to verify (best_budget_rate)."""
    return best_budget_rate(probs, verify_ms, spent_ms, sharing)[0]


def best_budget_rate(probs: Sequence[float], verify_ms: CostCurve, spent_ms: float,
                     sharing: Sharing = ALONE) -> tuple[list[int], float]:
    """The nodes to verify and their expected tokens per millisecond. The m most likely nodes (a
    node is never more likely than its parent, so they form a tree) yield 1 + the sum of their
    probs tokens; m is the count with the most tokens per millisecond when spent_ms (draft,
    overheads) is paid whatever m is, the whole forward counted as in choose_draft_len;
    verify_ms(n): T(n) for n tokens fed. Ties go to the smaller tree. Node indices, ascending."""
    order = sorted(range(len(probs)), key=lambda v: (-probs[v], v))
    best_m, best_rate, tokens = 0, 0.0, 1.0 + sharing.others_emitted
    for m in range(len(order) + 1):
        tokens += probs[order[m - 1]] if m else 0.0
        forward_ms = verify_ms(sharing.others_fed + m + 1)
        rate = tokens / max(1e-6, spent_ms + forward_ms, sharing.turns * forward_ms)
        if rate > best_rate * (1 + 1e-9):
            best_m, best_rate = m, rate
    return sorted(order[:best_m]), best_rate


def hypotheses_that_fit(verify_ms: float, draft_ms: float, m_max: int) -> int:
    """Pre-drafts run one after another while the verifier works: as many as fit in its time, at
    least one."""
    if draft_ms <= 0:
        return m_max
    return max(1, min(m_max, int(verify_ms // draft_ms)))

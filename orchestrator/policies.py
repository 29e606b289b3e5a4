"""Draft policies: how much a generation drafts each round, and which drafted nodes it verifies.

- fixed: the request's draft length k and pre-drafts M, every drafted node verified;
- adaptive: k, M and the nodes kept chosen each round by AdaptiveController (orchestrator/adaptive.py)
  from what rounds cost and yield, learned online, while the orchestrator's speculation gate
  (orchestrator/gate.py) lets the generations of its drafter kind draft at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from orchestrator.adaptive import FREE_DRAFTERS, AdaptiveController, SharedModels
from orchestrator.gate import SpeculationGate
from specpipe.core.trees import common_prefix, first_path_nodes, tried_children
from specpipe.core.types import ALL_HYPOTHESES, ProposeResult, SpeculationOptions, VerifyResult
from specpipe.runtime import metrics

VERIFY_COST_FIXED = metrics.VERIFY_COST_MS.labels(term="fixed")
VERIFY_COST_PER_TOKEN = metrics.VERIFY_COST_MS.labels(term="per_token")


@dataclass(frozen=True)
class Verified:
    """A round as a draft policy learns from it."""

    proposal: ProposeResult    # what was verified
    as_drafted: ProposeResult  # before trim()
    result: VerifyResult
    call_ms: float             # the verify call as the orchestrator saw it
    load: int                  # generations running


class DraftPolicy(Protocol):
    def drafting(self, load: int) -> bool:
        """Whether a round may draft at all, the free drafter's lookups included (load: generations running)."""

    def draft_len(self, load: int, branch: bool) -> int:
        """k for the next round (before the generation's room caps it); load: generations sharing the verifier."""

    def hypotheses(self, in_flight: ProposeResult, load: int) -> int:
        """Pre-drafts to run while in_flight verifies (branch schedule)."""

    def trim(self, proposal: ProposeResult, load: int) -> ProposeResult:
        """The nodes of a fresh draft worth verifying."""

    def suffices(self, free: ProposeResult, draft_len: int, load: int, branch: bool) -> bool:
        """Whether the free drafter's draft beats a round drafting draft_len with the drafter (n-gram first)."""

    def observe(self, verified: Verified) -> None: ...

    def observe_prediction(self, hit: bool) -> None: ...


class FixedPolicy:
    def __init__(self, spec: SpeculationOptions):
        self._spec = spec

    def drafting(self, load: int) -> bool:
        return True

    def draft_len(self, load: int, branch: bool) -> int:
        return self._spec.draft_len

    def hypotheses(self, in_flight: ProposeResult, load: int) -> int:
        return self._spec.hypotheses

    def trim(self, proposal: ProposeResult, load: int) -> ProposeResult:
        return proposal

    def suffices(self, free: ProposeResult, draft_len: int, load: int, branch: bool) -> bool:
        return False

    def observe(self, verified: Verified) -> None:
        pass

    def observe_prediction(self, hit: bool) -> None:
        pass


class AdaptivePolicy:
    def __init__(self, shared: SharedModels, spec: SpeculationOptions, gate: SpeculationGate):
        m_max = spec.draft_len + 1 if spec.hypotheses == ALL_HYPOTHESES else spec.hypotheses
        self._controller = AdaptiveController(shared, spec.drafter, spec.draft_len, m_max)
        self._shared = shared
        self._kind = spec.drafter
        self._gate = gate
        self._draft_len_metric = metrics.ADAPTIVE_DRAFT_LEN.labels(drafter=spec.drafter)  # bound once, not a round

    def drafting(self, load: int) -> bool:
        return self._gate.drafting(load)

    def draft_len(self, load: int, branch: bool) -> int:
        return self._controller.draft_len(load, branch) if self._gate.drafting(load) else 0

    def hypotheses(self, in_flight: ProposeResult, load: int) -> int:
        return self._controller.hypotheses(len(first_path_nodes(in_flight.draft)), load)

    def trim(self, proposal: ProposeResult, load: int) -> ProposeResult:
        """The draft without the nodes whose expected acceptance does not pay for verifying them."""
        draft = proposal.draft
        if not len(draft):
            return proposal
        nodes = self._controller.keep(draft.parents, draft.node_sources(), proposal.draft_ms, load, draft.confidence)
        if len(nodes) == len(draft):
            return proposal
        metrics.TRIMMED_DRAFT_TOKENS.labels(drafter=self._kind).inc(len(draft) - len(nodes))
        return replace(proposal, draft=draft.select(nodes))

    def suffices(self, free: ProposeResult, draft_len: int, load: int, branch: bool) -> bool:
        draft = free.draft
        return self._controller.free_suffices(draft.parents, draft.node_sources(), draft.confidence, free.draft_ms,
                                              draft_len, load, branch)

    def observe(self, verified: Verified) -> None:
        draft, result = verified.proposal.draft, verified.result
        chain, sources = (first_path_nodes(draft), draft.node_sources()) if len(draft) else ((), ())
        alternatives = [(depth, rank, hit) for _, depth, rank, hit in
                        tried_children(draft.parents, result.accepted_nodes) if rank] if len(draft) else ()
        self._controller.observe(
            len(chain), common_prefix(chain, result.accepted_nodes), result.verify_ms, verified.proposal.draft_ms,
            result.entropy, verified.call_ms, sources=[sources[n] for n in chain],
            confidence=[draft.confidence[n] for n in chain] if draft.confidence else (),
            draft_tokens=len(first_path_nodes(verified.as_drafted.draft)), nodes=len(draft), alternatives=alternatives,
            batch_sessions=result.batch_sessions, batch_tokens=result.batch_tokens,
            free=self._kind not in FREE_DRAFTERS and bool(len(draft)) and "model" not in sources)
        self._draft_len_metric.observe(len(chain))
        self._gate.record(len(result.emitted), verified.load)
        fit = self._shared.verify.line()
        if fit is not None:
            VERIFY_COST_FIXED.set(fit[0])
            VERIFY_COST_PER_TOKEN.set(fit[1])

    def observe_prediction(self, hit: bool) -> None:
        self._controller.observe_prediction(hit)

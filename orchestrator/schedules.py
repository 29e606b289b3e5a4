"""Schedules: when the drafter drafts relative to the verifier (the technical report's section 5).

- sequential: draft round r, verify it, then draft round r+1 from the verdict;
- branch: while round r verifies, draft round r+1 for its predicted outcomes (orchestrator/branch.py);
  a hit gives the next draft at once, a miss drafts afresh.

A schedule owns the session's epoch (bumped on every rollback) and yields proposals; the verdicts
only ever come from the verifier."""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

from specpipe import metrics
from specpipe.errors import Aborted
from specpipe.protocols import Drafter, Verifier
from specpipe.types import EMPTY_DRAFT, ProposeRequest, ProposeResult, VerifyResult
from orchestrator.branch import NO_SPECULATION, BranchScheduler, Resolution
from orchestrator.generation import Generation
from orchestrator.predictors import Hypothesis, Predictor

log = logging.getLogger("specpipe.orchestrator")

NO_DRAFT = ProposeResult(EMPTY_DRAFT, 0.0)


@dataclass(frozen=True)
class Proposer:
    """A generation's drafter calls. A failing drafter slows the generation down, never breaks it:
    the round goes on without a draft."""

    drafter: Drafter | None  # None: the verifier alone
    kind: str                # the drafter's kind (DRAFTER_KINDS), for metrics
    template: ProposeRequest  # session, width and sampling of every proposal

    def propose(self, context: Sequence[int], draft_len: int, epoch: int) -> ProposeResult:
        if self.drafter is None or draft_len <= 0:
            return NO_DRAFT
        try:
            return self.drafter.propose(replace(self.template, context=tuple(context), draft_len=draft_len, epoch=epoch))
        except Exception as err:
            self.failed(err)
            return NO_DRAFT

    def failed(self, err: Exception) -> None:
        if isinstance(err, Aborted):  # a dropped hypothesis, stopped by the drafter on purpose
            return
        metrics.DRAFT_FAILURES.labels(drafter=self.kind).inc()
        log.warning("drafter failed, verifying without that draft",
                    extra={"session_id": self.template.session_id, "error": str(err)})


class Schedule(Protocol):
    epoch: int

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        """Open the verifier's session (prefill) and draft the first round."""

    def verify(self, gen: Generation, proposal: ProposeResult, as_drafted: ProposeResult, hypotheses: int,
               draft_len: Callable[[int], int]) -> VerifyResult:
        """Verify proposal (as_drafted: before the draft policy trimmed it). hypotheses: pre-drafts to
        run meanwhile; draft_len(emitted): the next round's draft length after `emitted` tokens."""

    def next(self, gen: Generation, proposal: ProposeResult, result: VerifyResult, draft_len: Callable[[], int],
             verify_start: float, verify_end: float) -> tuple[ProposeResult, Resolution]:
        """The next round's draft, after gen has confirmed result; how it came (a pre-draft or not)."""

    def close(self) -> None: ...


class Sequential:
    def __init__(self, verifier: Verifier, proposer: Proposer):
        self.epoch = 0
        self._verifier = verifier
        self._proposer = proposer

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        self._verifier.prefill(gen.session_id, gen.request.prompt_ids)
        return self._proposer.propose(gen.context, draft_len, self.epoch)

    def verify(self, gen, proposal, as_drafted, hypotheses, draft_len) -> VerifyResult:
        result = self._verifier.verify(gen.session_id, len(gen.context), proposal.draft, gen.request.sampling)
        self.epoch += len(result.accepted_tokens) < len(as_drafted.draft)  # the drafter rolls back
        return result

    def next(self, gen, proposal, result, draft_len, verify_start, verify_end) -> tuple[ProposeResult, Resolution]:
        return self._proposer.propose(gen.context, draft_len(), self.epoch), NO_SPECULATION

    def close(self) -> None:
        pass


class Branch:
    def __init__(self, verifier: Verifier, proposer: Proposer, predictor: Predictor, pool: Executor,
                 eos: Sequence[int]):
        self._verifier = verifier
        self._proposer = proposer
        self._pool = pool
        self._eos = set(eos)
        self._scheduler = BranchScheduler(pool, proposer.drafter, predictor, proposer.template, proposer.failed)

    @property
    def epoch(self) -> int:
        return self._scheduler.epoch

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        """The first draft (and the drafter's own prefill) runs while the verifier prefills."""
        prefilling = self._pool.submit(self._verifier.prefill, gen.session_id, gen.request.prompt_ids)
        proposal = self._proposer.propose(gen.context, draft_len, self.epoch)
        prefilling.result()
        return proposal

    def verify(self, gen, proposal, as_drafted, hypotheses, draft_len) -> VerifyResult:
        verifying = self._pool.submit(self._verifier.verify, gen.session_id, len(gen.context), proposal.draft,
                                      gen.request.sampling)

        def hypothesis_draft_len(h: Hypothesis) -> int:  # 0: the generation would end with that outcome
            ends = bool(self._eos.intersection(h.accepted)) or h.correction in self._eos
            return 0 if ends else draft_len(len(gen.output) + len(h.accepted) + 1)

        self._scheduler.speculate(gen.context, proposal, hypotheses, hypothesis_draft_len)
        return verifying.result()

    def next(self, gen, proposal, result, draft_len, verify_start, verify_end) -> tuple[ProposeResult, Resolution]:
        resolution = self._scheduler.resolve(proposal, result, verify_start, verify_end)
        fresh = resolution.proposal or self._proposer.propose(gen.context, draft_len(), self.epoch)
        return fresh, resolution

    def close(self) -> None:
        self._scheduler.close()


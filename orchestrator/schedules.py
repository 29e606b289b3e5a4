"""Schedules: when the drafter drafts relative to the verifier (the technical report's section 5).

- sequential: draft round r, verify it, then draft round r+1 from the verdict;
- branch: while round r verifies, draft round r+1 for its predicted outcomes (orchestrator/branch.py);
  a hit gives the next draft at once, a miss drafts afresh.

Both keep a model drafter's cache of the session warm while the session drafts nothing (Warmer),
and a hybrid's rounds that adaptive control gives no model draft still verify what the free n-gram
drafter finds (Proposer.free: recurring text the store learned, the context's own repeats). A hybrid
under adaptive control looks the free drafter up first in every fresh round, and runs the small model
only where the lookup's draft is expected to land fewer tokens per millisecond than a model draft
(Proposer.suffices: n-gram first).

A schedule owns the session's epoch (bumped on every rollback) and yields proposals; the verdicts
only ever come from the verifier."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence, cast

from orchestrator.branch import NO_SPECULATION, BranchScheduler, Resolution
from orchestrator.generation import Generation
from orchestrator.predictors import Hypothesis, Predictor
from specpipe.core.errors import Aborted
from specpipe.core.protocols import Drafter, Verifier
from specpipe.core.types import EMPTY_DRAFT, ProposeRequest, ProposeResult, VerifyResult
from specpipe.runtime import metrics

log = logging.getLogger("specpipe.orchestrator")

NO_DRAFT = ProposeResult(EMPTY_DRAFT, 0.0)
WARMED_KINDS = ("model", "hybrid")  # drafters with a KV cache per session: a draft first feeds what it lacks
WARM_LAG = 32  # tokens a session that drafts nothing lets its drafter fall behind before a warm-up


@dataclass(frozen=True)
class Proposer:
    """A generation's drafter calls. A failing drafter slows the generation down, never breaks it:
    the round goes on without a draft."""

    drafter: Drafter | None  # None: the verifier alone
    kind: str                # the drafter's kind (DRAFTER_KINDS), for metrics
    template: ProposeRequest  # session, width and sampling of every proposal
    free: Drafter | None = None  # drafts at no forward cost (n-gram) for rounds the drafter sits out
    free_len: int = 0             # ... up to this many tokens
    suffices: Callable[[ProposeResult, int], bool] | None = None  # the free draft beats drafting k: n-gram first
    drafting: Callable[[], bool] = lambda: True  # whether the round may draft at all (the speculation gate)

    def propose(self, context: Sequence[int], draft_len: int, epoch: int) -> ProposeResult:
        if self.drafter is None or draft_len <= 0:
            return NO_DRAFT
        try:
            return self.drafter.propose(
                replace(self.template, context=tuple(context), draft_len=draft_len, epoch=epoch)
            )
        except Exception as err:
            self.failed(err)
            return NO_DRAFT

    def propose_free(self, context: Sequence[int], room: int) -> ProposeResult:
        """The free drafter's draft of up to min(free_len, room) tokens (none without one)."""
        draft_len = min(self.free_len, room)
        if self.free is None or draft_len <= 0 or not self.drafting():
            return NO_DRAFT
        try:
            return self.free.propose(replace(self.template, context=tuple(context), draft_len=draft_len, width=1))
        except Exception as err:
            self.failed(err)
            return NO_DRAFT

    def free_first(self, context: Sequence[int], draft_len: int, room: int) -> ProposeResult | None:
        """N-gram first: the free drafter's draft where it is expected to beat a draft of draft_len by the
        drafter (suffices), else None (the lookup then cost about a millisecond)."""
        if self.suffices is None:
            return None
        free = self.propose_free(context, room)
        return free if len(free.draft) and self.suffices(free, draft_len) else None

    def warm(self, context: Sequence[int], epoch: int) -> None:
        """Have the drafter feed context without drafting (a proposal of draft_len 0)."""
        try:
            if self.drafter is not None:
                self.drafter.propose(replace(self.template, context=tuple(context), draft_len=0, epoch=epoch))
        except Exception as err:  # the next draft feeds the context itself
            if not isinstance(err, Aborted):
                log.warning("drafter warm-up failed", extra={"session_id": self.template.session_id, "error": str(err)})

    def failed(self, err: Exception) -> None:
        if isinstance(err, Aborted):  # a dropped hypothesis, stopped by the drafter on purpose
            return
        metrics.DRAFT_FAILURES.labels(drafter=self.kind).inc()
        log.warning("drafter failed, verifying without that draft",
                    extra={"session_id": self.template.session_id, "error": str(err)})


class Warmer:
    """Keeps a model drafter's cache of a session near its context while the session drafts nothing
    (adaptive control at k = 0, as under load): in the background, a proposal of draft_len 0 feeds
    the prompt, then the new tokens whenever WARM_LAG of them have come since the drafter last saw
    the context. Otherwise the next draft (a probe, or when the load falls) would first feed all of
    them, the whole prompt included, while the session waits, and adaptive control, which times
    drafts with their catch-up, would learn that drafting is dear and draft still less. A drafter
    whose core would otherwise be idle does the feeding, batched with the other sessions' work."""

    def __init__(self, pool: Executor, proposer: Proposer):
        self._pool = pool
        self._proposer = proposer
        self._enabled = proposer.drafter is not None and proposer.kind in WARMED_KINDS
        self._seen = 0  # the context length the drafter was last given
        self._warming: Future | None = None

    def drafted(self, context_len: int) -> None:
        """A draft after context_len tokens was asked for (the drafter fed them)."""
        self._seen = context_len

    def idle(self, context: Sequence[int], epoch: int) -> None:
        """The next round drafts nothing: warm the drafter if it lags (one warm-up at a time)."""
        lagging = not self._seen or len(context) - self._seen >= WARM_LAG
        if not self._enabled or not lagging or (self._warming is not None and not self._warming.done()):
            return
        self._seen = len(context)
        self._warming = self._pool.submit(self._proposer.warm, tuple(context), epoch)

    def next_draft(self, context: Sequence[int], draft_len: int, epoch: int, room: int = 0) -> ProposeResult:
        """The proposal of a round drafted afresh (draft_len 0, or a free draft that suffices: the
        drafter warmed instead, and the free drafter drafts up to room tokens)."""
        if draft_len <= 0:
            self.idle(context, epoch)
            return self._proposer.propose_free(context, room)
        free = self._proposer.free_first(context, draft_len, room)
        if free is not None:
            self.idle(context, epoch)
            return free
        self.drafted(len(context))
        return self._proposer.propose(context, draft_len, epoch)

    def close(self) -> None:
        """Wait for the warm-up in flight (so that a release comes after it)."""
        if self._warming is not None:
            self._warming.result()


def prefill(verifier: Verifier, gen: Generation) -> float:
    """Open the generation's verifier session with its prompt; returns the call's time in ms."""
    start = time.perf_counter()
    with gen.spans.in_generation():  # the generation's, not its first round's
        verifier.prefill(gen.session_id, gen.request.prompt_ids)
    return (time.perf_counter() - start) * 1e3


Round = Callable[[], VerifyResult]  # a round sent to the verifier: its verdict when called


def send_round(verifier: Verifier, gen: Generation, proposal: ProposeResult) -> Round:
    """The round sent now where the verifier can send without waiting (verify_async: the stream of
    rounds), so the caller streams the previous round's tokens while the verifier checks this one;
    otherwise verified when its verdict is asked for (in process there is no write to overlap)."""
    args = (gen.session_id, len(gen.context), proposal.draft, gen.request.sampling)
    start = getattr(verifier, "verify_async", None)
    if start is not None:
        return cast(Round, start(*args))
    return lambda: verifier.verify(*args)


class Schedule(Protocol):
    prefill_ms: float  # the verifier's prefill call, once first() has returned

    @property
    def epoch(self) -> int:
        """The session's rollbacks so far (a drafter aborts proposals of an older epoch)."""

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        """Open the verifier's session (prefill) and draft the first round."""

    def start(self, gen: Generation, proposal: ProposeResult, as_drafted: ProposeResult, hypotheses: int,
              draft_len: Callable[[int], int]) -> Round:
        """Send proposal to the verifier (as_drafted: before the draft policy trimmed it); its verdict when
        the returned call is made. hypotheses: pre-drafts to run meanwhile; draft_len(emitted): the next
        round's draft length after `emitted` tokens."""

    def next(self, gen: Generation, proposal: ProposeResult, result: VerifyResult, draft_len: Callable[[], int],
             verify_start: float, verify_end: float) -> tuple[ProposeResult, Resolution]:
        """The next round's draft, after gen has confirmed result; how it came (a pre-draft or not)."""

    def close(self) -> None: ...


class Sequential:
    def __init__(self, verifier: Verifier, proposer: Proposer, pool: Executor):
        self.epoch = 0
        self.prefill_ms = 0.0
        self._verifier = verifier
        self._warmer = Warmer(pool, proposer)

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        """Prefill, then draft (a warm-up, where the round drafts nothing, overlaps the first rounds)."""
        self.prefill_ms = prefill(self._verifier, gen)
        return self._warmer.next_draft(gen.context, draft_len, self.epoch, gen.room())

    def start(self, gen: Generation, proposal: ProposeResult, as_drafted: ProposeResult, hypotheses: int,
              draft_len: Callable[[int], int]) -> Round:
        sent = send_round(self._verifier, gen, proposal)

        def verdict() -> VerifyResult:
            result = sent()
            self.epoch += len(result.accepted_tokens) < len(as_drafted.draft)  # the drafter rolls back
            return result

        return verdict

    def next(self, gen: Generation, proposal: ProposeResult, result: VerifyResult, draft_len: Callable[[], int],
             verify_start: float, verify_end: float) -> tuple[ProposeResult, Resolution]:
        return self._warmer.next_draft(gen.context, draft_len(), self.epoch, gen.room()), NO_SPECULATION

    def close(self) -> None:
        self._warmer.close()


class Branch:
    def __init__(self, verifier: Verifier, proposer: Proposer, predictor: Predictor, pool: Executor,
                 eos: Sequence[int]):
        self._verifier = verifier
        self._pool = pool
        self._eos = set(eos)
        self.prefill_ms = 0.0
        assert proposer.drafter is not None  # the branch schedule runs with a drafter (Generator._branch)
        self._scheduler = BranchScheduler(pool, proposer.drafter, predictor, proposer.template, proposer.failed)
        self._warmer = Warmer(pool, proposer)

    @property
    def epoch(self) -> int:
        return self._scheduler.epoch

    def first(self, gen: Generation, draft_len: int) -> ProposeResult:
        """The first draft (and the drafter's own prefill) runs while the verifier prefills. A round that
        drafts nothing prefills first: its drafter's warm-up can wait for the first rounds, and on
        shared cores it would slow the prefill, so the first token."""
        if draft_len <= 0:
            self.prefill_ms = prefill(self._verifier, gen)
            return self._warmer.next_draft(gen.context, draft_len, self.epoch, gen.room())
        prefilling = self._pool.submit(prefill, self._verifier, gen)
        proposal = self._warmer.next_draft(gen.context, draft_len, self.epoch, gen.room())
        self.prefill_ms = prefilling.result()
        return proposal

    def start(self, gen: Generation, proposal: ProposeResult, as_drafted: ProposeResult, hypotheses: int,
              draft_len: Callable[[int], int]) -> Round:
        """Send the round (over the stream: at once; otherwise verified on a pool thread) while this thread
        starts the pre-drafts; without pre-drafts (a free drafter's round) as the sequential schedule does."""

        def hypothesis_draft_len(h: Hypothesis) -> int:  # 0: the generation would end with that outcome
            ends = bool(self._eos.intersection(h.accepted)) or h.correction in self._eos
            return 0 if ends else draft_len(len(gen.output) + len(h.accepted) + 1)

        if not hypotheses:
            return send_round(self._verifier, gen, proposal)
        if getattr(self._verifier, "verify_async", None) is not None:
            sent = send_round(self._verifier, gen, proposal)
        else:
            sent = self._pool.submit(self._verifier.verify, gen.session_id, len(gen.context), proposal.draft,
                                     gen.request.sampling).result
        self._scheduler.speculate(gen.context, proposal, hypotheses, hypothesis_draft_len)
        return sent

    def next(self, gen: Generation, proposal: ProposeResult, result: VerifyResult, draft_len: Callable[[], int],
             verify_start: float, verify_end: float) -> tuple[ProposeResult, Resolution]:
        resolution = self._scheduler.resolve(proposal, result, verify_start, verify_end)
        if resolution.proposal is not None:  # pre-drafted after the context
            self._warmer.drafted(len(gen.context))
            return resolution.proposal, resolution
        return self._warmer.next_draft(gen.context, draft_len(), self.epoch, gen.room()), resolution

    def close(self) -> None:
        self._scheduler.close()
        self._warmer.close()


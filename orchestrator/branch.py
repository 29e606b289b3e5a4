"""The branch schedule (docs/design.md, "Branch-prediction scheduling"; Duan et al. 2024, section 4): as soon
as round r's draft goes to the verifier, draft round r+1 for the most likely outcomes of round r (hypotheses),
one after another in the background; on the verifier's verdict use the pre-draft of the matching hypothesis at
once (hit), or drop them all, bump the session's epoch and draft afresh from the true context (miss).

Pre-drafts never reach the client: they are only drafts, and the verifier checks every one of them.
The drafter aborts a proposal whose epoch is older than the session's newest, and a reply from an
older round is never looked at, so a dropped hypothesis costs drafter time, never correctness.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from orchestrator.predictors import BONUS, Hypothesis, Predictor
from specpipe.core.protocols import Drafter
from specpipe.core.trees import first_path_nodes, subtree
from specpipe.core.types import ROOT, ProposeRequest, ProposeResult, VerifyResult


@dataclass
class PreDraft:
    hypothesis: Hypothesis
    context: tuple[int, ...]
    draft_len: int
    done: threading.Event = field(default_factory=threading.Event)
    started: float | None = None  # perf_counter seconds
    finished: float | None = None
    result: ProposeResult | None = None  # None: not run, or the drafter failed


@dataclass(frozen=True)
class Resolution:
    proposal: ProposeResult | None  # the next round's draft (a hit with its pre-draft), or None: draft afresh
    hit: bool                       # the verdict matched a hypothesis (its pre-draft may not have started)
    issued: int                     # hypotheses pre-drafted for this round
    wasted: int                     # pre-drafted tokens dropped
    hidden_ms: float                # the used pre-draft's draft time that overlapped the verification
    bonus: int | None               # the drafter's own token after the whole chain, if it was drafted


NO_SPECULATION = Resolution(None, False, 0, 0, 0.0, None)


def hypothesis_context(context: Sequence[int], hypothesis: Hypothesis) -> tuple[int, ...]:
    """Where the next round starts if the hypothesis holds (the bonus token is the pre-draft's first)."""
    tail = () if hypothesis.correction == BONUS else (hypothesis.correction,)
    return (*context, *hypothesis.accepted, *tail)


def usable_draft(pre: PreDraft, accepted: Sequence[int], correction: int) -> ProposeResult | None:
    """The pre-draft as the next round's draft if the verdict (accepted tokens, correction) is the
    hypothesis it was drafted for; None otherwise."""
    if pre.result is None or tuple(accepted) != pre.hypothesis.accepted:
        return None
    if pre.hypothesis.correction != BONUS:
        return pre.result if correction == pre.hypothesis.correction else None
    draft = pre.result.draft  # rooted before the bonus token: the next draft is under the node equal to it
    root = next((n for n, (t, p) in enumerate(zip(draft.tokens, draft.parents)) if p == ROOT and t == correction), None)
    if root is None:
        return None
    return sub_result(pre.result, root)


def sub_result(result: ProposeResult, root: int) -> ProposeResult:
    """The proposal of the subtree under node root."""
    return replace(result, draft=subtree(result.draft, root)[0])


def overlap_ms(start: float, end: float, other_start: float, other_end: float) -> float:
    return max(0.0, min(end, other_end) - max(start, other_start)) * 1e3


class BranchScheduler:
    """Per generation: the pre-drafts of the round in flight and the session's epoch."""

    def __init__(self, pool: Executor, drafter: Drafter, predictor: Predictor, request: ProposeRequest,
                 on_error: Callable[[Exception], None]):
        """request: the session's proposals as they all are (session, width, sampling)."""
        self.epoch = 0
        self._pool = pool
        self._drafter = drafter
        self._predictor = predictor
        self._request = request
        self._on_error = on_error
        self._pending: list[PreDraft] = []
        self._lock = threading.Lock()  # guards _resolved against the worker starting a pre-draft
        self._resolved = True
        self._worker: Future | None = None

    def speculate(self, context: Sequence[int], proposal: ProposeResult, m: int,
                  next_draft_len: Callable[[Hypothesis], int]) -> None:
        """Start pre-drafting round r+1 for the m most likely outcomes of verifying proposal after
        context; next_draft_len(h) is the next round's draft length if h holds (0: no next draft)."""
        pending = []
        for hypothesis in self._predictor.hypotheses(proposal, m):
            draft_len = next_draft_len(hypothesis)
            if draft_len > 0:
                extra = hypothesis.correction == BONUS  # the pre-draft drafts the bonus token first
                pending.append(PreDraft(hypothesis, hypothesis_context(context, hypothesis), draft_len + extra))
        with self._lock:
            self._pending, self._resolved = pending, False
        if pending:
            self._worker = self._pool.submit(self._run, pending, self.epoch)

    def _run(self, pending: list[PreDraft], epoch: int) -> None:
        """One pre-draft after another, most likely first, until the round is resolved."""
        for pre in pending:
            with self._lock:
                if self._resolved:
                    return
                pre.started = time.perf_counter()
            try:
                pre.result = self._drafter.propose(
                    replace(self._request, context=pre.context, draft_len=pre.draft_len, epoch=epoch))
            except Exception as err:  # stale (Aborted) or failing: this hypothesis has no draft
                self._on_error(err)
            finally:
                pre.finished = time.perf_counter()
                pre.done.set()

    def resolve(
        self, proposal: ProposeResult, result: VerifyResult, verify_start: float, verify_end: float
    ) -> Resolution:
        """Match the verdict against this round's hypotheses; the predictor learns from it."""
        with self._lock:
            pending, self._pending, self._resolved = self._pending, [], True
        match = next((pre for pre in pending if is_verdict(pre.hypothesis, result)), None)
        if match is not None and match.started is not None:
            match.done.wait()
        chain_len = len(first_path_nodes(proposal.draft))
        bonus = next((first_token(pre) for pre in pending if pre.hypothesis.correction == BONUS
                      and len(pre.hypothesis.accepted) == chain_len and pre.done.is_set()), None)
        self._predictor.observe(proposal, result, bonus)
        used = usable_draft(match, result.accepted_tokens, result.correction_token) if match is not None else None
        dropped = [pre for pre in pending if pre is not match and pre.started is not None]
        if dropped or used is None:
            self.epoch += 1  # a rollback: in-flight proposals of the old epoch are aborted by the drafter
        return Resolution(
            used,
            hit=used is not None or (match is not None and match.hypothesis.correction != BONUS),
            issued=len(pending),
            wasted=sum(len(pre.result.draft) for pre in pending if pre.result is not None and
                       (pre is not match or used is None)),
            hidden_ms=hidden_ms(match if used is not None else None, verify_start, verify_end),
            bonus=bonus,
        )

    def close(self) -> None:
        """Stop pre-drafting and wait for the proposal in flight (so a release comes after it)."""
        with self._lock:
            self._pending, self._resolved = [], True
        self.epoch += 1
        if self._worker is not None:
            self._worker.result()


def is_verdict(hypothesis: Hypothesis, result: VerifyResult) -> bool:
    """Whether the verdict may be this hypothesis (for BONUS: once its pre-draft shows the token)."""
    if tuple(result.accepted_tokens) != hypothesis.accepted:
        return False
    return hypothesis.correction in (BONUS, result.correction_token)


def first_token(pre: PreDraft) -> int | None:
    if pre.result is None:
        return None
    nodes = first_path_nodes(pre.result.draft)
    return pre.result.draft.tokens[nodes[0]] if nodes else None


def hidden_ms(used: PreDraft | None, verify_start: float, verify_end: float) -> float:
    """How much of the used pre-draft's drafting overlapped the verification (0 without one)."""
    if used is None or used.started is None or used.finished is None:
        return 0.0
    return overlap_ms(used.started, used.finished, verify_start, verify_end)

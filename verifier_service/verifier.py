"""In-process verifier: a causal LM with a KV cache per session.

Invariant: a session's cache holds its context minus the last token (the root of the next draft).
A round feeds [root] + draft nodes in ONE forward pass (tree attention), keeps the KV entries of the
accepted path only, and appends accepted tokens + correction to the context.

Llama / Qwen2 models run batched (docs/batching.md): one scheduler thread owns the model and runs
the pending rounds and prefill chunks of all sessions as one forward, a lone session being a batch
of one (the same code); in the graphs mode (CUDA) as captured padded batches. Other architectures
run one session's forward at a time through specpipe.engine.runner.

SessionVerifier holds what every verifier does with sessions (admission, checks, accept / reject,
rollback, the reply); ModelVerifier runs a model. verifier_service/replay.py answers from a recorded
transcript of a model's greedy decoding instead (load tests at another device's speed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedModel

from specpipe.config.limits import DEFAULT_LIMITS, Limits, check_draft, check_prefill, draft_nodes_label
from specpipe.config.presets import ModelSpec
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from specpipe.core.sampling import check_sampling, rejection_sample_chain, warp
from specpipe.core.types import Draft, ModelInfo, RoundRequest, SamplingParams, VerifyResult
from specpipe.core.verification import (
    check_token_ids,
    check_tree,
    row_argmax,
    tree_allowed,
    tree_position_ids,
    verify_greedy,
)
from specpipe.engine import cores, runner
from specpipe.engine.costmodel import ForwardCurve
from specpipe.engine.kv import new_slot
from specpipe.engine.models import load_model, model_info
from specpipe.engine.scheduler import Scheduler, Step, Work, one_step, serving_scheduler
from specpipe.runtime import cpu, metrics, tracing
from specpipe.runtime.lifecycle import Sweeper, current_cancellation, evict_idle, sweep_period
from specpipe.runtime.traced import verdict_attributes
from specpipe.serving.replicas import VerifierLoad

log = logging.getLogger(__name__)


@dataclass
class _Session:
    context: list[int]
    cache: Any  # a SlotKV, a runner cache (one session per forward) or a replay's TokenSlot
    ready: bool = False  # prefilled; a session is registered (and counted) before its prefill runs
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(eq=False)
class PendingRound:
    """A round whose session is taken (its lock held) until its verdict."""

    session: _Session
    draft: Draft
    sampling: SamplingParams
    fed: list[int]              # [root] + the draft's tokens
    work: Work | None = None    # submitted: its scheduler work
    tag: int = 0                # submitted: the caller's tag (RoundRequest)
    span: Any = None            # submitted and traced: the round's span here (specpipe.runtime.tracing)


def _tell(done: Callable[[PendingRound], None], pending: PendingRound) -> Callable[[Work], None]:
    """A work's on_done that tells done of its round."""
    return lambda work: done(pending)


def entropy(logits: torch.Tensor) -> float:
    """Shannon entropy in nats of softmax(logits: [vocab])."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return float(-(log_p.exp() * log_p).sum())


@dataclass(frozen=True)
class Scores:
    """What a round's verdict needs of its rows' logits: each row's argmax, a row's entropy, and for
    sampling the logits themselves (None where the rows come from a transcript)."""

    argmax: list[int]                     # [1 + n] the first maximum of each row
    entropy: Callable[[int], float]       # row -> nats
    logits: torch.Tensor | None = None    # [1 + n, vocab]

    @staticmethod
    def of(logits: torch.Tensor) -> Scores:
        return Scores(row_argmax(logits), lambda row: entropy(logits[row]), logits)


class SessionVerifier:
    """A verifier's sessions: admission, the checks of every request, accept / reject and rollback;
    a subclass runs the forwards (_new_cache, _forward, _scores, _keep_path)."""

    def __init__(self, info: ModelInfo, scheduler: Scheduler | None, max_sessions: int = 64,
                 session_ttl_s: float = 600.0, limits: Limits = DEFAULT_LIMITS):
        step_tokens = scheduler.step_tokens if scheduler is not None else None
        self._info = info if step_tokens is None else replace(info, max_step_tokens=step_tokens)
        self._scheduler = scheduler  # None: one session per forward (ModelVerifier's unbatched path)
        self._max_sessions = max_sessions
        self._limits = limits
        self._session_ttl_s = session_ttl_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sessions_lock = threading.Lock()
        self._forward_lock = threading.Lock()  # unbatched: one forward at a time per model
        self._sweeper = Sweeper(self.evict_idle, sweep_period(session_ttl_s), "verifier-session-sweeper")
        metrics.zero(metrics.ADMISSION_REJECTIONS, {"role": "verifier", "reason": "sessions"})

    @property
    def batched(self) -> bool:
        return self._scheduler is not None

    def info(self) -> ModelInfo:
        return self._info

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        check_prefill(session_id, prompt_ids, self._limits)
        check_token_ids(prompt_ids, self._info.vocab_size, "prompt")
        if len(prompt_ids) >= self._info.max_context:
            raise InvalidArgument(
                f"prompt has {len(prompt_ids)} tokens; the context window is {self._info.max_context} tokens"
            )
        session = _Session(list(prompt_ids), self._new_cache(prompt_ids))
        with session.lock:
            self._admit(session_id, session)  # before any forward: a full verifier refuses at once
            try:
                start = time.perf_counter()
                self._forward(session.cache, list(prompt_ids[:-1]), prompt=True)
                metrics.PREFILL_MS.observe((time.perf_counter() - start) * 1e3)
            except BaseException:
                with self._sessions_lock:
                    if self._sessions.get(session_id) is session:
                        del self._sessions[session_id]
                raise
            session.ready, session.last_used = True, time.monotonic()
        return len(session.context)

    def _admit(self, session_id: str, session: _Session) -> None:
        with self._sessions_lock:
            evict_idle(self._sessions, self._session_ttl_s)
            if session_id in self._sessions:
                raise FailedPrecondition(f"session {session_id!r} is already open; release it or use a new id")
            if len(self._sessions) >= self._max_sessions:
                metrics.ADMISSION_REJECTIONS.labels(role="verifier", reason="sessions").inc()
                raise ResourceExhausted(f"verifier has {len(self._sessions)} open sessions (max {self._max_sessions}); "
                                        "release finished sessions, retry later or add verifier replicas")
            self._sessions[session_id] = session

    def _new_cache(self, prompt_ids: Sequence[int]) -> Any:
        """A new session's cache (empty)."""
        raise NotImplementedError

    def _step(self, cache: Any, token_ids: list[int], tree_parents: Sequence[int] | None = None,
              prompt: bool = False) -> Step:
        """A prompt (chunked, no logits) or a round's [root] + draft nodes (tree_parents: a tree's, None: a chain)."""
        if prompt:
            return Step(tuple(token_ids), chunked=True)
        if tree_parents is None:  # a chain: consecutive positions, causal
            return Step(tuple(token_ids), logit_rows=len(token_ids))
        return Step(tuple(token_ids), positions=tree_position_ids(tree_parents, cache.length)[0],
                    allowed=tree_allowed(tree_parents, 0), logit_rows=len(token_ids))  # [n, n]: root + ancestors

    def _forward(self, cache: Any, token_ids: list[int], tree_parents: Sequence[int] | None = None,
                 prompt: bool = False) -> tuple[torch.Tensor | Scores | None, float, tuple[int, int]]:
        """Feed token_ids after the cached positions (see _step). Returns the rows of a round (logits
        [n, vocab], or Scores), the forward time in ms, and the (sessions, tokens) of the (last)
        forward it took part in."""
        if not token_ids:
            return None, 0.0, (1, 0)
        # a prefill whose caller left stops between chunks (docs/security.md, "Session lifecycle")
        cancellation = current_cancellation() if prompt else None
        step = self._step(cache, token_ids, tree_parents, prompt)
        assert self._scheduler is not None  # ModelVerifier's unbatched path forwards on its own
        work = self._scheduler.run(Work(cache, one_step(step), cancellation))
        return work.result, work.forward_ms, (work.batch_sessions, work.batch_tokens)

    def _scores(self, rows: torch.Tensor | Scores, sampling: SamplingParams) -> Scores:
        assert isinstance(rows, torch.Tensor)  # a model's logits
        return Scores.of(rows)

    def _keep_path(self, cache: Any, prefix_len: int, nodes: Sequence[int]) -> None:
        runner.keep_tree_path(cache, prefix_len, nodes)

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        with cpu.hop("verifier", "verify"):
            pending = self._begin(session_id, context_len, draft, sampling, wait=True)
            try:
                tree = draft.parents if not draft.is_chain else None
                rows, ms, batch = self._forward(pending.session.cache, pending.fed, tree)
            except BaseException:
                pending.session.lock.release()
                raise
            return self._finish(pending, rows, ms, batch)

    def submit(self, rounds: Sequence[RoundRequest], done: Callable[[PendingRound], None],
               ) -> list[PendingRound | Exception]:
        """Verify rounds of several sessions without waiting (a stream of rounds, specpipe.serving.verify_stream):
        they join the scheduler's queue together; done(pending) is called on the scheduler thread when a
        round's forward is over, and finish(pending) then gives its result. A round whose session has one
        in flight is refused (FAILED_PRECONDITION), as is any that fails its checks; per round, the pending
        round or why it was refused. Batched verifiers only (batched)."""
        assert self._scheduler is not None, "rounds are submitted to a batched verifier only"
        out: list[PendingRound | Exception] = []
        pendings: list[tuple[int, PendingRound, Work]] = []
        for request in rounds:
            try:
                pending = self._begin(request.session_id, request.context_len, request.draft, request.sampling,
                                      wait=False)
            except Exception as err:
                out.append(err)
                continue
            pending.tag = request.tag
            if tracing.ACTIVE and request.traceparent:  # the round's own span, a child of the orchestrator's
                pending.span = tracing.start("verify", tracing.remote(request.traceparent),
                                             {"specpipe.drafted": len(request.draft)}, kind="server")
            tree = request.draft.parents if not request.draft.is_chain else None
            work = Work(pending.session.cache, one_step(self._step(pending.session.cache, pending.fed, tree)),
                        on_done=_tell(done, pending), trace=pending.span)
            pending.work = work
            pendings.append((len(out), pending, work))
            out.append(pending)
        for (i, pending, _), refused in zip(pendings, self._scheduler.submit([w for _, _, w in pendings])):
            if refused is not None:
                pending.session.lock.release()
                if pending.span is not None:
                    pending.span.end()
                out[i] = refused
        return out

    def finish(self, pending: PendingRound) -> VerifyResult:
        """The result of a submitted round whose forward is over (raises what it failed with); a traced
        round's verdict is a span of its own, and the round's span ends with it."""
        if pending.span is None:
            return self._finished(pending)
        with tracing.scope(pending.span):
            try:
                with tracing.span("verdict"):
                    result = self._finished(pending)
                pending.span.set_attributes(verdict_attributes(result))
                return result
            finally:
                pending.span.end()

    def _finished(self, pending: PendingRound) -> VerifyResult:
        work = pending.work
        assert work is not None  # submitted
        if work.error is not None:
            pending.session.lock.release()
            raise work.error
        return self._finish(pending, work.result, work.forward_ms, (work.batch_sessions, work.batch_tokens))

    def _begin(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams,
               wait: bool) -> PendingRound:
        """Check a round and take its session (wait: for a round of it in flight; else refuse)."""
        check_sampling(sampling)
        check_draft(draft, self._limits)
        check_tree(draft.tokens, draft.parents, self._info.vocab_size)
        if draft.q is not None and len(draft.q) != len(draft):
            raise InvalidArgument(f"draft has {len(draft)} nodes but {len(draft.q)} q distributions")
        if not sampling.greedy and not draft.is_chain:
            raise InvalidArgument("sampling verifies chains only; send a chain draft (width 1) when temperature > 0")
        session = self._session(session_id)
        if not session.lock.acquire(blocking=wait):
            raise FailedPrecondition(f"session {session_id!r} has a round in flight; send its next round after "
                                     "the reply")
        try:
            if not session.ready:
                raise FailedPrecondition(f"session {session_id!r} failed its prefill; prefill it again")
            context = session.context
            if context_len != len(context):
                raise FailedPrecondition(
                    f"session {session_id!r} has {len(context)} tokens, the request assumes {context_len}"
                )
            if len(context) + len(draft) + 1 > self._info.max_context:
                raise InvalidArgument(
                    f"context {len(context)} + draft {len(draft)} + 1 exceeds the context window "
                    f"{self._info.max_context}"
                )
        except BaseException:
            session.lock.release()
            raise
        return PendingRound(session, draft, sampling, [context[-1], *draft.tokens])

    def _finish(self, pending: PendingRound, rows: torch.Tensor | Scores | None, verify_ms: float,
                batch: tuple[int, int]) -> VerifyResult:
        """The verdict of a round whose forward is over: accept / reject, roll back, the reply; frees the session."""
        try:
            return self._verdict(pending.session, pending.draft, pending.sampling, rows, verify_ms, batch)
        finally:
            pending.session.lock.release()

    def _verdict(self, session: _Session, draft: Draft, sampling: SamplingParams, rows: torch.Tensor | Scores | None,
                 verify_ms: float, batch: tuple[int, int]) -> VerifyResult:
        past_len = len(session.context) - 1
        metrics.VERIFY_MS.labels(draft_nodes=draft_nodes_label(len(draft))).observe(
            verify_ms, tracing.exemplar(tracing.current()) if tracing.ACTIVE else None)
        assert rows is not None  # a round has rows: [root] + its draft nodes
        scores = self._scores(rows, sampling)
        if sampling.greedy:
            accepted_nodes, correction = verify_greedy(draft.tokens, draft.parents, scores.argmax)
        else:
            assert scores.logits is not None  # sampling verifies a model's logits
            probs = warp(scores.logits, sampling)
            delta, correction = rejection_sample_chain(
                draft.tokens, draft.q, probs, sampling.seed, len(session.context)
            )
            accepted_nodes = list(range(delta))
        if correction < 0:  # no answer at that position (a replay past its transcript's end)
            self._keep_path(session.cache, past_len + 1, [])
            raise FailedPrecondition(f"the verifier has no token for position {past_len + 2 + len(accepted_nodes)} "
                                     "of this session: its replay transcript ends before it")

        # Roll back the rejected nodes: keep context, root and the accepted path.
        self._keep_path(session.cache, past_len + 1, accepted_nodes)
        accepted = tuple(draft.tokens[i] for i in accepted_nodes)
        session.context.extend([*accepted, correction])
        session.last_used = time.monotonic()
        row = accepted_nodes[-1] + 1 if accepted_nodes else 0
        return VerifyResult(
            accepted_tokens=accepted,
            accepted_nodes=tuple(accepted_nodes),
            correction_token=correction,
            entropy=scores.entropy(row),
            node_argmax=tuple(scores.argmax),
            verify_ms=verify_ms,
            context_len=len(session.context),
            batch_sessions=batch[0],
            batch_tokens=batch[1],
        )

    def release(self, session_id: str) -> bool:
        with self._sessions_lock:
            return self._sessions.pop(session_id, None) is not None

    def _session(self, session_id: str) -> _Session:
        with self._sessions_lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise FailedPrecondition(f"unknown session {session_id!r}: prefill it first (or it expired)")
        return session

    def evict_idle(self) -> int:
        """Drop sessions idle for longer than the TTL (clients that went away without releasing, a
        prefill whose caller gave up); the sweeper calls this in the background. Returns how many."""
        with self._sessions_lock:
            return evict_idle(self._sessions, self._session_ttl_s)

    def serving_load(self) -> VerifierLoad:
        """Open sessions and queued work (the batch queue's depth; unbatched: 1 while a forward runs),
        for least-loaded routing of new sessions (specpipe.serving.replicas)."""
        with self._sessions_lock:
            open_sessions = len(self._sessions)
        queued = self._scheduler.depth if self._scheduler is not None else int(self._forward_lock.locked())
        return VerifierLoad(open_sessions, self._max_sessions, queued)


class ModelVerifier(SessionVerifier):
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 64, session_ttl_s: float = 600.0,
                 mode: str = "eager", buckets: Sequence[int] = runner.BUCKETS, batch: BatchConfig | None = None,
                 batching: bool = True, limits: Limits = DEFAULT_LIMITS, weights: str = "fp32",
                 cost_model: ForwardCurve | None = None):
        """batching: False runs one session per forward even where batching is supported (to compare);
        weights: the packed linear layers' (fp32, or bf16 or int8 in packed mode: the verifier as configured,
        which is what speculation is lossless against); cost_model: every forward held to its curve's
        time (a load test's simulated device; batched forwards only)."""
        self._model = model
        self._runner = runner.Runner(
            model, mode, buckets=buckets, weights=weights
        )  # packed: packs the linears the batch uses
        info = runner.served_info(info, self._runner)
        # graphs: captured now, before the first request
        scheduler = serving_scheduler(self._runner, batching, batch or BatchConfig(), "verifier", info.max_context,
                                      cost_model)
        super().__init__(info, scheduler, max_sessions, session_ttl_s, limits)

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", dtype: str = "float32", **kwargs: Any) -> ModelVerifier:
        model = load_model(spec, device, dtype, runner.packed_on_load(kwargs.get("mode", "eager"),
                                                                       kwargs.get("weights", "fp32")))
        return cls(model, model_info(spec, model), **kwargs)

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    def _new_cache(self, prompt_ids: Sequence[int]) -> Any:
        return new_slot(self._model, self._info.max_context) if self.batched else self._runner.new_cache()

    def _forward(self, cache: Any, token_ids: list[int], tree_parents: Sequence[int] | None = None,
                 prompt: bool = False) -> tuple[torch.Tensor | Scores | None, float, tuple[int, int]]:
        if self._scheduler is not None or not token_ids:
            return super()._forward(cache, token_ids, tree_parents, prompt)
        start = time.perf_counter()
        with self._forward_lock, cores.forward("verifier"):
            logits = self._runner.forward(cache, token_ids, tree_parents)
        forward_ms = (time.perf_counter() - start) * 1e3
        metrics.FORWARD_SECONDS.labels(role="verifier").inc(forward_ms / 1e3)
        return logits, forward_ms, (1, len(token_ids))

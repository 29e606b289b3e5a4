"""In-process verifier: a causal LM with a KV cache per session.

Invariant: a session's cache holds its context minus the last token (the root of the next draft).
A round feeds [root] + draft nodes in ONE forward pass (tree attention), keeps the KV entries of the
accepted path only, and appends accepted tokens + correction to the context.

Llama / Qwen2 models in eager or packed mode run batched (docs/batching.md): one scheduler thread
owns the model and runs the pending rounds and prefill chunks of all sessions as one forward, a lone
session being a batch of one (the same code). Other architectures, and the graphs mode, run one
session's forward at a time through specpipe.engine.runner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specpipe.config.limits import DEFAULT_LIMITS, Limits, check_draft, check_prefill, draft_nodes_label
from specpipe.config.presets import ModelSpec
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from specpipe.core.sampling import check_sampling, rejection_sample_chain, warp
from specpipe.core.types import Draft, ModelInfo, SamplingParams, VerifyResult
from specpipe.core.verification import (
    check_token_ids,
    check_tree,
    row_argmax,
    tree_allowed,
    tree_position_ids,
    verify_greedy,
)
from specpipe.engine import cores, runner
from specpipe.engine.kv import SlotKV, new_slot
from specpipe.engine.models import load_model, model_info
from specpipe.engine.scheduler import Step, Work, one_step, serving_scheduler
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import Sweeper, current_cancellation, evict_idle, sweep_period
from specpipe.serving.replicas import VerifierLoad

log = logging.getLogger(__name__)


@dataclass
class _Session:
    context: list[int]
    cache: runner.Cache | SlotKV
    ready: bool = False  # prefilled; a session is registered (and counted) before its prefill runs
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


def entropy(logits: torch.Tensor) -> float:
    """Shannon entropy in nats of softmax(logits: [vocab])."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return float(-(log_p.exp() * log_p).sum())


class ModelVerifier:
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 64, session_ttl_s: float = 600.0,
                 mode: str = "eager", buckets: Sequence[int] = runner.BUCKETS, batch: BatchConfig | None = None,
                 batching: bool = True, limits: Limits = DEFAULT_LIMITS, weights: str = "fp32"):
        """batching: False runs one session per forward even where batching is supported (to compare);
        weights: the packed linear layers' (fp32, or bf16 in packed mode: the verifier as configured,
        which is what speculation is lossless against)."""
        self._model = model
        self._runner = runner.Runner(model, mode, buckets=buckets, weights=weights)  # packed: packs the linears the batch uses
        self._info = runner.served_info(info, self._runner)
        self._max_sessions = max_sessions
        self._limits = limits
        self._session_ttl_s = session_ttl_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sessions_lock = threading.Lock()
        # graphs: captured now, before the first request
        self._scheduler = serving_scheduler(self._runner, batching, batch or BatchConfig(), "verifier",
                                            self._info.max_context)
        self._forward_lock = threading.Lock()  # unbatched: one forward at a time per model
        self._sweeper = Sweeper(self.evict_idle, sweep_period(session_ttl_s), "verifier-session-sweeper")

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", dtype: str = "float32", **kwargs) -> ModelVerifier:
        model = load_model(spec, device, dtype)
        return cls(model, model_info(spec, model), **kwargs)

    @property
    def model(self) -> PreTrainedModel:
        return self._model

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
        cache = new_slot(self._model, self._info.max_context) if self.batched else self._runner.new_cache()
        session = _Session(list(prompt_ids), cache)
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
                raise ResourceExhausted(f"verifier has {len(self._sessions)} open sessions (max {self._max_sessions}); "
                                        "release finished sessions, retry later or add verifier replicas")
            self._sessions[session_id] = session

    def _forward(self, cache, token_ids: list[int], tree_parents: Sequence[int] | None = None, prompt: bool = False,
                 ) -> tuple[torch.Tensor | None, float, tuple[int, int]]:
        """Feed token_ids after the cached positions: a prompt (batched: in chunks, no logits) or a
        round's [root] + draft nodes (tree_parents: a tree's, None: a chain). Returns the logits
        [n, vocab] of a round, the forward time in ms, and the (sessions, tokens) of the (last)
        forward it took part in."""
        if not token_ids:
            return None, 0.0, (1, 0)
        if self._scheduler is None:
            start = time.perf_counter()
            with self._forward_lock, cores.forward("verifier"):
                logits = self._runner.forward(cache, token_ids, tree_parents)
            return logits, (time.perf_counter() - start) * 1e3, (1, len(token_ids))
        cancellation = None
        if prompt:  # a prefill whose caller left stops between chunks (docs/security.md, "Session lifecycle")
            step, cancellation = Step(tuple(token_ids), chunked=True), current_cancellation()
        elif tree_parents is None:  # a chain: consecutive positions, causal
            step = Step(tuple(token_ids), logit_rows=len(token_ids))
        else:
            step = Step(tuple(token_ids), positions=tree_position_ids(tree_parents, cache.length)[0],
                        allowed=tree_allowed(tree_parents, 0), logit_rows=len(token_ids))  # [n, n]: root + ancestors
        work = self._scheduler.run(Work(cache, one_step(step), cancellation))
        return work.result, work.forward_ms, (work.batch_sessions, work.batch_tokens)

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        check_sampling(sampling)
        check_draft(draft, self._limits)
        check_tree(draft.tokens, draft.parents, self._info.vocab_size)
        if draft.q is not None and len(draft.q) != len(draft):
            raise InvalidArgument(f"draft has {len(draft)} nodes but {len(draft.q)} q distributions")
        if not sampling.greedy and not draft.is_chain:
            raise InvalidArgument("sampling verifies chains only; send a chain draft (width 1) when temperature > 0")
        session = self._session(session_id)
        with session.lock:
            if not session.ready:
                raise FailedPrecondition(f"session {session_id!r} failed its prefill; prefill it again")
            context = session.context
            if context_len != len(context):
                raise FailedPrecondition(
                    f"session {session_id!r} has {len(context)} tokens, the request assumes {context_len}"
                )
            if len(context) + len(draft) + 1 > self._info.max_context:
                raise InvalidArgument(
                    f"context {len(context)} + draft {len(draft)} + 1 exceeds the context window {self._info.max_context}"
                )
            return self._verify_locked(session, draft, sampling)

    def _verify_locked(self, session: _Session, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        past_len = len(session.context) - 1
        tree = not draft.is_chain
        logits, verify_ms, (batch_sessions, batch_tokens) = self._forward(  # [1 + n, vocab]
            session.cache, [session.context[-1], *draft.tokens], draft.parents if tree else None)
        metrics.VERIFY_MS.labels(draft_nodes=draft_nodes_label(len(draft))).observe(verify_ms)

        node_argmax = row_argmax(logits)
        if sampling.greedy:
            accepted_nodes, correction = verify_greedy(draft.tokens, draft.parents, node_argmax)
        else:
            probs = warp(logits, sampling)
            delta, correction = rejection_sample_chain(draft.tokens, draft.q, probs, sampling.seed, len(session.context))
            accepted_nodes = list(range(delta))

        # Roll back the rejected nodes: keep context, root and the accepted path.
        runner.keep_tree_path(session.cache, past_len + 1, accepted_nodes)
        accepted = tuple(draft.tokens[i] for i in accepted_nodes)
        session.context.extend([*accepted, correction])
        session.last_used = time.monotonic()
        row = accepted_nodes[-1] + 1 if accepted_nodes else 0
        return VerifyResult(
            accepted_tokens=accepted,
            accepted_nodes=tuple(accepted_nodes),
            correction_token=correction,
            entropy=entropy(logits[row]),
            node_argmax=tuple(node_argmax),
            verify_ms=verify_ms,
            context_len=len(session.context),
            batch_sessions=batch_sessions,
            batch_tokens=batch_tokens,
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

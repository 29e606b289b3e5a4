"""In-process verifier: a causal LM with a KV cache per session.

Invariant: a session's cache holds its context minus the last token (the root of the next draft).
A round feeds [root] + draft nodes in ONE forward pass (tree attention), keeps the KV entries of the
accepted path only, and appends accepted tokens + correction to the context.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import PreTrainedModel

from specpipe import metrics, runner
from specpipe.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from specpipe.models import load_model, model_info
from specpipe.presets import ModelSpec
from specpipe.replicas import VerifierLoad
from specpipe.sampling import check_sampling, rejection_sample_chain, warp
from specpipe.types import Draft, ModelInfo, SamplingParams, VerifyResult
from specpipe.verification import (
    check_token_ids,
    check_tree,
    verify_greedy,
)


@dataclass
class _Session:
    context: list[int]
    cache: runner.Cache
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


def entropy(logits: torch.Tensor) -> float:
    """Shannon entropy in nats of softmax(logits: [vocab])."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return float(-(log_p.exp() * log_p).sum())


class ModelVerifier:
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 64, session_ttl_s: float = 600.0,
                 mode: str = "eager", buckets: Sequence[int] = runner.BUCKETS):
        self._model = model
        self._runner = runner.Runner(model, mode, buckets=buckets)
        self._runner.warm_up()  # graphs: every forward bucket now, before the first request
        self._info = runner.served_info(info, self._runner)
        self._max_sessions = max_sessions
        self._session_ttl_s = session_ttl_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sessions_lock = threading.Lock()
        self._forward_lock = threading.Lock()  # one forward at a time per model

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", **kwargs) -> ModelVerifier:
        model = load_model(spec, device)
        return cls(model, model_info(spec, model), **kwargs)

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    def info(self) -> ModelInfo:
        return self._info

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        check_token_ids(prompt_ids, self._info.vocab_size, "prompt")
        if len(prompt_ids) >= self._info.max_context:
            raise InvalidArgument(
                f"prompt has {len(prompt_ids)} tokens; the context window is {self._info.max_context} tokens"
            )
        session = _Session(list(prompt_ids), self._runner.new_cache())
        start = time.perf_counter()
        if len(prompt_ids) > 1:
            with self._forward_lock:
                self._runner.forward(session.cache, prompt_ids[:-1])
        metrics.PREFILL_MS.observe((time.perf_counter() - start) * 1e3)
        with self._sessions_lock:
            self._evict_idle()
            if session_id in self._sessions:
                raise FailedPrecondition(f"session {session_id!r} is already open; release it or use a new id")
            if len(self._sessions) >= self._max_sessions:
                raise ResourceExhausted(f"verifier has {len(self._sessions)} open sessions (max {self._max_sessions})")
            self._sessions[session_id] = session
        return len(session.context)

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        check_sampling(sampling)
        check_tree(draft.tokens, draft.parents, self._info.vocab_size)
        if draft.q is not None and len(draft.q) != len(draft):
            raise InvalidArgument(f"draft has {len(draft)} nodes but {len(draft.q)} q distributions")
        if not sampling.greedy and not draft.is_chain:
            raise InvalidArgument("sampling verifies chains only; send a chain draft (width 1) when temperature > 0")
        session = self._session(session_id)
        with session.lock:
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
        start = time.perf_counter()
        with self._forward_lock:
            logits = self._runner.forward(  # [1 + n, vocab]
                session.cache, [session.context[-1], *draft.tokens], draft.parents if tree else None)
        verify_ms = (time.perf_counter() - start) * 1e3
        metrics.VERIFY_MS.labels(draft_nodes=str(len(draft))).observe(verify_ms)

        node_argmax = logits.argmax(dim=-1).tolist()
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

    def _evict_idle(self) -> None:
        """Drop sessions idle for longer than the TTL (clients that went away without releasing)."""
        now = time.monotonic()
        for sid in [s for s, sess in self._sessions.items() if now - sess.last_used > self._session_ttl_s]:
            del self._sessions[sid]

    def serving_load(self) -> VerifierLoad:
        """Open sessions and queued work, for least-loaded routing of new sessions (specpipe.replicas).
        queued is 1 while a forward runs (one at a time here); a batching queue reports its depth."""
        with self._sessions_lock:
            open_sessions = len(self._sessions)
        return VerifierLoad(open_sessions, self._max_sessions, int(self._forward_lock.locked()))

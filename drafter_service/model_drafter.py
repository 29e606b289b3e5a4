"""Small-model drafter with its own KV cache per session.

Each proposal first syncs the session's cache to the given context by longest common prefix (crop,
then re-feed the rest); that one step is also the rollback after a rejected draft, so the drafter
keeps no other state and any replica can serve any session (it only costs a re-feed).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from transformers import DynamicCache, PreTrainedModel

from specpipe import metrics, runner
from specpipe.errors import InvalidArgument
from specpipe.models import load_model, model_info
from specpipe.presets import ModelSpec
from specpipe.sampling import STREAM_DRAFT, check_sampling, sample_sparse, truncate, uniform, warp
from specpipe.types import ROOT, Draft, ModelInfo, ProposeResult, SamplingParams, SparseDist
from specpipe.verification import check_token_ids

BRANCH_LEVELS = 2  # tree drafts add the top-(width - 1) alternatives at this many first levels


@dataclass
class _Session:
    cache: DynamicCache
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV the cache holds
    lock: threading.Lock = field(default_factory=threading.Lock)


class ModelDrafter:
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 256, max_q_entries: int = 32):
        self._model = model
        self._info = info
        self._max_sessions = max_sessions
        self._max_q_entries = max_q_entries
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # LRU: the cache is soft state
        self._sessions_lock = threading.Lock()
        self._forward_lock = threading.Lock()

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", **kwargs) -> ModelDrafter:
        model = load_model(spec, device)
        return cls(model, model_info(spec, model), **kwargs)

    def info(self) -> ModelInfo:
        return self._info

    def propose(
        self, session_id: str, context: Sequence[int], draft_len: int, width: int, sampling: SamplingParams
    ) -> ProposeResult:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        check_token_ids(context, self._info.vocab_size, "context")
        check_sampling(sampling)
        if draft_len < 0 or width < 1:
            raise InvalidArgument(f"draft_len must be >= 0 and width >= 1, got {draft_len} and {width}")
        draft_len = min(draft_len, self._info.max_context - len(context) - 1)
        if draft_len <= 0:
            return ProposeResult(Draft(), 0.0)
        session = self._session(session_id)
        start = time.perf_counter()
        with session.lock:
            draft = self._draft(session, list(context), draft_len, width if sampling.greedy else 1, sampling)
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.DRAFT_MS.labels(drafter="model").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def _draft(self, session: _Session, context: list[int], draft_len: int, width: int, sampling: SamplingParams) -> Draft:
        keep = min(runner.common_prefix(session.tokens, context), len(context) - 1)
        runner.crop(session.cache, keep)
        with self._forward_lock:
            logits = runner.forward(self._model, session.cache, context[keep:])[-1]  # [vocab]
        session.tokens = list(context)

        tokens: list[int] = []
        parents: list[int] = []
        q: list[SparseDist] = []
        parent = ROOT
        for depth in range(draft_len):
            if sampling.greedy:
                top = logits.topk(min(width if depth < BRANCH_LEVELS else 1, logits.shape[-1])).indices.tolist()
                token, alternatives = top[0], top[1:]
            else:
                dist = truncate(warp(logits, sampling), self._max_q_entries)
                token, alternatives = sample_sparse(dist, uniform(sampling.seed, len(context) + depth, STREAM_DRAFT)), []
                q.append(dist)
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            for alternative in alternatives:  # siblings of the chain node: leaves of the tree
                tokens.append(alternative)
                parents.append(parents[parent])
            if depth + 1 < draft_len:
                with self._forward_lock:
                    logits = runner.forward(self._model, session.cache, [token])[-1]
                session.tokens.append(token)
        return Draft(tuple(tokens), tuple(parents), tuple(q) if q else None)

    def release(self, session_id: str) -> bool:
        with self._sessions_lock:
            return self._sessions.pop(session_id, None) is not None

    def _session(self, session_id: str) -> _Session:
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None) or _Session(runner.new_cache(self._model))
            self._sessions[session_id] = session  # most recently used last
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
            return session

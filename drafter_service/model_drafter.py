"""Small-model drafter with its own KV caches per session.

Each proposal first syncs a cache to the given context by longest common prefix (crop, then re-feed
the rest); that one step is also the rollback after a rejected draft, so the drafter keeps no other
state and any replica can serve any session (it only costs a re-feed).

A session holds a few branches (cache + tokens), so that the branch schedule's proposals for several
predicted outcomes of one round never disturb each other: a proposal that would crop tokens another
proposal of the same epoch may still extend forks the branch instead (copy-on-write, runner.fork).
Branches of older epochs hold dropped hypotheses: they are cropped in place or evicted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from transformers import PreTrainedModel

from specpipe import metrics, runner
from specpipe.errors import Aborted, InvalidArgument
from specpipe.models import load_model, model_info
from specpipe.presets import ModelSpec
from specpipe.sampling import STREAM_DRAFT, check_sampling, sample_sparse, truncate, uniform, warp
from specpipe.trees import common_prefix
from specpipe.types import ROOT, Draft, ModelInfo, ProposeRequest, ProposeResult, SamplingParams, SparseDist
from specpipe.verification import check_token_ids

BRANCH_LEVELS = 2  # tree drafts add the top-(width - 1) alternatives at this many first levels


@dataclass
class _Branch:
    cache: runner.Cache
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV the cache holds
    epoch: int = 0                                   # of the last proposal that used it
    busy: bool = False


@dataclass
class _Nodes:
    """A draft being built, one column per Draft field."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[SparseDist] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    runner_up: list[int] = field(default_factory=list)
    runner_up_confidence: list[float] = field(default_factory=list)

    def add(self, token: int, parent: int, probs, runner_up: int, q: SparseDist | None = None) -> int:
        """Append a node (probs: the drafter's distribution there); returns its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.q.append(q)
        self.confidence.append(float(probs[token]))
        self.runner_up.append(runner_up)
        self.runner_up_confidence.append(float(probs[runner_up]) if runner_up >= 0 else 0.0)
        return len(self.tokens) - 1

    def draft(self, sampled: bool) -> Draft:
        return Draft(tuple(self.tokens), tuple(self.parents), tuple(self.q) if sampled else None,
                     confidence=tuple(self.confidence), runner_up=tuple(self.runner_up),
                     runner_up_confidence=tuple(self.runner_up_confidence))


@dataclass
class _Session:
    branches: list[_Branch]  # least recently used first
    epoch: int = 0           # the newest seen


class ModelDrafter:
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 256, max_q_entries: int = 32,
                 max_branches: int = 4, mode: str = "eager", weights: str = "fp32",
                 buckets: Sequence[int] = runner.BUCKETS):
        self._runner = runner.Runner(model, mode, buckets=buckets, weights=weights)
        self._runner.warm_up()  # graphs: every forward bucket now, before the first request
        self._info = runner.served_info(info, self._runner)
        self._max_sessions = max_sessions
        self._max_q_entries = max_q_entries
        self._max_branches = max_branches  # per session
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # LRU: the cache is soft state
        self._sessions_lock = threading.Lock()
        self._forward_lock = threading.Lock()

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", **kwargs) -> ModelDrafter:
        model = load_model(spec, device)
        return cls(model, model_info(spec, model), **kwargs)

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        if not request.session_id:
            raise InvalidArgument("session_id is empty")
        check_token_ids(request.context, self._info.vocab_size, "context")
        check_sampling(request.sampling)
        if request.draft_len < 0 or request.width < 1:
            raise InvalidArgument(f"draft_len must be >= 0 and width >= 1, got {request.draft_len} and {request.width}")
        draft_len = min(request.draft_len, self._info.max_context - len(request.context) - 1)
        if draft_len <= 0:
            return ProposeResult(Draft(), 0.0)
        session = self._session(request.session_id, request.epoch)
        start = time.perf_counter()
        context = list(request.context)
        branch = self._checkout(session, context, request.epoch)
        try:
            width = request.width if request.sampling.greedy else 1
            draft = self._draft(session, branch, context, draft_len, width, request.sampling, request.epoch)
        finally:
            branch.busy = False
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.DRAFT_MS.labels(drafter="model").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def _draft(self, session: _Session, branch: _Branch, context: list[int], draft_len: int, width: int,
               sampling: SamplingParams, epoch: int) -> Draft:
        keep = len(branch.tokens)  # _checkout cropped it to a prefix of context
        logits = self._forward(session, branch, context[keep:], epoch)  # [vocab]
        nodes = _Nodes()
        parent = ROOT
        for depth in range(draft_len):
            probs = logits.softmax(-1)
            branches = width if depth < BRANCH_LEVELS else 1
            top = probs.topk(min(max(2, branches), probs.shape[-1])).indices.tolist()
            q = None
            if sampling.greedy:
                token, alternatives = top[0], top[1:branches]
            else:
                q = truncate(warp(logits, sampling), self._max_q_entries)
                token, alternatives = sample_sparse(q, uniform(sampling.seed, len(context) + depth, STREAM_DRAFT)), []
            other = next((t for t in top if t != token), -1)
            chain_parent, parent = parent, nodes.add(token, parent, probs, other, q)
            for alternative in alternatives:  # siblings of the chain node: leaves of the tree
                nodes.add(alternative, chain_parent, probs, -1)
            if depth + 1 < draft_len:
                logits = self._forward(session, branch, [token], epoch)
        return nodes.draft(sampled=not sampling.greedy)

    def _forward(self, session: _Session, branch: _Branch, token_ids: list[int], epoch: int):
        with self._forward_lock:
            if epoch < session.epoch:  # a newer proposal dropped this one's hypothesis: stop now
                metrics.STALE_PROPOSALS.inc()
                raise Aborted(f"epoch {epoch} is stale: the session is at epoch {session.epoch}")
            logits = self._runner.forward(branch.cache, token_ids)[-1]
            branch.tokens.extend(token_ids)
            return logits

    def _checkout(self, session: _Session, context: list[int], epoch: int) -> _Branch:
        """The branch to draft after context on: the one sharing the longest prefix with it, cropped in
        place, or forked when another proposal may still need its tokens (it is busy, or was used in
        this epoch). Other branches of older epochs are evicted, then the least recently used."""
        with self._forward_lock, self._sessions_lock:
            def usable(branch: _Branch) -> int:
                return min(common_prefix(branch.tokens, context), len(context) - 1)

            best = max(reversed(session.branches), key=lambda b: (usable(b), not b.busy))
            keep = usable(best)
            if best.busy or (best.epoch == epoch and keep < len(best.tokens)):
                branch = _Branch(runner.fork(best.cache, keep), best.tokens[:keep])
            else:
                session.branches.remove(best)
                runner.crop(best.cache, keep)
                del best.tokens[keep:]
                branch = best
            branch.epoch, branch.busy = epoch, True
            live = [b for b in session.branches if b.busy or b.epoch >= epoch]
            session.branches = live[max(0, len(live) - self._max_branches + 1):] + [branch]
            return branch

    def release(self, session_id: str) -> bool:
        with self._sessions_lock:
            return self._sessions.pop(session_id, None) is not None

    def _session(self, session_id: str, epoch: int) -> _Session:
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None) or _Session([_Branch(self._runner.new_cache())])
            self._sessions[session_id] = session  # most recently used last
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
            if epoch < session.epoch:
                metrics.STALE_PROPOSALS.inc()
                raise Aborted(f"epoch {epoch} is stale: the session is at epoch {session.epoch}")
            session.epoch = epoch
            return session

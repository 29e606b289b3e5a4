"""Small-model drafter with its own KV caches per session.

Each proposal first syncs a cache to the given context by longest common prefix (crop, then re-feed
the rest); that one step is also the rollback after a rejected draft, so the drafter keeps no other
state and any replica can serve any session (it only costs a re-feed). A proposal of draft_len 0
is that step alone (a warm-up): the orchestrator sends one while a session drafts nothing, so that
its next draft does not first feed the whole prompt or every token since its last draft.

A session holds a few branches (cache + tokens), so that the branch schedule's proposals for several
predicted outcomes of one round never disturb each other: a proposal that would crop tokens another
proposal of the same epoch may still extend forks the branch instead (copy-on-write).
Branches of older epochs hold dropped hypotheses: they are cropped in place or evicted.

Llama / Qwen2 models draft batched in every forward mode (docs/batching.md; in the CUDA graphs mode
as captured padded batches, specpipe.engine.batched.BatchGraphs): each branch is a KV slot, and one
scheduler thread runs the next step of every pending proposal, of every session, as one forward
(drafter_service.drafting: the catch-up, then one token per depth). Other architectures, and
batching off, draft one proposal's forward at a time through specpipe.engine.runner; both paths run
the same drafting coroutine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import PreTrainedModel

from drafter_service.drafting import check_proposal, draft_steps
from specpipe.config.presets import ModelSpec
from specpipe.config.services import SESSION_TTL_S, BatchConfig
from specpipe.core.errors import Aborted
from specpipe.core.trees import common_prefix
from specpipe.core.types import Draft, ModelInfo, ProposeRequest, ProposeResult
from specpipe.engine import cores, runner
from specpipe.engine.costmodel import ForwardCurve
from specpipe.engine.kv import SlotKV, new_slot
from specpipe.engine.models import load_model, model_info
from specpipe.engine.scheduler import Step, Work, serving_scheduler
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import Sweeper, evict_idle, sweep_period

log = logging.getLogger(__name__)

DRAFT_BATCH = BatchConfig(max_queue=256)  # the drafter's default: a queue as deep as max_sessions


@dataclass
class _Branch:
    cache: runner.Cache | SlotKV
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV the cache holds
    epoch: int = 0                                   # of the last proposal that used it
    busy: bool = False


@dataclass
class _Session:
    branches: list[_Branch]  # least recently used first
    epoch: int = 0           # the newest seen
    last_used: float = field(default_factory=time.monotonic)


def _stale(session: _Session, epoch: int) -> None:
    """A newer proposal of the session dropped this one's hypothesis: stop now."""
    if epoch < session.epoch:
        metrics.STALE_PROPOSALS.inc()
        raise Aborted(f"epoch {epoch} is stale: the session is at epoch {session.epoch}")


class ModelDrafter:
    def __init__(self, model: PreTrainedModel, info: ModelInfo, max_sessions: int = 256, max_q_entries: int = 32,
                 max_branches: int = 4, mode: str = "eager", weights: str = "fp32",
                 buckets: Sequence[int] = runner.BUCKETS, batch: BatchConfig = DRAFT_BATCH, batching: bool = True,
                 session_ttl_s: float = SESSION_TTL_S, cost_model: ForwardCurve | None = None):
        """batching: False drafts one proposal per forward even where batching is supported (to compare);
        cost_model: every forward held to its curve's time (a load test's simulated device)."""
        self._model = model
        self._runner = runner.Runner(model, mode, buckets=buckets, weights=weights)  # packed: packs the linears
        self._info = runner.served_info(info, self._runner)
        self._max_sessions = max_sessions
        self._max_q_entries = max_q_entries
        self._max_branches = max_branches  # per session
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # LRU: the cache is soft state
        self._sessions_lock = threading.Lock()  # sessions, and every branch's tokens
        self._forward_lock = threading.Lock()  # unbatched: one forward at a time; a fork never sees one half done
        # graphs: captured now, before the first request
        self._scheduler = serving_scheduler(self._runner, batching, batch, "drafter", self._info.max_context,
                                            cost_model)
        self._session_ttl_s = session_ttl_s  # idle sessions are swept: their KV caches are freed
        self._sweeper = Sweeper(self.evict_idle, sweep_period(session_ttl_s), "drafter-session-sweeper")

    @classmethod
    def load(cls, spec: ModelSpec, device: str = "cpu", dtype: str = "float32", **kwargs: Any) -> ModelDrafter:
        model = load_model(spec, device, dtype, runner.packed_on_load(kwargs.get("mode", "eager"),
                                                                       kwargs.get("weights", "fp32")))
        return cls(model, model_info(spec, model), **kwargs)

    @property
    def batched(self) -> bool:
        return self._scheduler is not None

    @property
    def model(self) -> PreTrainedModel:
        """The small model (packed in place in packed mode)."""
        return self._model

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        check_proposal(request, self._info.vocab_size)
        draft_len = min(request.draft_len, self._info.max_context - len(request.context) - 1)
        if draft_len <= 0 and request.draft_len > 0:  # no room left in the context window
            return ProposeResult(Draft(), 0.0)
        session = self._session(request.session_id, request.epoch)
        start = time.perf_counter()
        context = list(request.context)
        branch = self._checkout(session, context, request.epoch)
        try:
            width = request.width if request.sampling.greedy else 1
            chunk = self._scheduler.config.prefill_chunk if self._scheduler else len(context)
            steps = self._on_branch(session, branch, request.epoch, draft_steps(
                context, len(branch.tokens), draft_len, width, request.sampling, self._max_q_entries, chunk,
                request.stop_confidence))
            draft = (
                self._scheduler.run(Work(branch.cache, steps)).result if self._scheduler  # type: ignore[arg-type]
                else self._alone(branch, steps)
            )
        finally:
            branch.busy = False
        draft_ms = (time.perf_counter() - start) * 1e3
        if not draft_len:  # a warm-up: the context fed, nothing drafted
            return ProposeResult(Draft(), draft_ms)
        metrics.DRAFT_MS.labels(drafter="model").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def _on_branch(self, session: _Session, branch: _Branch, epoch: int,
                   draft: Generator[list[int], torch.Tensor, Draft]) -> Generator[Step, torch.Tensor, Draft]:
        """The drafting coroutine's feeds as steps on branch: each first checks the epoch, and what it
        fed joins the branch's tokens."""
        logits = None
        while True:
            try:
                token_ids = draft.send(logits)  # type: ignore[arg-type]  # None primes it, as a coroutine's first send
            except StopIteration as done:
                return done.value
            _stale(session, epoch)
            logits = (yield Step(tuple(token_ids), logit_rows=1))[-1]  # [vocab]
            with self._sessions_lock:
                branch.tokens.extend(token_ids)

    def _alone(self, branch: _Branch, steps: Generator[Step, torch.Tensor, Draft]) -> Draft:
        """Run steps one forward at a time on this thread (the unbatched path)."""
        work = Work(branch.cache, steps)  # type: ignore[arg-type]  # the unbatched path's kv is any runner cache (Work's docstring), its steps get tensors
        while work.step is not None:
            with self._forward_lock, cores.forward("drafter"):
                logits = self._runner.forward(branch.cache, work.step.token_ids)  # [n, vocab]
            work.advance(logits[-work.step.logit_rows:])
        return work.result

    def _new_cache(self) -> runner.Cache | SlotKV:
        return new_slot(self._model, self._info.max_context) if self._scheduler else self._runner.new_cache()

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

    def evict_idle(self) -> int:
        """Drop sessions idle for longer than the TTL (the sweeper calls this). Returns how many."""
        with self._sessions_lock:
            return evict_idle(self._sessions, self._session_ttl_s)

    def _session(self, session_id: str, epoch: int) -> _Session:
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None) or _Session([_Branch(self._new_cache())])
            self._sessions[session_id] = session  # most recently used last
            session.last_used = time.monotonic()
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
            _stale(session, epoch)
            session.epoch = epoch
            return session

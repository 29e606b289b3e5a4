"""The verifier's batch scheduler: one thread owns the model and runs the pending Verify and Prefill
work of every session as one forward (docs/batching.md).

Gather policy (plan_batch): dispatch as soon as the model is free, with whatever is pending, never
waiting for company. Verify rounds go first (a decoding session's latency is the product), oldest
first, within the token budget; prefills fill the rest in chunks of at most prefill_chunk tokens,
so a long prompt enters over several forwards and never stalls the decode rounds of others for more
than one chunk. A verify round larger than the whole budget runs alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specpipe import metrics
from specpipe.errors import ResourceExhausted, Unavailable
from verifier_service.batched import Segment, batched_forward
from verifier_service.kv import SlotKV


@dataclass(frozen=True)
class BatchConfig:
    max_batch_tokens: int = 512  # tokens per forward, all sessions together
    prefill_chunk: int = 256     # prompt tokens a prefill feeds per forward
    max_queue: int = 64          # requests waiting for the model; beyond: RESOURCE_EXHAUSTED

    def __post_init__(self):
        for name in ("max_batch_tokens", "prefill_chunk", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def plan_batch(pending: Sequence[tuple[bool, int]], max_batch_tokens: int, prefill_chunk: int) -> list[tuple[int, int]]:
    """pending: (is_prefill, tokens left) per request, oldest first. Returns (request index, tokens
    to feed now) for the next forward: verify rounds whole, oldest first, within the budget (the
    first always, even past it); then prefill chunks from what is left."""
    plan, budget = [], max_batch_tokens
    for i, (is_prefill, left) in enumerate(pending):
        if not is_prefill and (left <= budget or not plan):
            plan.append((i, left))
            budget -= left
    for i, (is_prefill, left) in enumerate(pending):
        if is_prefill and budget > 0:
            take = min(left, prefill_chunk, budget)
            plan.append((i, take))
            budget -= take
        elif is_prefill and not plan:  # nothing else to run: never idle with work pending
            plan.append((i, min(left, prefill_chunk)))
            budget = 0
    return plan


@dataclass
class Work:
    """One request's tokens for one session's slot: a prefill (fed in chunks, no logits) or a verify
    round ([root] + draft, one forward, logits for every row)."""

    kv: SlotKV
    token_ids: tuple[int, ...]             # [n]
    positions: torch.Tensor | None = None  # [n] tree positions of a verify round; None: consecutive
    allowed: torch.Tensor | None = None    # [n, n] tree mask of a verify round; None: causal
    fed: int = 0                           # tokens already in the slot
    forward_ms: float = 0.0                # wall time of the forwards it took part in
    batch_sessions: int = 1                # sessions in the last forward it took part in
    batch_tokens: int = 0                  # tokens that forward fed, every session's
    logits: torch.Tensor | None = None     # [n, vocab] of a verify round, once done
    error: BaseException | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def is_prefill(self) -> bool:
        return self.allowed is None

    def segment(self, n: int) -> Segment:
        """The next n tokens as a segment of a batched forward."""
        if not self.is_prefill:
            return Segment(self.kv, self.token_ids, self.positions, self.allowed, logits=True)
        start = self.kv.length
        return Segment(self.kv, self.token_ids[self.fed : self.fed + n], torch.arange(start, start + n),
                       torch.ones(n, n, dtype=torch.bool).tril(), logits=False)


class Scheduler:
    def __init__(self, model: PreTrainedModel, config: BatchConfig = BatchConfig()):
        self._model = model
        self.config = config
        self._pending: list[Work] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="specpipe-verify-batch", daemon=True)
        self._thread.start()

    def run(self, work: Work) -> Work:
        """Queue work and block until its forwards are done (raises what the forward raised)."""
        with self._cond:
            if self._closed:
                raise Unavailable("the verifier is shutting down")
            if len(self._pending) >= self.config.max_queue:
                raise ResourceExhausted(f"verifier queue is full ({len(self._pending)} requests waiting, "
                                        f"max {self.config.max_queue}); retry later or add verifier replicas")
            self._pending.append(work)
            metrics.QUEUE_DEPTH.labels(role="verifier").set(len(self._pending))
            self._cond.notify()
        work.done.wait()
        if work.error is not None:
            raise work.error
        return work

    @property
    def depth(self) -> int:
        """Requests queued or in the forward now."""
        with self._cond:
            return len(self._pending)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for work in self._pending:
                        work.error = Unavailable("the verifier is shutting down")
                        work.done.set()
                    return
                pending = list(self._pending)
            plan = plan_batch([(w.is_prefill, len(w.token_ids) - w.fed) for w in pending],
                              self.config.max_batch_tokens, self.config.prefill_chunk)
            self._step([(pending[i], n) for i, n in plan])

    def _step(self, batch: list[tuple[Work, int]]) -> None:
        now = time.perf_counter()
        for work, _ in batch:
            if not work.started:
                work.started = True
                metrics.QUEUE_WAIT_MS.labels(role="verifier").observe((now - work.enqueued) * 1e3)
        tokens = sum(n for _, n in batch)
        metrics.VERIFY_BATCH_SESSIONS.observe(len(batch))
        metrics.VERIFY_BATCH_TOKENS.observe(tokens)
        finished: list[Work] = []
        try:
            logits = batched_forward(self._model, [work.segment(n) for work, n in batch])
        except Exception as err:  # a bad forward fails its requests, never the scheduler
            for work, _ in batch:
                work.error = err
            finished = [work for work, _ in batch]
        else:
            forward_ms = (time.perf_counter() - now) * 1e3
            for (work, n), rows in zip(batch, logits):
                work.fed += n
                work.forward_ms += forward_ms
                work.batch_sessions, work.batch_tokens = len(batch), tokens
                work.logits = rows
                if work.fed == len(work.token_ids):
                    finished.append(work)
        with self._cond:
            for work in finished:
                self._pending.remove(work)
            metrics.QUEUE_DEPTH.labels(role="verifier").set(len(self._pending))
        for work in finished:
            work.done.set()

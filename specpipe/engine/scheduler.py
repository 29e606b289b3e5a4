"""The batch scheduler of the verifier and the model drafter: one thread owns the model and runs the
pending steps of every request as one forward (docs/batching.md).

A request (Work) is a coroutine of steps over one slot: it yields a Step (tokens to feed), receives
the logits the step asked for, and returns its result. A verify round or a prompt is one step; a
drafting proposal is a catch-up of the context, then one step per draft depth, its next token
chosen on the scheduler thread from the logits of the step before, so every pending proposal's next
step joins the very next forward.

Gather policy (plan_batch): dispatch as soon as the model is free, with whatever is pending: a lone
session never waits for company. Whole steps go first (a decoding session's latency is the product), oldest
first, within the token budget; chunked steps (prompts) fill the rest in chunks of at most
prefill_chunk tokens, so a long prompt enters over several forwards and never stalls the decode
rounds of others for more than one chunk. While other sessions decode, a chunk is also kept small
enough that a forward takes at most prefill_stall x as long as their rounds alone (the first chunk
from the fitted forward time, stall_chunk_cap; the next ones from the time the last one added,
next_chunk): beside their pending rounds, and on the verifier also between them (a session counts as decoding for
DECODING_RECENT_S after its last round). On the verifier a forward first waits, once, a short grace
(gather_grace_s: a share of its predicted time) for the rounds of decoding sessions not yet pending:
their replies leave together, but come back one by one, and a forward dispatched on the first of
them would split the sessions into cohorts that each pay a whole forward, as would a session running
beside its own prompt chunk. It waits only for the sessions due back (due_back_until): those whose
last round ended within the longest of the recent turnarounds (the orchestrator's turn between a
round's forward and the session's next round), so it ends when they are in, or when the late ones
are late enough to be drafting or gone. A lone session never waits. A whole step larger
than the whole budget runs alone.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from specpipe.config.services import GATHER_GRACE_SHARE, BatchConfig
from specpipe.core.errors import Cancelled, FailedPrecondition, ResourceExhausted, Unavailable
from specpipe.core.fits import LinearFit
from specpipe.engine import cores
from specpipe.engine.batched import Segment, batched_forward, service_forward, unbatched_reason
from specpipe.engine.costmodel import ClockedForward, ForwardCurve
from specpipe.engine.kv import SlotKV
from specpipe.engine.runner import Runner
from specpipe.runtime import cpu, metrics
from specpipe.runtime.lifecycle import Cancellation

log = logging.getLogger(__name__)

# role -> (sessions per forward, tokens per forward) histograms
_BATCH_METRICS = {"verifier": (metrics.VERIFY_BATCH_SESSIONS, metrics.VERIFY_BATCH_TOKENS),
                  "drafter": (metrics.DRAFT_BATCH_SESSIONS, metrics.DRAFT_BATCH_TOKENS)}


GATHER_GRACE_MIN_S, GATHER_GRACE_MAX_S = 0.002, 0.05
# Of recent turnarounds: how long after its round a session is still due back. The longest: a round
# that misses a forward waits a whole one, a wait is at most the grace
# (docs/results/2026-11-25-batching.md, "Over gRPC").
TURNAROUND_QUANTILE = 1.0
TURNAROUND_WINDOW = 256     # turnarounds kept


def plan_batch(pending: Sequence[tuple[bool, int]], max_batch_tokens: int, prefill_chunk: int,
               chunk_cap: int | None = None) -> list[tuple[int, int]]:
    """pending: (chunked, tokens left) per request, oldest first. Returns (request index, tokens
    to feed now) for the next forward: whole steps, oldest first, within the budget (the first
    always, even past it); then chunks of chunked steps from what is left, at most chunk_cap
    tokens of them (see stall_chunk_cap)."""
    plan, budget = [], max_batch_tokens
    for i, (chunked, left) in enumerate(pending):
        if not chunked and (left <= budget or not plan):
            plan.append((i, left))
            budget -= left
    if chunk_cap is not None:
        budget = min(budget, chunk_cap)
    for i, (chunked, left) in enumerate(pending):
        if chunked and budget > 0:
            take = min(left, prefill_chunk, budget)
            plan.append((i, take))
            budget -= take
        elif chunked and not plan:  # nothing else to run: never idle with work pending
            plan.append((i, min(left, prefill_chunk)))
            budget = 0
    return plan


MIN_CHUNK = 1             # prompt tokens such a forward still takes, so a prompt always advances
DECODING_RECENT_S = 2.0   # a session whose last round ended this recently counts as decoding


def decoding_work(last_steps: Iterable[tuple[float, float]], now: float) -> float:
    """Work (see step_work) of the last whole steps (ended at, work) of the sessions still decoding at `now`."""
    return sum(work for ended, work in last_steps if now - ended <= DECODING_RECENT_S)


def due_within_s(turnarounds: Sequence[float], quantile: float = TURNAROUND_QUANTILE) -> float:
    """How long after its round's forward ended a session is still expected back for the next
    forward: that quantile of recent turnarounds (s); DECODING_RECENT_S before any was seen."""
    if not turnarounds:
        return DECODING_RECENT_S
    ordered = sorted(turnarounds)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def due_back_until(last_steps: Iterable[tuple[float, float]], now: float, due_s: float) -> float:
    """When the last session between rounds (ended at, work) that is still due back at `now` (its
    round ended at most due_s ago) stops being due; 0 when none is."""
    return max((ended + due_s for ended, _ in last_steps if now - ended <= due_s), default=0.0)


def gather_grace_s(forward_ms: float, share: float = GATHER_GRACE_SHARE) -> float:
    """How long a forward predicted to take forward_ms waits for the rounds of sessions decoding
    between rounds: a merged round saves a whole forward, a wait in vain costs `share` of one; within
    [GATHER_GRACE_MIN_S, GATHER_GRACE_MAX_S] (the minimum before any forward was timed); 0 with share 0."""
    if share <= 0:
        return 0.0
    return min(GATHER_GRACE_MAX_S, max(GATHER_GRACE_MIN_S, share * forward_ms / 1e3))


def attention_weight(config) -> float:
    """FLOPs of one query attending to one key over the FLOPs of one token through a layer stack's
    linear layers (a Llama-family config): what a query-key pair weighs against a token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = 2 * config.hidden_size * q + 2 * config.hidden_size * kv + 3 * config.hidden_size * config.intermediate_size
    return 2 * q / per_layer  # per layer: 4 * q FLOPs a pair (scores and values), 2 * per_layer a token


def step_work(tokens: int, past: int, attention: float) -> float:
    """A step's share of a forward's time in token-equivalents: its tokens, plus its query-key pairs
    (each token attends to the past and the step's own tokens before it) at attention weight. A
    prompt chunk deep into a long prompt costs more than its tokens: at 4k positions of SmolLM2,
    2.4x a chunk at the start."""
    return tokens + attention * tokens * (past + (tokens + 1) / 2)


def stall_chunk_cap(decode_work: float, fit: tuple[float, float] | None, stall: float, past: int = 0,
                    attention: float = 0.0) -> int | None:
    """Prompt tokens at position `past` that a forward may feed so that it takes at most stall x as
    long as whole steps (verify rounds, draft steps) of decode_work (step_work) alone, from the fitted
    forward time a + b * work (Sarathi-Serve's chunking, bounded by time instead of tokens); None
    (no bound) without whole steps, before the fit knows a per-token cost, or with stall 0. On a CPU a prompt chunk
    costs far more than a decode round, so this keeps a long prompt being admitted from stretching
    the inter-token latency of the sessions already decoding."""
    if decode_work <= 0 or fit is None or fit[1] <= 0 or not stall:
        return None
    a, b = fit
    room = max(0.0, (stall - 1.0) * (a + b * decode_work) / b)  # work the chunk may add (a fit's a may be < 0)
    if attention > 0:  # step_work(n, past) = room, solved for n
        linear = 1 + attention * (past + 0.5)
        room = (math.sqrt(linear * linear + 2 * attention * room) - linear) / attention
    return max(MIN_CHUNK, int(room))


def next_chunk(tokens: int, added_ms: float, room_ms: float) -> int:
    """The prompt tokens of the next chunk beside whole steps, from the last chunk's: scaled by how
    much of the time it may add (room_ms) the last one added (added_ms), at most halved or doubled;
    at least MIN_CHUNK. A chunk deep into a long prompt costs more than the fit of forward times
    predicts from its work (its attention reads the prompt's whole KV cache, for even one token, at
    a lower rate than the packed GEMM: at position 3000 of SmolLM2, 11 tokens took 2.4x the forward
    of two decode steps where the fit allowed 1.5x), so the measured time steers the size."""
    if added_ms <= 0:
        return 2 * tokens
    return max(MIN_CHUNK, tokens // 2, min(2 * tokens, round(tokens * room_ms / added_ms)))


@dataclass(frozen=True)
class Step:
    """Tokens to feed after a slot's cached positions."""

    token_ids: tuple[int, ...]             # [n]
    positions: torch.Tensor | None = None  # [n] a tree's positions (past + depth); None: consecutive
    allowed: torch.Tensor | None = None    # [n, n] a tree's mask (root + ancestors); None: causal
    logit_rows: int = 0                    # how many of the last rows need logits
    chunked: bool = False                  # a prompt: may enter over several forwards (needs no logits)

    def __post_init__(self):
        if self.chunked and self.logit_rows:
            raise ValueError("a chunked step needs no logits")


def one_step(step: Step) -> Generator[Step, torch.Tensor | None, torch.Tensor | None]:
    """A request of a single step; its result is the step's logits."""
    logits = yield step
    return logits


class Work:
    """One request's steps over one slot. Made on the caller's thread (which runs the coroutine up to
    its first step), then advanced by the scheduler thread (or by the caller, one forward at a time,
    where a model runs unbatched: then kv may be any specpipe.engine.runner cache)."""

    def __init__(self, kv: SlotKV, steps: Generator[Step, torch.Tensor | None, Any],
                 cancellation: Cancellation | None = None):
        self.kv = kv
        self._steps = steps
        self.cancellation = cancellation  # set when its caller has gone: the rest is dropped (a prefill's chunks)
        self.step: Step | None = None  # the current one; None once the coroutine has returned
        self.fed = 0                   # tokens of the current step already in the slot
        self.result: Any = None        # what the coroutine returned
        self.forward_ms = 0.0          # wall time of the forwards it took part in
        self.batch_sessions = 1        # requests in the last forward it took part in
        self.batch_tokens = 0          # tokens that forward fed, every request's
        self.next_chunk = 0            # a prompt's: tokens of its next chunk beside whole steps (0: not steered yet)
        self.error: BaseException | None = None
        self.enqueued = time.perf_counter()
        self.started = False
        self.done = threading.Event()
        self.advance(None)

    def advance(self, logits: torch.Tensor | None) -> None:
        """Send the current step's logits to the coroutine: the next step, or its result."""
        try:
            self.step = self._steps.send(logits)
        except StopIteration as stop:
            self.step, self.result = None, stop.value
        self.fed = 0

    def left(self) -> tuple[bool, int]:
        """(chunked, tokens left) of the current step, for plan_batch."""
        return self.step.chunked, len(self.step.token_ids) - self.fed

    def segment(self, n: int) -> Segment:
        """The next n tokens of the current step as a segment of a batched forward."""
        step, start = self.step, self.kv.length
        positions = step.positions if step.positions is not None else torch.arange(start, start + n)
        allowed = step.allowed if step.allowed is not None else torch.ones(n, n, dtype=torch.bool).tril()
        return Segment(self.kv, step.token_ids[self.fed : self.fed + n], positions, allowed, step.logit_rows)


class Scheduler:
    def __init__(self, model: PreTrainedModel | None, config: BatchConfig = BatchConfig(), role: str = "verifier",
                 forward: Callable[[Sequence[Segment]], list] | None = None, attention: float | None = None):
        """forward: the batched forward (specpipe.engine.batched.service_forward: batched_forward, or in the
        graphs mode a BatchGraphs'); model may be None where forward and attention (attention_weight of
        the model's config) are given (a replayed verifier, verifier_service/replay.py)."""
        self._model = model
        self._forward = forward or (lambda segments: batched_forward(model, segments))
        self.config = config
        self._role = role
        self._batch_sessions, self._batch_tokens = _BATCH_METRICS[role]
        self._forward_seconds = metrics.FORWARD_SECONDS.labels(role=role)
        self._forwards = metrics.FORWARDS.labels(role=role)
        self._cost = LinearFit(decay=0.9)  # forward ms against work fed (step_work)
        self._decode_cost = LinearFit(decay=0.9)  # the same, of forwards of whole steps only
        self._attention = attention if attention is not None else attention_weight(model.config)
        self._pending: list[Work] = []
        self._cond = threading.Condition()
        self._closed = False
        # id(slot) -> (the slot, held weakly; ended, work) of its last whole step: the verifier's decoding
        # sessions, between rounds too. Only the scheduler thread changes it (a WeakKeyDictionary would drop
        # a freed slot from whichever thread frees it, mid-iteration here).
        self._last_steps: dict[int, tuple[weakref.ref[SlotKV], float, float]] | None = {} if role == "verifier" else None
        self._graced = False  # the next forward has waited for decoding sessions' rounds
        self._turnarounds: deque[float] = deque(maxlen=TURNAROUND_WINDOW)  # s from a round's forward to the next round
        self._thread = threading.Thread(target=self._loop, name=f"specpipe-{role}-batch", daemon=True)
        self._thread.start()

    def run(self, work: Work) -> Work:
        """Queue work and block until its coroutine has returned (raises what it or a forward raised)."""
        if work.step is None:
            return work
        with self._cond:
            if self._closed:
                raise Unavailable(f"the {self._role} is shutting down")
            if len(self._pending) >= self.config.max_queue:
                raise ResourceExhausted(f"{self._role} queue is full ({len(self._pending)} requests waiting, "
                                        f"max {self.config.max_queue}); retry later or add {self._role} replicas")
            self._pending.append(work)
            metrics.QUEUE_DEPTH.labels(role=self._role).set(len(self._pending))
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
        cpu.start_laps()
        while True:  # one forward per call: nothing of it outlives the call (released slots go)
            try:
                if not self._dispatch():
                    return
            except Exception as err:  # a bug in planning must fail the requests, never leave them waiting
                log.exception("%s batch scheduler: planning a forward failed", self._role)
                self._fail_pending(RuntimeError(f"the {self._role} could not plan a forward: {err!r}"))
            cpu.lap(self._role, "scheduler")  # the thread's CPU outside its forwards: planning, hand-offs

    def _fail_pending(self, error: Exception) -> None:
        with self._cond:
            failed, self._pending = self._pending, []
            metrics.QUEUE_DEPTH.labels(role=self._role).set(0)
        for work in failed:
            work.error = error
            work.done.set()

    def _dispatch(self) -> bool:
        """Run the next forward; False once closed."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                for work in self._pending:
                    work.error = Unavailable(f"the {self._role} is shutting down")
                    work.done.set()
                return False
            pending = list(self._pending)
        if self._drop_abandoned(pending):
            return True
        left = [w.left() for w in pending]
        decoding = sum(self._work(w, n) for w, (chunked, n) in zip(pending, left) if not chunked)
        elsewhere = self._decoding_elsewhere(pending)
        if elsewhere and not self._graced and self._wait_for_rounds_due(pending, decoding + elsewhere):
            return True  # rounds due now join this forward instead of waiting out one
        decoding = decoding or elsewhere
        prompt = next((w for w, (chunked, _) in zip(pending, left) if chunked), None)
        if decoding and self.config.prefill_stall and prompt is not None and prompt.next_chunk:
            cap = prompt.next_chunk  # steered by the time its last chunk added
        else:
            past = prompt.kv.length if prompt is not None else 0
            cap = stall_chunk_cap(decoding, self._cost.line(), self.config.prefill_stall, past, self._attention)
        plan = plan_batch(left, self.config.max_batch_tokens, self.config.prefill_chunk, cap)
        self._step([(pending[i], n) for i, n in plan])
        return True

    def _wait_for_rounds_due(self, pending: list[Work], work: float) -> bool:
        """Wait, once before a forward of `work`, up to the grace for the rounds of the decoding sessions
        due back, until they are in or late. False (no wait) when none is due or the grace is off."""
        due_s = due_within_s(self._turnarounds)
        grace_s = gather_grace_s(self._cost.predict(work), self.config.gather_grace)
        if not grace_s or not due_back_until(self._between_rounds(pending), time.perf_counter(), due_s):
            return False
        self._graced = True
        deadline = time.perf_counter() + grace_s
        with self._cond:
            while not self._closed:
                now = time.perf_counter()
                wait_s = min(deadline, due_back_until(self._between_rounds(self._pending), now, due_s)) - now
                if wait_s <= 0:
                    break
                self._cond.wait(wait_s)
        return True

    def _work(self, work: Work, tokens: int) -> float:
        return step_work(tokens, work.kv.length, self._attention)

    def _decoding_elsewhere(self, pending: list[Work]) -> float:
        """Work of the last rounds of the decoding sessions with nothing pending."""
        return decoding_work(self._between_rounds(pending), time.perf_counter())

    def _between_rounds(self, pending: list[Work]) -> list[tuple[float, float]]:
        """(ended at, work) of the last round of each live session with nothing pending (verifier)."""
        if self._last_steps is None:
            return []
        busy = {id(w.kv) for w in pending}
        steps = []
        for key, (slot, ended, work) in list(self._last_steps.items()):
            if slot() is None:  # released
                del self._last_steps[key]
            elif key not in busy:
                steps.append((ended, work))
        return steps

    def _drop_abandoned(self, pending: list[Work]) -> bool:
        """Finish the works whose callers have gone with Cancelled, before their next forward."""
        abandoned = [w for w in pending if w.cancellation is not None and w.cancellation.cancelled]
        if not abandoned:
            return False
        with self._cond:
            for work in abandoned:
                self._pending.remove(work)
            metrics.QUEUE_DEPTH.labels(role=self._role).set(len(self._pending))
        for work in abandoned:
            work.error = Cancelled(f"{self._role}: the caller went away; {work.fed} tokens of the step were fed")
            work.done.set()
        return True

    def _turnaround(self, work: Work) -> None:
        """A decoding session's next round has started: learn how long it took to come back."""
        last = self._last_steps.get(id(work.kv)) if self._last_steps is not None else None
        if last is not None and not work.step.chunked:
            turnaround_s = max(0.0, work.enqueued - last[1])
            self._turnarounds.append(turnaround_s)
            metrics.VERIFY_TURNAROUND_MS.observe(turnaround_s * 1e3)

    def _steer_chunks(self, batch: list[tuple[Work, int]], works: list[float], forward_ms: float) -> None:
        """Learn the time of forwards of whole steps alone, and after a forward of whole steps and a
        prompt chunk, size the prompt's next chunk by the time this one added (next_chunk)."""
        decode = sum(work for (w, _), work in zip(batch, works) if not w.step.chunked)
        chunks = [(w, n) for w, n in batch if w.step.chunked]
        if not chunks:
            self._decode_cost.add(decode, forward_ms)
        elif decode and self.config.prefill_stall and self._decode_cost.line() is not None:
            alone_ms = self._decode_cost.predict(decode)
            prompt, tokens = chunks[0]
            prompt.next_chunk = next_chunk(tokens, forward_ms - alone_ms, (self.config.prefill_stall - 1) * alone_ms)

    def _step(self, batch: list[tuple[Work, int]]) -> None:
        now = time.perf_counter()
        self._graced = False
        for work, _ in batch:
            if not work.started:
                work.started = True
                self._turnaround(work)
                metrics.QUEUE_WAIT_MS.labels(role=self._role).observe((now - work.enqueued) * 1e3)
        tokens = sum(n for _, n in batch)
        works = [self._work(work, n) for work, n in batch]
        self._batch_sessions.observe(len(batch))
        self._batch_tokens.observe(tokens)
        finished: list[Work] = []
        try:
            segments = [work.segment(n) for work, n in batch]
            launched = time.perf_counter()
            with cores.forward(self._role), cpu.hop(self._role, "forward"):
                logits = self._forward(segments)
        except Exception as err:  # a bad forward fails its requests, never the scheduler
            for work, _ in batch:
                work.error = err
            finished = [work for work, _ in batch]
        else:
            ended = time.perf_counter()
            forward_ms = (ended - now) * 1e3
            self._forward_seconds.inc(ended - launched)  # the busy share: the forward alone
            self._forwards.inc()
            self._steer_chunks(batch, works, forward_ms)
            self._cost.add(sum(works), forward_ms)
            for (work, n), rows, done in zip(batch, logits, works):
                if self._last_steps is not None and not work.step.chunked:
                    self._last_steps[id(work.kv)] = (weakref.ref(work.kv), ended, done)
                work.fed += n
                work.forward_ms += forward_ms
                work.batch_sessions, work.batch_tokens = len(batch), tokens
                if work.fed < len(work.step.token_ids):
                    continue
                try:
                    work.advance(rows)
                except Exception as err:  # the request's own error (a stale epoch): it alone fails
                    work.error = err
                if work.step is None or work.error is not None:
                    finished.append(work)
        with self._cond:
            for work in finished:
                self._pending.remove(work)
            metrics.QUEUE_DEPTH.labels(role=self._role).set(len(self._pending))
        for work in finished:
            work.done.set()


def serving_scheduler(runner: Runner, batching: bool, config: BatchConfig, role: str, max_context: int,
                      curve: ForwardCurve | None = None) -> Scheduler | None:
    """The scheduler a verifier or model drafter batches its sessions with (in the graphs mode over
    BatchGraphs, captured now), or None where it runs one session per forward through runner (warmed
    up now: its graphs captured). curve: every forward held to its time (a load test's simulated
    device, specpipe.engine.costmodel)."""
    reason = unbatched_reason(runner.model, batching)
    if reason is not None:
        if curve is not None:
            raise FailedPrecondition(f"--cost-model holds batched forwards to a curve; this {role} runs one session "
                                     f"per forward ({reason})")
        log.info(f"{role} runs one session per forward", extra={"reason": reason})
        runner.warm_up()
        return None
    forward = service_forward(runner.model, runner.mode, max_context)
    if curve is not None:
        forward = ClockedForward(forward, curve)
        log.info(f"{role} forwards held to a cost model", extra={"clock": curve.label})
    return Scheduler(runner.model, config, role, forward)

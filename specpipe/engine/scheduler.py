"""The batch scheduler of the verifier and the model drafter: one thread owns the model and runs the
pending steps of every request as one forward (docs/batching.md). It executes what the planner
decides (specpipe.engine.planner: the gather policy, the prompt chunks, the gather grace) and feeds
the planner what the forwards took.

A request (Work) is a coroutine of steps over one slot: it yields a Step (tokens to feed), receives
the logits the step asked for, and returns its result. A verify round or a prompt is one step; a
drafting proposal is a catch-up of the context, then one step per draft depth, its next token
chosen on the scheduler thread from the logits of the step before, so every pending proposal's next
step joins the very next forward. Callers wait for their work (run) or are told when it is done
(submit: a stream of rounds).

Dispatch is as soon as the model is free, with whatever is pending; on the verifier a forward first
waits, once, a short grace for the rounds of decoding sessions due back (their replies leave
together but come back one by one: a forward dispatched on the first of them would split the
sessions into cohorts that each pay a whole forward). A lone session never waits.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from specpipe.config.services import BatchConfig
from specpipe.core.errors import Cancelled, FailedPrecondition, ResourceExhausted, Unavailable
from specpipe.core.fits import Ewma, LinearFit
from specpipe.engine import cores
from specpipe.engine.batched import (
    SESSION_BUCKETS,
    TOKEN_BUCKETS,
    Segment,
    batched_forward,
    service_forward,
    unbatched_reason,
)
from specpipe.engine.costmodel import ClockedForward, ForwardCurve
from specpipe.engine.kv import SlotKV
from specpipe.engine.planner import (
    TURNAROUND_WINDOW,
    Learned,
    Pending,
    attention_weight,
    chunk_credit,
    decoding_work,
    due_back_until,
    due_within_s,
    gather_grace_s,
    next_chunk,
    plan_forward,
    step_shape,
    step_work,
)
from specpipe.engine.runner import ROUNDED_ACTIVATIONS, Runner
from specpipe.runtime import cpu, metrics, tracing
from specpipe.runtime.lifecycle import Cancellation

log = logging.getLogger(__name__)

# role -> (sessions per forward, tokens per forward) histograms
_BATCH_METRICS = {"verifier": (metrics.VERIFY_BATCH_SESSIONS, metrics.VERIFY_BATCH_TOKENS),
                  "drafter": (metrics.DRAFT_BATCH_SESSIONS, metrics.DRAFT_BATCH_TOKENS)}


@dataclass(frozen=True)
class Step:
    """Tokens to feed after a slot's cached positions."""

    token_ids: tuple[int, ...]             # [n]
    positions: torch.Tensor | None = None  # [n] a tree's positions (past + depth); None: consecutive
    allowed: torch.Tensor | None = None    # [n, n] a tree's mask (root + ancestors); None: causal
    logit_rows: int = 0                    # how many of the last rows need logits
    chunked: bool = False                  # a prompt: may enter over several forwards (needs no logits)

    def __post_init__(self) -> None:
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
                 cancellation: Cancellation | None = None, on_done: Callable[[Work], None] | None = None,
                 trace: Any = None):
        """on_done: called on the scheduler thread once the work is done or failed (Scheduler.submit's
        callers; Scheduler.run waits instead). trace: the span its queue wait and forwards are children of
        (default: the caller's current one, where tracing is on and the caller is traced)."""
        self.kv = kv
        self.trace = trace if trace is not None or not tracing.ACTIVE else tracing.current()
        self.on_done = on_done
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

    def complete(self, error: BaseException | None = None) -> None:
        """Done (with error, failed): wake its waiter and tell on_done, once. The callback is dropped
        first: it holds the round it tells of (which holds this work), and a cycle through a session's KV
        slot would keep the slot until the garbage collector's next full pass."""
        if error is not None:
            self.error = error
        self.done.set()
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            try:
                on_done(self)
            except Exception:  # the caller's hand-off: it must not take the scheduler down
                log.exception("a work's on_done failed")

    @property
    def current(self) -> Step:
        """The current step: a queued work has one (step is None once its coroutine returned)."""
        assert self.step is not None
        return self.step

    def left(self) -> tuple[bool, int]:
        """(chunked, tokens left) of the current step, for plan_batch."""
        step = self.current
        return step.chunked, len(step.token_ids) - self.fed

    def segment(self, n: int) -> Segment:
        """The next n tokens of the current step as a segment of a batched forward."""
        step, start = self.current, self.kv.length
        positions = step.positions if step.positions is not None else consecutive(start, n)
        allowed = step.allowed if step.allowed is not None else causal(n)
        return Segment(self.kv, step.token_ids[self.fed : self.fed + n], positions, allowed, step.logit_rows)


# A step's positions and mask without a torch call per step: a torch op releases the GIL, and getting it
# back behind the threads that serve the stream of rounds costs up to a switch interval (5 ms) each.
_POSITIONS = torch.arange(1 << 17)


def consecutive(start: int, n: int) -> torch.Tensor:
    """[n] positions start, start + 1, ... (a view: read only)."""
    if start + n > len(_POSITIONS):
        return torch.arange(start, start + n)
    return _POSITIONS[start : start + n]


@functools.lru_cache(maxsize=64)
def causal(n: int) -> torch.Tensor:
    """[n, n] bool: each of n new tokens sees itself and the ones before it (shared: read only)."""
    return torch.ones(n, n, dtype=torch.bool).tril()


class Scheduler:
    def __init__(self, model: PreTrainedModel | None, config: BatchConfig = BatchConfig(), role: str = "verifier",
                 forward: Callable[[Sequence[Segment]], list] | None = None, attention: float | None = None,
                 group: int | None = None):
        """forward: the batched forward (specpipe.engine.batched.service_forward: batched_forward, or in the
        graphs mode a BatchGraphs'); model may be None where forward and attention (attention_weight of
        the model's config) are given (a replayed verifier, verifier_service/replay.py). group: the
        sessions of whole steps that forward runs at once, where it runs larger batches as groups one
        after another (the graphs mode, a cost model's curve; planner.plan_forward); None: any batch at once."""
        if forward is None or attention is None:
            assert model is not None, "a scheduler without a model needs its forward and attention weight"
        self._model = model
        self._forward = forward or (lambda segments: batched_forward(cast(PreTrainedModel, model), segments))
        self.config = config
        self._group = group
        self._role = role
        self._batch_sessions, self._batch_tokens = _BATCH_METRICS[role]
        self._forward_seconds = metrics.FORWARD_SECONDS.labels(role=role)
        self._forwards = metrics.FORWARDS.labels(role=role)
        metrics.zero(metrics.ADMISSION_REJECTIONS, {"role": role, "reason": "queue"})
        self._cost = LinearFit(decay=0.9)  # forward ms against work fed (step_work)
        self._decode_cost = LinearFit(decay=0.9)  # the same, of forwards of whole steps only
        self._chunk_cost = LinearFit(decay=0.9)  # ms a prompt chunk adds beside whole steps, against its tokens
        self._alone_ms: dict[tuple[int, int], Ewma] = {}  # forwards of whole steps alone, by step_shape
        self._chunk_credit_ms = 0.0  # specpipe.engine.planner.chunk_credit
        self._attention = attention if attention is not None else attention_weight(cast(PreTrainedModel, model).config)
        self._pending: list[Work] = []
        self._cond = threading.Condition()
        self._closed = False
        # id(slot) -> (the slot, held weakly; ended, work) of its last whole step: the verifier's decoding
        # sessions, between rounds too. Only the scheduler thread changes it (a WeakKeyDictionary would drop
        # a freed slot from whichever thread frees it, mid-iteration here).
        self._last_steps: dict[int, tuple[weakref.ref[SlotKV], float, float]] | None = (
            {} if role == "verifier" else None
        )
        self._graced = False  # the next forward has waited for decoding sessions' rounds
        self._turnarounds: deque[float] = deque(maxlen=TURNAROUND_WINDOW)  # s from a round's forward to the next round
        self._thread = threading.Thread(target=self._loop, name=f"specpipe-{role}-batch", daemon=True)
        self._thread.start()

    def run(self, work: Work) -> Work:
        """Queue work and block until its coroutine has returned (raises what it or a forward raised)."""
        if work.step is None:
            return work
        refused = self.submit([work])[0]
        if refused is not None:
            raise refused
        work.done.wait()
        if work.error is not None:
            raise work.error
        return work

    def submit(self, works: Sequence[Work]) -> list[Exception | None]:
        """Queue works together (they join the same next forward, room allowing) without waiting: each
        tells its on_done when done. Returns, per work, None or why it was refused (not queued)."""
        refused: list[Exception | None] = []
        with self._cond:
            for work in works:
                if self._closed:
                    refused.append(Unavailable(f"the {self._role} is shutting down"))
                elif len(self._pending) >= self.config.max_queue:
                    metrics.ADMISSION_REJECTIONS.labels(role=self._role, reason="queue").inc()
                    refused.append(ResourceExhausted(
                        f"{self._role} queue is full ({len(self._pending)} requests waiting, max "
                        f"{self.config.max_queue}); retry later or add {self._role} replicas"))
                else:
                    self._pending.append(work)
                    refused.append(None)
            metrics.QUEUE_DEPTH.labels(role=self._role).set(len(self._pending))
            self._cond.notify()
        return refused

    @property
    def depth(self) -> int:
        """Requests queued or in the forward now."""
        with self._cond:
            return len(self._pending)

    @property
    def step_tokens(self) -> int | None:
        """The most tokens of a whole step that a group's forward runs in one captured shape (a longer step
        is a forward of its own: specpipe.engine.batched.TOKEN_BUCKETS); None where batches are not groups."""
        return TOKEN_BUCKETS[-1] if self._group is not None else None

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
            work.complete(error)

    def _dispatch(self) -> bool:
        """Run the next forward; False once closed."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                for work in self._pending:
                    work.complete(Unavailable(f"the {self._role} is shutting down"))
                return False
            pending = list(self._pending)
        if self._drop_abandoned(pending):
            return True
        steps = [Pending(*w.left(), w.kv.length, w.next_chunk) for w in pending]
        elsewhere = self._decoding_elsewhere(pending)
        full = self._group is not None and sum(not p.chunked for p in steps) >= self._group  # no room for more
        if elsewhere and not self._graced and not full:
            decoding = sum(step_work(p.left, p.past, self._attention) for p in steps if not p.chunked)
            if self._wait_for_rounds_due(pending, decoding + elsewhere):
                return True  # rounds due now join this forward instead of waiting out one
        learned = Learned(self._cost.line(), self._decode_cost.line(), self._chunk_cost.line(), self._chunk_credit_ms,
                          self._attention)
        plan = plan_forward(steps, elsewhere, learned, self.config, self._group)
        self._step([(pending[i], n) for i, n in plan.batch])
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
            work.complete(Cancelled(f"{self._role}: the caller went away; {work.fed} tokens of the step were fed"))
        return True

    def _turnaround(self, work: Work) -> None:
        """A decoding session's next round has started: learn how long it took to come back."""
        last = self._last_steps.get(id(work.kv)) if self._last_steps is not None else None
        if last is not None and not work.current.chunked:
            turnaround_s = max(0.0, work.enqueued - last[1])
            self._turnarounds.append(turnaround_s)
            metrics.VERIFY_TURNAROUND_MS.observe(turnaround_s * 1e3)

    def _steer_chunks(self, batch: list[tuple[Work, int]], works: list[float], forward_ms: float) -> None:
        """Learn the time of forwards of whole steps alone and what a prompt chunk adds to them; size
        the prompt's next chunk by the time this one added (next_chunk), and keep the chunk credit."""
        decode = sum(work for (w, _), work in zip(batch, works) if not w.current.chunked)
        chunks = [(w, n) for w, n in batch if w.current.chunked]
        stall = self.config.prefill_stall
        shape = step_shape([n for w, n in batch if not w.current.chunked])
        if not chunks:
            self._decode_cost.add(decode, forward_ms)
            self._alone_ms.setdefault(shape, Ewma(0.8)).add(forward_ms)
            if decode and stall:
                self._chunk_credit_ms = chunk_credit(self._chunk_credit_ms, stall, forward_ms, 0.0,
                                                     self._whole_chunk_ms())
        elif decode and stall and self._decode_cost.line() is not None:
            alone_ms = self._decode_cost.predict(decode)
            prompt, tokens = chunks[0]
            added_ms = max(0.0, forward_ms - alone_ms)
            if shape in self._alone_ms:  # what the chunks added beside forwards of the same whole steps alone
                self._chunk_cost.add(sum(n for _, n in chunks), max(0.0, forward_ms - self._alone_ms[shape].mean()))
            self._chunk_credit_ms = chunk_credit(self._chunk_credit_ms, stall, alone_ms, added_ms,
                                                 self._whole_chunk_ms())
            prompt.next_chunk = next_chunk(tokens, added_ms, (stall - 1) * alone_ms)

    def _whole_chunk_ms(self) -> float:
        """What a whole prompt chunk adds to a forward, as learned (0 before any was seen)."""
        return self._chunk_cost.predict(self.config.prefill_chunk)

    def _trace_forward(self, batch: list[tuple[Work, int]], launched: float, ended: float, tokens: int) -> None:
        """The forward as a span under each traced request in it (its batch: sessions and tokens)."""
        start_ns, end_ns = wall_ns(launched), wall_ns(ended)
        for work, n in batch:
            if work.trace is not None:
                tracing.start("forward", work.trace, {"specpipe.role": self._role, "specpipe.tokens": n,
                                                      "specpipe.batch.sessions": len(batch),
                                                      "specpipe.batch.tokens": tokens},
                              start_ns=start_ns).end(end_time=end_ns)

    def _step(self, batch: list[tuple[Work, int]]) -> None:
        """Run one forward of the batch and advance its works; complete those that are done. No local
        holds a work past its completion (its caller may free its slot at once): the works' own
        bookkeeping runs in helpers whose frames are gone by then."""
        now = time.perf_counter()
        self._graced = False
        self._start(batch, now)
        finished = self._run_forward(batch, now)
        with self._cond:
            for done in finished:
                self._pending.remove(done)
            metrics.QUEUE_DEPTH.labels(role=self._role).set(len(self._pending))
        batch.clear()
        while finished:
            finished.pop().complete()

    def _start(self, batch: list[tuple[Work, int]], now: float) -> None:
        for work, _ in batch:
            if not work.started:
                work.started = True
                self._turnaround(work)
                metrics.QUEUE_WAIT_MS.labels(role=self._role).observe((now - work.enqueued) * 1e3,
                                                                       tracing.exemplar(work.trace))
                if work.trace is not None:
                    tracing.start("queue", work.trace, {"specpipe.role": self._role},
                                  start_ns=wall_ns(work.enqueued)).end(end_time=wall_ns(now))

    def _run_forward(self, batch: list[tuple[Work, int]], now: float) -> list[Work]:
        """The forward of the batch; the works it finished (or failed)."""
        tokens = sum(n for _, n in batch)
        works = [self._work(work, n) for work, n in batch]
        self._batch_sessions.observe(len(batch))
        self._batch_tokens.observe(tokens)
        try:
            segments = [work.segment(n) for work, n in batch]
            launched = time.perf_counter()
            with cores.forward(self._role), cpu.hop(self._role, "forward"):
                logits = self._forward(segments)
        except Exception as err:  # a bad forward fails its requests, never the scheduler
            for work, _ in batch:
                work.error = err
            return [work for work, _ in batch]
        ended = time.perf_counter()
        forward_ms = (ended - now) * 1e3
        self._forward_seconds.inc(ended - launched)  # the busy share: the forward alone
        self._forwards.inc()
        if tracing.ACTIVE:
            self._trace_forward(batch, launched, ended, tokens)
        self._steer_chunks(batch, works, forward_ms)
        self._cost.add(sum(works), forward_ms)
        finished = []
        for (work, n), rows, done in zip(batch, logits, works):
            step = work.current
            if self._last_steps is not None and not step.chunked:
                self._last_steps[id(work.kv)] = (weakref.ref(work.kv), ended, done)
            work.fed += n
            work.forward_ms += forward_ms
            work.batch_sessions, work.batch_tokens = len(batch), tokens
            if work.fed < len(step.token_ids):
                continue
            try:
                work.advance(rows)
            except Exception as err:  # the request's own error (a stale epoch): it alone fails
                work.error = err
            if work.step is None or work.error is not None:
                finished.append(work)
        return finished


def wall_ns(perf_s: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (a span's timestamps)."""
    return int(perf_s * 1e9) + time.time_ns() - time.perf_counter_ns()


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
        if role == "verifier" and runner.weights in ROUNDED_ACTIVATIONS:  # rounded activations: row-exact attention
            raise FailedPrecondition(f"a {runner.weights.upper()} verifier (--verifier-weights {runner.weights}) runs "
                                     f"batched forwards, whose attention gives a token the same bits alone and in a "
                                     f"draft; this one would run one session per forward ({reason})")
        log.info(f"{role} runs one session per forward", extra={"reason": reason})
        runner.warm_up()
        return None
    forward = service_forward(runner.model, runner.mode, max_context)
    group = SESSION_BUCKETS[-1] if runner.mode == "graphs" else None
    if curve is not None:
        forward = ClockedForward(forward, curve)
        group = curve.group
        log.info(f"{role} forwards held to a cost model", extra={"clock": curve.label})
    return Scheduler(runner.model, config, role, forward, group=group)

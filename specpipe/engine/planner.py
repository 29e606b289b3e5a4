"""The batch scheduler's decisions, as pure functions over what it knows (docs/batching.md, "Gather
policy"): which pending steps the next forward runs and how many tokens of each (plan_forward, over
plan_batch and the prompt-chunk bounds), how long a forward waits for the rounds of sessions between
rounds (the gather grace), and what a step weighs. specpipe.engine.scheduler executes the plans and
reports the forwards' times back (vLLM v1's Scheduler.schedule() beside its model runner).

Prompt chunks beside decode steps are bounded by the time they add (prefill_stall). Where a chunk's
time grows with its tokens (a CPU), each forward takes the chunk that fits its room (stall_chunk_cap,
then next_chunk steered by the measured time). Where a chunk costs about the same whatever its size (a
GPU's captured forwards: a chunk of 32 tokens costs most of one of 256), no chunk fits a forward's room
and cutting chunks only slows the prompt down: whole chunks then run in some forwards only, paid for
by the room the forwards without one leave (chunk_credit, flat_chunk_due), so the decode steps' time
grows by prefill_stall on average.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specpipe.config.services import GATHER_GRACE_SHARE, BatchConfig

GATHER_GRACE_MIN_S, GATHER_GRACE_MAX_S = 0.002, 0.05
# Of recent turnarounds: how long after its round a session is still due back. The longest: a round
# that misses a forward waits a whole one, a wait is at most the grace
# (docs/results/2026-11-25-batching.md, "Over gRPC").
TURNAROUND_QUANTILE = 1.0
TURNAROUND_WINDOW = 256     # turnarounds kept


def plan_batch(pending: Sequence[tuple[bool, int]], max_batch_tokens: int, prefill_chunk: int,
               chunk_cap: int | None = None, group: int | None = None) -> list[tuple[int, int]]:
    """pending: (chunked, tokens left) per request, oldest first. Returns (request index, tokens
    to feed now) for the next forward: whole steps, oldest first, within the budget (the first
    always, even past it) and at most `group` of them (see plan_forward); then chunks of chunked
    steps from what is left, at most chunk_cap tokens of them (see stall_chunk_cap)."""
    plan: list[tuple[int, int]] = []
    budget = max_batch_tokens
    for i, (chunked, left) in enumerate(pending):
        if group is not None and len(plan) >= group:
            break
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


def attention_weight(config: Any) -> float:
    """FLOPs of one query attending to one key over the FLOPs of one token through a layer stack's
    linear layers (a Llama-family config): what a query-key pair weighs against a token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    hidden = config.hidden_size
    per_layer = 2 * hidden * q + 2 * hidden * kv + 3 * hidden * config.intermediate_size
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


CREDIT_FORWARDS = 4  # the chunk credit saved up to: this many forwards' room


def step_shape(step_tokens: Sequence[int]) -> tuple[int, int]:
    """A forward's whole steps as (sessions, tokens of the longest step), each rounded up to a power
    of two: forwards of one shape take about the same time (on a GPU, one captured shape), so what a
    chunk adds is its forward's time less that of its shape's forwards alone."""
    def up(n: int) -> int:
        return 1 << max(0, n - 1).bit_length()

    return up(len(step_tokens)), up(max(step_tokens, default=0))


def chunk_credit(credit_ms: float, stall: float, alone_ms: float, added_ms: float, chunk_ms: float = 0.0) -> float:
    """The chunk credit after a forward of whole steps that alone take alone_ms, to which its prompt
    chunk (if any) added added_ms: each forward's room, (stall - 1) x alone_ms, less what it spent;
    saved up to CREDIT_FORWARDS forwards' room, or to chunk_ms (what a whole chunk adds) where that is
    more: a chunk dearer than a few forwards' room still runs once the credit covers it, instead of
    waiting until no session decodes (with few sessions decoding on a flat curve, the rest starved)."""
    room = (stall - 1.0) * alone_ms
    return min(max(CREDIT_FORWARDS * room, chunk_ms), credit_ms + room - added_ms)


def flat_chunk_due(credit_ms: float, chunk_fit: tuple[float, float] | None, room_ms: float,
                   tokens: int) -> bool | None:
    """Where a chunk's fixed time alone (chunk_fit: time added = a + b x tokens) exceeds a forward's
    room: whether a whole chunk of `tokens` runs now (the credit covers it). None where chunks are cut
    to each forward's room instead (their time grows with their tokens, or nothing is known yet)."""
    if chunk_fit is None or chunk_fit[0] < room_ms:
        return None
    return credit_ms >= chunk_fit[0] + chunk_fit[1] * tokens


@dataclass(frozen=True)
class Pending:
    """A request's current step, as the planner sees it."""

    chunked: bool   # a prompt: may enter over several forwards
    left: int       # tokens of the step not fed yet
    past: int       # positions its slot holds
    steered: int = 0  # a prompt's: tokens of its next chunk beside whole steps (next_chunk; 0: not steered yet)


@dataclass(frozen=True)
class Learned:
    """What the scheduler has measured, as the planner reads it."""

    forward: tuple[float, float] | None = None  # forward ms = a + b x work (every forward)
    decode: tuple[float, float] | None = None   # ... of forwards of whole steps alone
    chunk: tuple[float, float] | None = None    # ms a prompt chunk of n tokens adds beside whole steps
    credit_ms: float = 0.0                      # chunk_credit
    attention: float = 0.0                      # attention_weight of the model


@dataclass(frozen=True)
class ForwardPlan:
    batch: tuple[tuple[int, int], ...]  # (pending index, tokens to feed now), in pending order
    chunk_cap: int | None               # prompt tokens the forward may feed beside whole steps (None: the budget's)


def plan_forward(pending: Sequence[Pending], decoding_elsewhere: float, learned: Learned,
                 config: BatchConfig, group: int | None = None) -> ForwardPlan:
    """The next forward: whole steps within the token budget, prompt chunks bounded by the time they
    may add beside the decoding sessions' steps (pending, or between rounds: decoding_elsewhere).
    group: where the forward runs whole steps in groups of this many sessions, one after another
    (the graphs mode's largest captured batch), it takes one group: the next group's forward then
    runs while the first group's sessions turn their rounds around, at no cost to either."""
    decoding = sum(step_work(p.left, p.past, learned.attention) for p in pending if not p.chunked)
    decoding = decoding or decoding_elsewhere
    prompt = next((p for p in pending if p.chunked), None)
    cap = None
    if decoding and config.prefill_stall and prompt is not None:
        room = (config.prefill_stall - 1.0) * _predict(learned.decode, decoding)
        due = flat_chunk_due(learned.credit_ms, learned.chunk, room, min(prompt.left, config.prefill_chunk))
        if due is not None:
            cap = config.prefill_chunk if due else 0
        elif prompt.steered:
            cap = prompt.steered  # steered by the time its last chunk added
        else:
            cap = stall_chunk_cap(decoding, learned.forward, config.prefill_stall, prompt.past, learned.attention)
    batch = plan_batch([(p.chunked, p.left) for p in pending], config.max_batch_tokens, config.prefill_chunk, cap,
                       group)
    return ForwardPlan(tuple(batch), cap)


def _predict(fit: tuple[float, float] | None, x: float) -> float:
    return 0.0 if fit is None else max(0.0, fit[0] + fit[1] * x)

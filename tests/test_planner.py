"""The batch scheduler's plan (specpipe.engine.planner) on literal inputs: whole steps first, prompt
chunks cut to a forward's room where their time grows with their tokens, and spread whole where it
does not (a GPU's captured forwards), paid for by the forwards without one."""

from __future__ import annotations

import math

import pytest

from specpipe.config.services import BatchConfig
from specpipe.engine.planner import (
    CREDIT_FORWARDS,
    Learned,
    Pending,
    chunk_credit,
    flat_chunk_due,
    plan_forward,
    step_shape,
)

CONFIG = BatchConfig(max_batch_tokens=512, prefill_chunk=256, prefill_stall=1.5)
DECODE = [Pending(False, 1, 300), Pending(False, 1, 400)]
PROMPT = Pending(True, 400, 0)


def test_the_chunk_credit_saves_each_forwards_room_and_pays_the_chunks():
    assert chunk_credit(0.0, 1.5, 8.0, 0.0) == 4.0
    assert chunk_credit(4.0, 1.5, 8.0, 12.0) == -4.0                 # a whole chunk spends more than one room
    assert chunk_credit(100.0, 1.5, 8.0, 0.0) == CREDIT_FORWARDS * 4.0  # saved up to a few forwards' room
    assert chunk_credit(100.0, 1.5, 8.0, 0.0, 30.0) == 30.0               # ... or up to a whole chunk


def test_a_chunk_dearer_than_a_few_forwards_room_runs_once_the_credit_covers_it():
    """Few sessions decoding on a flat curve: a forward's room is small beside a whole chunk. Saved up
    to a few forwards' room only, the credit never covered the chunk, and every prompt waited until no
    session decoded (at 64 streams on the H200 curve, 4 sessions decoded while 60 prompts waited)."""
    fit, alone_ms = (10.0, 0.03), 5.0
    whole_chunk_ms = fit[0] + fit[1] * 256
    room_ms = 0.5 * alone_ms
    assert CREDIT_FORWARDS * room_ms < whole_chunk_ms
    credit, forwards = 0.0, 0
    while not flat_chunk_due(credit, fit, room_ms, 256):
        credit = chunk_credit(credit, 1.5, alone_ms, 0.0, whole_chunk_ms)
        forwards += 1
        assert forwards < 100
    assert forwards == math.ceil(whole_chunk_ms / room_ms)
    credit = chunk_credit(credit, 1.5, alone_ms, whole_chunk_ms, whole_chunk_ms)  # the chunk runs: it pays
    assert credit == pytest.approx(room_ms)


@pytest.mark.parametrize("credit,fit,due", [
    (0.0, None, None),             # nothing known: cut to the room
    (0.0, (1.0, 0.05), None),      # time grows with tokens (fixed part under the room): cut to the room
    (0.0, (4.6, 0.03), False),     # flat: a chunk's fixed time alone exceeds the room; no credit yet
    (12.0, (4.6, 0.03), False),    # the credit short of a whole chunk (4.6 + 0.03 x 256 = 12.28)
    (12.3, (4.6, 0.03), True),     # ... and covering it
])
def test_a_flat_chunk_runs_whole_once_the_credit_covers_it(credit, fit, due):
    assert flat_chunk_due(credit, fit, 4.0, 256) is due


def test_plan_forward_cuts_chunks_to_the_room_where_their_time_grows():
    learned = Learned(forward=(10.0, 1.0), decode=(10.0, 1.0), attention=0.0)
    plan = plan_forward([*DECODE, PROMPT], 0.0, learned, CONFIG)
    assert plan.batch == ((0, 1), (1, 1), (2, plan.chunk_cap)) and 1 <= plan.chunk_cap < 256
    steered = plan_forward([*DECODE, Pending(True, 400, 0, steered=17)], 0.0, learned, CONFIG)
    assert steered.batch[-1] == (2, 17)
    alone = plan_forward([PROMPT], 0.0, learned, CONFIG)  # nobody decodes: a whole chunk
    assert alone.batch == ((0, 256),) and alone.chunk_cap is None


def test_plan_forward_spreads_whole_chunks_where_their_time_is_flat():
    flat = Learned(forward=(8.0, 0.0), decode=(8.0, 0.01), chunk=(4.6, 0.03), credit_ms=2.0)
    held = plan_forward([*DECODE, PROMPT], 0.0, flat, CONFIG)
    assert held.batch == ((0, 1), (1, 1)) and held.chunk_cap == 0  # no credit yet: the decode steps alone
    paid = plan_forward([*DECODE, PROMPT], 0.0, Learned(**{**flat.__dict__, "credit_ms": 13.0}), CONFIG)
    assert paid.batch == ((0, 1), (1, 1), (2, 256))  # a whole chunk, not a sliver
    between = plan_forward([PROMPT], 10.0, flat, CONFIG)  # sessions between rounds, the prompt alone pending
    assert between.batch == ((0, 256),)  # never idle with work pending


def test_a_forward_that_runs_groups_one_after_another_takes_one_group():
    """The graphs mode (and a cost model's curve) runs 64 sessions as two forwards of 32: one group a
    forward, so the first group's sessions turn their rounds around while the second's runs."""
    decoding = [Pending(False, 1, 100 + i) for i in range(5)]
    learned = Learned(forward=(10.0, 1.0), decode=(10.0, 1.0))
    assert plan_forward([*decoding, PROMPT], 0.0, learned, CONFIG, group=2).batch[:2] == ((0, 1), (1, 1))
    assert len(plan_forward(decoding, 0.0, learned, CONFIG, group=2).batch) == 2
    assert len(plan_forward(decoding, 0.0, learned, CONFIG).batch) == 5  # a forward that takes any batch at once


def test_a_forwards_step_shape_rounds_its_sessions_and_tokens_up_to_powers_of_two():
    assert step_shape([1] * 32) == (32, 1)
    assert step_shape([1] * 33) == (64, 1)
    assert step_shape([3, 1, 1]) == (4, 4)

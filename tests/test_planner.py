"""The batch scheduler's plan (specpipe.engine.planner) on literal inputs: whole steps first, prompt
chunks cut to a forward's room where their time grows with their tokens, and spread whole where it
does not (a GPU's captured forwards), paid for by the forwards without one."""

from __future__ import annotations

import pytest

from specpipe.config.services import BatchConfig
from specpipe.engine.planner import (
    CREDIT_FORWARDS,
    Learned,
    Pending,
    chunk_credit,
    flat_chunk_due,
    plan_forward,
)

CONFIG = BatchConfig(max_batch_tokens=512, prefill_chunk=256, prefill_stall=1.5)
DECODE = [Pending(False, 1, 300), Pending(False, 1, 400)]
PROMPT = Pending(True, 400, 0)


def test_the_chunk_credit_saves_each_forwards_room_and_pays_the_chunks():
    assert chunk_credit(0.0, 1.5, 8.0, 0.0) == 4.0
    assert chunk_credit(4.0, 1.5, 8.0, 12.0) == -4.0                 # a whole chunk spends more than one room
    assert chunk_credit(100.0, 1.5, 8.0, 0.0) == CREDIT_FORWARDS * 4.0  # saved up to a few forwards' room


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

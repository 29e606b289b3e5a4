"""Batched verification (docs/batching.md): the gather policy, batch invariance of the batched
forward, and golden tests of many concurrent sessions (tiny preset): every output == verifier-only
greedy generate(), with sessions that join and leave mid-batch and a long prompt prefilling in
chunks while others decode, embedded and over gRPC. Admission refuses before any forward."""

from __future__ import annotations

import gc
import random
import threading
import time

import pytest
import torch

from cache_service.memory import InMemoryNgramCache
from drafter_service.hybrid import HybridDrafter
from drafter_service.ngram_drafter import NgramDrafter
from orchestrator.generator import Generator
from specpipe.config.presets import ModelSpec
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from specpipe.core.types import Draft, GenerationRequest, SamplingParams, SpeculationOptions
from specpipe.engine.batched import Segment, batched_forward
from specpipe.engine.kv import new_slot
from specpipe.engine.models import model_info, tiny_model
from specpipe.engine.planner import (
    DECODING_RECENT_S,
    GATHER_GRACE_MAX_S,
    GATHER_GRACE_MIN_S,
    MIN_CHUNK,
    attention_weight,
    decoding_work,
    due_back_until,
    due_within_s,
    gather_grace_s,
    next_chunk,
    plan_batch,
    stall_chunk_cap,
    step_work,
)
from specpipe.engine.scheduler import Scheduler, Step, Work, one_step
from specpipe.runtime import metrics
from tests.golden import reference_greedy, run
from verifier_service.verifier import ModelVerifier

MAX_NEW_TOKENS = 32


@pytest.mark.parametrize("pending, budget, chunk, expected", [
    ([], 64, 16, []),
    ([(False, 5)], 64, 16, [(0, 5)]),                                    # a lone round goes at once
    ([(False, 5), (False, 9), (False, 3)], 64, 16, [(0, 5), (1, 9), (2, 3)]),
    ([(False, 50), (False, 20), (False, 10)], 64, 16, [(0, 50), (2, 10)]),  # the budget skips what does not fit
    ([(False, 100), (False, 5)], 64, 16, [(0, 100)]),                    # a round past the budget runs alone
    ([(True, 1000)], 64, 16, [(0, 16)]),                                 # a prompt enters in chunks
    ([(True, 1000), (False, 5), (True, 7)], 64, 16, [(1, 5), (0, 16), (2, 7)]),  # rounds first, then chunks
    ([(True, 100), (False, 60)], 64, 16, [(1, 60), (0, 4)]),             # chunks fill what rounds leave
    ([(False, 64), (True, 100)], 64, 16, [(0, 64)]),
])
def test_plan_batch(pending, budget, chunk, expected):
    assert plan_batch(pending, budget, chunk) == expected


def test_plan_batch_takes_one_group_of_whole_steps():
    pending = [(False, 1)] * 3 + [(True, 40)]
    assert plan_batch(pending, 64, 16, group=2) == [(0, 1), (1, 1), (3, 16)]  # the chunk beside the group
    assert plan_batch(pending, 64, 16) == [(0, 1), (1, 1), (2, 1), (3, 16)]


def test_a_scheduler_in_groups_runs_a_group_a_forward_and_does_not_wait_once_one_is_full(monkeypatch):
    """group=2 (a forward that runs larger batches two sessions at a time): three rounds submitted
    together take two forwards, the first of two sessions; a forward with a whole group pending starts
    without waiting for the rounds of the sessions between rounds (it could not take them)."""
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig(gather_grace=1.0), group=2)
    try:
        slots = [new_slot(model, 2048) for _ in range(4)]
        for kv in slots:
            scheduler.run(Work(kv, one_step(Step((5, 6, 7), logit_rows=1))))  # four sessions decoding
        waited = []
        original = scheduler._wait_for_rounds_due
        monkeypatch.setattr(scheduler, "_wait_for_rounds_due",
                            lambda pending, work: waited.append(len(pending)) or original(pending, work))
        works = [Work(kv, one_step(Step((8,), logit_rows=1))) for kv in slots[:3]]
        assert scheduler.submit(works) == [None, None, None]  # queued together: the scheduler sees all three
        for work in works:
            assert work.done.wait(10)
        assert [w.batch_sessions for w in works] == [2, 2, 1]
        assert 3 not in waited  # the full group went at once; the lone third may wait for its mates
    finally:
        scheduler.close()


def test_prompt_chunks_beside_decode_steps_are_bounded_by_time():
    # T(n) = 100 + 5 n ms: 3 decode tokens take 115 ms; 1.5x that leaves 57.5 ms, 11 prompt tokens
    assert stall_chunk_cap(3, (100.0, 5.0), 1.5) == 11
    assert stall_chunk_cap(3, (100.0, 500.0), 1.5) == MIN_CHUNK  # a prompt always advances
    assert stall_chunk_cap(0, (100.0, 5.0), 1.5) is None and stall_chunk_cap(3, None, 1.5) is None
    assert stall_chunk_cap(3, (100.0, 0.0), 1.5) is None       # no per-token cost known yet
    assert stall_chunk_cap(3, (100.0, 5.0), 0) is None         # off
    assert plan_batch([(True, 4000), (False, 3)], 512, 256, 11) == [(1, 3), (0, 11)]
    assert plan_batch([(True, 4000)], 512, 256, 11) == [(0, 11)]   # alone, while others decode between rounds
    assert plan_batch([(True, 4000)], 512, 256) == [(0, 256)]      # alone: the whole chunk
    assert stall_chunk_cap(3, (-500.0, 2.6), 1.5, 10, 0.05) == MIN_CHUNK  # a fit with a < 0 (sqrt of < 0 before)


def test_the_next_chunk_follows_the_time_the_last_one_added():
    assert next_chunk(8, added_ms=40.0, room_ms=20.0) == 4   # twice the room: half the tokens
    assert next_chunk(8, added_ms=10.0, room_ms=15.0) == 12
    assert next_chunk(8, added_ms=400.0, room_ms=20.0) == 4  # at most halved
    assert next_chunk(8, added_ms=1.0, room_ms=20.0) == 16   # at most doubled
    assert next_chunk(8, added_ms=0.0, room_ms=20.0) == 16   # it added nothing measurable
    assert next_chunk(1, added_ms=50.0, room_ms=20.0) == MIN_CHUNK  # deep in a prompt: a prompt still advances


def test_a_forward_of_rounds_and_a_chunk_sizes_the_prompts_next_chunk():
    """Forwards of rounds alone teach their time; one with a chunk beside them sets the chunk's successor."""
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig(prefill_stall=1.5))
    try:
        rounds = Work(new_slot(model, 2048), one_step(Step((5,), logit_rows=1)))
        prompt = Work(new_slot(model, 2048), one_step(Step(tuple(range(1, 200)), chunked=True)))
        scheduler._steer_chunks([(prompt, 8)], [8.0], forward_ms=99.0)  # a chunk alone: no rounds to time it by
        assert prompt.next_chunk == 0 and scheduler._decode_cost.line() is None
        scheduler._steer_chunks([(rounds, 1)], [1.0], forward_ms=10.0)
        scheduler._steer_chunks([(rounds, 1), (prompt, 8)], [1.0, 8.0], forward_ms=30.0)
        assert prompt.next_chunk == 4  # it added 20 ms where 1.5x allows 5: halved (at most)
        scheduler._steer_chunks([(rounds, 1), (prompt, 4)], [1.0, 4.0], forward_ms=14.0)
        assert prompt.next_chunk == 5  # 4 ms added, 5 allowed
    finally:
        scheduler.close()


def test_sessions_decode_while_their_last_round_is_recent():
    now = 100.0
    assert decoding_work([(now - 0.1, 3.0), (now - DECODING_RECENT_S - 0.1, 5.0), (now, 9.5)], now) == 12.5
    assert decoding_work([], now) == 0


def test_a_forward_waits_for_decoding_sessions_a_share_of_its_time():
    assert gather_grace_s(60.0) == pytest.approx(0.03)               # half of a 60 ms forward
    assert gather_grace_s(200.0, 0.05) == pytest.approx(0.01)
    assert gather_grace_s(0.0) == GATHER_GRACE_MIN_S                  # not timed yet, or a tiny model
    assert gather_grace_s(5000.0) == GATHER_GRACE_MAX_S
    assert gather_grace_s(200.0, 0) == 0                              # off
    with pytest.raises(InvalidArgument, match="gather_grace"):
        BatchConfig(gather_grace=1.5)


def test_a_forward_waits_only_for_the_sessions_due_back():
    """A session is due back within the longest of recent turnarounds after its round: the wait
    ends when the last of those would be late, not at the grace."""
    assert due_within_s([]) == DECODING_RECENT_S                     # none seen yet: every decoding session
    turnarounds = [i / 1000 for i in range(1, 101)]                  # 1 .. 100 ms
    assert due_within_s(turnarounds) == pytest.approx(0.100)
    assert due_within_s(turnarounds, 0.95) == pytest.approx(0.096)
    assert due_within_s(turnarounds, 0.5) == pytest.approx(0.051)
    now = 100.0
    between = [(now - 0.004, 1.0), (now - 0.001, 1.0), (now - 0.030, 1.0)]  # (round ended at, work)
    assert due_back_until(between, now, 0.010) == pytest.approx(now + 0.009)  # the third is late: drafting or gone
    assert due_back_until(between, now, 0.0005) == 0                 # all late: no wait
    assert due_back_until([], now, 0.010) == 0


def test_sessions_decoding_together_share_forwards():
    """Two sessions that each come back a little after their round (the orchestrator's turn) would
    alternate, one forward each, if the verifier dispatched on the first: the grace keeps them together."""
    model = tiny_model()
    shared = {}
    for grace in (0.0, 1.0):
        scheduler = Scheduler(model, BatchConfig(gather_grace=grace))
        try:
            slots = [new_slot(model, 2048) for _ in range(2)]
            for kv in slots:
                scheduler.run(Work(kv, one_step(Step((5, 6, 7), logit_rows=1))))
            forwards = []

            def decode(kv, delay_s):
                for _ in range(20):
                    time.sleep(delay_s)  # the reply's way back, and the next round's
                    forwards.append(scheduler.run(Work(kv, one_step(Step((8,), logit_rows=1)))).batch_sessions)

            threads = [threading.Thread(target=decode, args=(kv, d)) for kv, d in zip(slots, (0.0005, 0.001))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            shared[grace] = sum(n == 2 for n in forwards) / len(forwards)
        finally:
            scheduler.close()
    assert shared[1.0] >= 0.8 and shared[1.0] > shared[0.0], shared


def test_a_failure_to_plan_a_forward_fails_the_requests_and_the_scheduler_goes_on(monkeypatch):
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig())
    try:
        kv = new_slot(model, 2048)
        with monkeypatch.context() as patch:
            patch.setattr(scheduler, "_decoding_elsewhere", lambda pending: 1 / 0)
            with pytest.raises(RuntimeError, match="could not plan a forward"):
                scheduler.run(Work(kv, one_step(Step((5, 6, 7), logit_rows=1))))
        assert scheduler.run(Work(kv, one_step(Step((5, 6, 7), logit_rows=1)))).batch_sessions == 1
    finally:
        scheduler.close()


def test_chunks_deep_into_a_long_prompt_are_smaller():
    """Attention makes a chunk at position 4000 cost more than its tokens: the bound takes fewer of them."""
    from transformers import LlamaConfig

    smollm2 = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    assert attention_weight(smollm2) == pytest.approx(2 * 576 / (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536))
    assert step_work(4, 100, 0.0) == 4
    assert step_work(4, 100, 0.01) == pytest.approx(4 + 0.01 * 4 * 102.5)
    fit, attention = (60.0, 2.6), 3.3e-4
    at_start = stall_chunk_cap(3, fit, 1.5, 0, attention)
    deep = stall_chunk_cap(3, fit, 1.5, 1000, attention)
    assert at_start == stall_chunk_cap(3, fit, 1.5) == 13 and MIN_CHUNK <= deep < at_start
    assert step_work(deep, 1000, attention) <= (1.5 - 1) * (60 + 2.6 * 3) / 2.6 < step_work(deep + 1, 1000, attention)


def test_a_slot_counts_as_decoding_after_a_round_until_it_is_released():
    """The verifier bounds lone prompt chunks by the rounds of sessions between rounds; a released
    slot (its session gone) drops out of that."""
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig())
    try:
        kv = new_slot(model, 2048)
        scheduler.run(Work(kv, one_step(Step((5, 6, 7), chunked=True))))
        assert scheduler._decoding_elsewhere([]) == 0  # a prompt alone is not decoding
        scheduler.run(Work(kv, one_step(Step((8, 9), logit_rows=2))))
        assert scheduler._decoding_elsewhere([]) == pytest.approx(step_work(2, 3, scheduler._attention))
        assert (
            scheduler._decoding_elsewhere([Work(kv, one_step(Step((1,), logit_rows=1)))]) == 0
        )  # its round is pending
        del kv
        gc.collect()
        assert scheduler._decoding_elsewhere([]) == 0
    finally:
        scheduler.close()


def _chain(kv, token_ids) -> Segment:
    n = len(token_ids)
    return Segment(
        kv,
        tuple(token_ids),
        torch.arange(kv.length, kv.length + n),
        torch.ones(n, n, dtype=torch.bool).tril(),
        logit_rows=n,
    )


def test_a_linear_layer_computes_a_row_the_same_among_any_number_of_rows_from_min_gemm_rows():
    """What the padding of the eager forward relies on (specpipe.engine.batched): MKL's fp32 GEMM, in its strict
    mode (specpipe/__init__.py), gives a row the same bits among MIN_GEMM_ROWS to 64 rows. Without strict
    mode rows differed from 6 or 16 rows on a Xeon; on an AMD EPYC rows differ below 4 rows only."""
    from specpipe.engine.batched import MIN_GEMM_ROWS

    torch.manual_seed(0)
    for in_features, out_features in ((64, 128), (128, 64), (576, 1536), (1536, 576)):
        linear, x = torch.nn.Linear(in_features, out_features), torch.randn(64, in_features)
        with torch.inference_mode():
            rows = linear(x)
            assert all(torch.equal(linear(x[:m]), rows[:m]) for m in range(MIN_GEMM_ROWS, 64)), (
                in_features, out_features)


@pytest.mark.parametrize("mode", ["eager", "packed", "packed bf16", "packed int8", "packed w8a8", "packed w4a8"])
def test_batched_forward_is_batch_invariant_and_matches_transformers(mode):
    """A session's logits alone == among batch mates, bit for bit, and == transformers' forward of the
    same model (packed: with its weights packed in fp32, bf16, int8, W8A8 or W4A8, each a model of its own)."""
    model = tiny_model()
    if mode != "eager":
        from specpipe.engine import native
        from specpipe.engine.runner import PACKED_WEIGHTS

        native.pack_linears(model, PACKED_WEIGHTS[(mode.split()[1:] or ["fp32"])[0]])
    ids = list(range(10, 70))
    with torch.inference_mode():
        reference = model(torch.tensor([ids])).logits[0]  # [60, vocab]
    alone, mate_a, mate_b, batched = (new_slot(model, 2048) for _ in range(4))
    first = batched_forward(model, [_chain(alone, ids[:25])])[0]
    rest = batched_forward(model, [_chain(alone, ids[25:])])[0]
    batched_forward(model, [_chain(mate_a, ids[3:40])])
    with_mates = batched_forward(model, [_chain(mate_a, ids[40:47]), _chain(batched, ids[:25]),
                                         _chain(mate_b, ids[:9])])[1]
    torch.testing.assert_close(torch.cat([first, rest]), reference, atol=1e-4, rtol=1e-4)
    assert torch.equal(first, with_mates)  # bitwise: batch mates change nothing


def _wide_model() -> torch.nn.Module:
    """A random 2-layer Qwen2 whose q projection (192 columns) fills whole packed panels on every
    CPU (P = 16, 32 or 48): its q and k columns are adjacent in the grouped GEMM's output."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=257, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("make", [tiny_model, _wide_model], ids=["tiny", "wide"])
def test_grouped_projections_change_no_bit(make):
    """The packed forward's grouped projections (one GEMM for q/k/v, one for gate and up; q and k
    rotated as one where their columns are adjacent, as in the wide model) give the logits and the
    KV cache of the layers run one by one: chains and a tree."""
    from specpipe.core.verification import tree_allowed, tree_position_ids
    from specpipe.engine import native

    grouped, ungrouped = make(), make()
    native.pack_linears(grouped)
    qkv = grouped.model.layers[0].self_attn.packed_qkv
    assert qkv.starts[1] == qkv.out_features[0] or make is not _wide_model  # the joined rotation runs
    native.pack_linears(ungrouped)
    for module in ungrouped.modules():
        for attribute in ("packed_qkv", "packed_gate_up"):
            module.__dict__.pop(attribute, None)
    parents = [-1, 0, -1, 2, 3]
    outputs = []
    for model in (grouped, ungrouped):
        kv = new_slot(model, 256)
        prompt = batched_forward(model, [_chain(kv, list(range(5, 45)))])[0]
        step = batched_forward(model, [_chain(kv, [7])])[0]
        tree = batched_forward(model, [Segment(kv, (9, 10, 11, 12, 13, 14), tree_position_ids(parents, kv.length)[0],
                                               tree_allowed(parents, 0), logit_rows=6)])[0]
        outputs.append((prompt, step, tree, kv.keys[:, :, :kv.length], kv.values[:, :, :kv.length]))
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


def test_the_lean_rope_and_norm_give_transformers_bits():
    """rotate (q and k at once, four ops) and rms_norm (no casts, two ops in place) give the bits of
    transformers' RoPE (q * cos + rotate_half(q) * sin, its apply_rotary_pos_emb) and RMSNorm, at any
    position, for q and k alike."""
    from transformers.models.llama.modeling_llama import rotate_half

    from specpipe.engine.batched import rms_norm, rope_tables, rotate

    model = tiny_model()
    inner, head_dim = model.model, model.config.hidden_size // model.config.num_attention_heads
    torch.manual_seed(0)
    positions = torch.tensor([0, 1, 2, 7, 300, 4095])
    x = torch.randn(len(positions), model.config.hidden_size) * 3
    q, k = torch.randn(1, 4, len(positions), head_dim), torch.randn(1, 2, len(positions), head_dim)
    with torch.inference_mode():
        cos, sin = inner.rotary_emb(x[None], positions[None])  # [1, R, head_dim]
        q_ref, k_ref = ((t * cos[:, None]) + (rotate_half(t) * sin[:, None]) for t in (q, k))
        tables = rope_tables(cos[0], sin[0])
        qk = rotate(torch.cat([q[0], k[0]]).transpose(0, 1), *tables)  # [R, heads + kv_heads, head_dim]
        assert torch.equal(qk[:, :4].transpose(0, 1), q_ref[0]) and torch.equal(qk[:, 4:].transpose(0, 1), k_ref[0])
        for norm in (inner.layers[0].input_layernorm, inner.norm):
            norm.weight.copy_(torch.randn_like(norm.weight))
            assert torch.equal(rms_norm(norm, x), norm(x))


def test_the_additive_mask_gives_the_boolean_masks_bits():
    """batched_forward hands attention the additive mask (0, -inf) that scaled_dot_product_attention
    makes of a boolean one in every layer, made once a forward instead: the same output, bit for bit."""
    import torch.nn.functional as F

    from specpipe.core.verification import tree_allowed
    from specpipe.engine.batched import _allowed

    torch.manual_seed(0)
    kv = new_slot(tiny_model(), 256)
    kv.length = 30
    segment = Segment(kv, (1, 2, 3, 4, 5), torch.arange(30, 35), tree_allowed([-1, 0, -1, 2], 0), logit_rows=5)
    additive = _allowed(segment, 2, torch.float32, torch.device("cpu"))
    boolean = additive == 0
    q, k, v = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 35, 16), torch.randn(1, 2, 35, 16)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=additive),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=boolean))


def test_batch_graphs_match_the_batched_forward():
    """The graphs mode's padded batches (specpipe.engine.batched.BatchGraphs, run here without capture) give
    each session the logits and the KV of the ragged batched forward: chains and a tree, sessions of
    different lengths, a batch between two buckets, a prompt chunk beside them (a forward of its own);
    a chunk past the largest bucket falls back to the batched forward."""
    from specpipe.core.verification import tree_allowed, tree_position_ids
    from specpipe.engine.batched import BatchGraphs

    model = tiny_model()
    graphs = BatchGraphs(model, max_context=256, sessions=(1, 2, 4), tokens=(1, 4, 8), chunks=(32,))
    graphs.warm_up()
    pairs = [(new_slot(model, 256), new_slot(model, 256)) for _ in range(4)]
    for (ragged, padded), n in zip(pairs, (30, 7, 52, 3)):  # prompts: 52 tokens go through batched_forward
        prompt = list(range(5, 5 + n))
        batched_forward(model, [_chain(ragged, prompt)])
        graphs.forward([_chain(padded, prompt)])
    parents = [-1, 0, -1, 2]  # [root] + a tree of two branches
    tree = lambda kv: Segment(kv, (9, 10, 11, 12, 13), tree_position_ids(parents, kv.length)[0],  # noqa: E731
                              tree_allowed(parents, 0), logit_rows=5)
    steps = [lambda kv: _chain(kv, [3]), tree, lambda kv: _chain(kv, [4, 5, 6]),  # 3 steps: the 4-session bucket
             lambda kv: Segment(kv, tuple(range(40, 60)), torch.arange(kv.length, kv.length + 20),  # a chunk
                                torch.ones(20, 20, dtype=torch.bool).tril(), logit_rows=0)]
    expected = batched_forward(model, [step(ragged) for step, (ragged, _) in zip(steps, pairs)])
    got = graphs.forward([step(padded) for step, (_, padded) in zip(steps, pairs)])
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    for ragged, padded in pairs:
        assert ragged.length == padded.length
        torch.testing.assert_close(padded.keys[:, :, :padded.length], ragged.keys[:, :, :ragged.length],
                                   atol=1e-4, rtol=1e-4)


def _verifier(**batch) -> ModelVerifier:
    model = tiny_model()
    return ModelVerifier(model, model_info(ModelSpec("tiny"), model), batch=BatchConfig(**batch))


def _prompts(count: int, seed: int = 7) -> list[tuple[int, ...]]:
    """Different lengths; the first one long (it prefills in many chunks)."""
    rng = random.Random(seed)
    lengths = [400] + [rng.randint(3, 60) for _ in range(count - 1)]
    return [tuple(rng.randrange(256) for _ in range(n)) for n in lengths]


def _concurrently(jobs) -> list:
    """Run the callables on their own threads, each starting a little after the previous (sessions
    join and leave mid-batch); returns their results or raises the first error."""
    results, errors = [None] * len(jobs), []

    def run_one(i, job):
        try:
            results[i] = job()
        except BaseException as err:  # noqa: BLE001  (re-raised below)
            errors.append(err)

    threads = [threading.Thread(target=run_one, args=(i, job)) for i, job in enumerate(jobs)]
    for i, thread in enumerate(threads):
        thread.start()
        threads[i - 1].join(timeout=0.02) if i else None
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _forwards() -> tuple[float, float]:
    """(forwards, sessions over all forwards) so far, from the batch histogram."""
    samples = {s.name: s.value for s in metrics.VERIFY_BATCH_SESSIONS.collect()[0].samples}
    return samples["specpipe_verify_batch_sessions_count"], samples["specpipe_verify_batch_sessions_sum"]


SPECULATIONS = [SpeculationOptions(drafter=drafter, draft_len=k, width=width, schedule=schedule, adaptive="off")
                for drafter, k, width, schedule in [
                    ("model", 4, 1, "sequential"), ("model", 3, 2, "branch"), ("ngram", 4, 1, "sequential"),
                    ("hybrid", 4, 2, "sequential"), ("model", 5, 1, "branch"), ("none", 1, 1, "sequential"),
                    ("ngram", 3, 1, "branch"), ("model", 2, 3, "sequential")]]


def test_concurrent_sessions_equal_verifier_greedy_embedded(tiny_tokenizer, tiny_drafter):
    verifier = _verifier(max_batch_tokens=96, prefill_chunk=32)
    store = InMemoryNgramCache()
    ngram = NgramDrafter(store, verifier.info())
    generator = Generator(tiny_tokenizer, verifier, {"model": tiny_drafter, "ngram": ngram,
                                                     "hybrid": HybridDrafter(tiny_drafter, ngram)}, cache=store)
    prompts = _prompts(12)
    lengths = [MAX_NEW_TOKENS - 4 * (i % 3) for i in range(len(prompts))]  # they leave at different rounds
    expected = [reference_greedy(verifier.model, ids, n) for ids, n in zip(prompts, lengths)]
    before = _forwards()
    outputs = _concurrently([
        lambda ids=ids, n=n, spec=SPECULATIONS[i % len(SPECULATIONS)]:
            run(generator, GenerationRequest(ids, n, speculation=spec))[0]
        for i, (ids, n) in enumerate(zip(prompts, lengths))])
    after = _forwards()
    for i, (output, reference) in enumerate(zip(outputs, expected)):
        assert output == reference, f"session {i} ({SPECULATIONS[i % len(SPECULATIONS)]})"
    assert after[1] - before[1] > after[0] - before[0], "no forward ran more than one session"


def test_sampled_output_is_the_same_with_and_without_batch_mates(tiny_tokenizer, tiny_drafter):
    verifier = _verifier()
    generator = Generator(tiny_tokenizer, verifier, {"model": tiny_drafter})
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    prompts = _prompts(6, seed=3)[1:]
    fixed = SpeculationOptions(
        drafter="model", draft_len=4, adaptive="off"
    )  # adaptive k follows timings: not repeatable from the seed
    requests = [GenerationRequest(ids, MAX_NEW_TOKENS, sampling=sampling, speculation=fixed) for ids in prompts]
    alone = run(generator, requests[0])[0]
    together = _concurrently([lambda r=r: run(generator, r)[0] for r in requests])
    assert together[0] == alone


def test_concurrent_streams_equal_verifier_greedy_over_grpc():
    from tests.grpc_harness import shared_tiny_cluster

    cluster = shared_tiny_cluster()
    prompts = _prompts(8, seed=5)
    expected = [reference_greedy(cluster.verifier.model, ids, MAX_NEW_TOKENS) for ids in prompts]
    speculations = [
        SpeculationOptions(
            drafter="model", draft_len=4, width=1 + i % 2, schedule=("sequential", "branch")[i % 2], adaptive="off"
        )
        for i in range(len(prompts))
    ]

    def stream(ids, speculation):
        return [t for chunk in cluster.generation_client.generate(token_ids=ids, max_new_tokens=MAX_NEW_TOKENS,
                                                                  speculation=speculation) for t in chunk.token_ids]

    first_tokens = metrics.TTFT_MS.collect()[0].samples
    ttft_before = next(s.value for s in first_tokens if s.name.endswith("_count"))
    outputs = _concurrently([lambda ids=ids, s=s: stream(ids, s) for ids, s in zip(prompts, speculations)])
    assert outputs == expected
    ttft_after = next(s.value for s in metrics.TTFT_MS.collect()[0].samples if s.name.endswith("_count"))
    assert ttft_after - ttft_before == len(prompts)  # one time-to-first-token per stream


def test_max_sessions_refuses_before_any_forward():
    verifier = _verifier()
    verifier_max = ModelVerifier(verifier.model, verifier.info(), max_sessions=2)
    verifier_max.prefill("a", [1, 2, 3])
    verifier_max.prefill("b", [1, 2, 3])
    before = _forwards()
    with pytest.raises(ResourceExhausted, match="2 open sessions"):
        verifier_max.prefill("c", list(range(200)))
    assert _forwards() == before  # refused before its prefill ran
    verifier_max.release("a")
    assert verifier_max.prefill("c", [4, 5]) == 2


def test_full_queue_refuses_before_any_forward():
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig(prefill_chunk=1, max_queue=1))
    try:
        long_prefill = Work(
            new_slot(model, 2048), one_step(Step(tuple(range(1, 255)) * 4, chunked=True))
        )  # ~1000 one-token forwards
        thread = threading.Thread(target=scheduler.run, args=(long_prefill,))
        thread.start()
        from tests.grpc_harness import wait_until

        assert wait_until(lambda: long_prefill.started, timeout_s=10)
        kv = new_slot(model, 2048)
        with pytest.raises(ResourceExhausted, match="queue is full"):
            scheduler.run(Work(kv, one_step(Step((1, 2, 3), chunked=True))))
        assert kv.length == 0
        thread.join()
        assert long_prefill.kv.length == 254 * 4 and long_prefill.error is None
    finally:
        scheduler.close()


def test_verify_after_batched_tree_rollback_matches_a_fresh_prefill():
    """A tree round keeps only its accepted path in the slot: the next round sees exactly the context."""
    verifier = _verifier()
    prompt = [5, 6, 7, 8]
    verifier.prefill("tree", prompt)
    result = verifier.verify("tree", 4, Draft(tokens=(9, 10, 11, 12), parents=(-1, -1, 1, 0)), SamplingParams())
    context = prompt + list(result.accepted_tokens) + [result.correction_token]
    verifier.prefill("fresh", context)
    chain = Draft(tokens=(1, 2), parents=(-1, 0))
    a = verifier.verify("tree", len(context), chain, SamplingParams())
    b = verifier.verify("fresh", len(context), chain, SamplingParams())
    assert a.node_argmax == b.node_argmax


@pytest.mark.parametrize("weights", ["fp32", "w8a8", "w4a8"])
def test_a_tokens_logits_are_its_bits_alone_in_a_chunk_and_in_a_draft(weights):
    """Row-exact attention: a token's logits fed alone after its context == fed among 9 tokens of one
    step (a draft or a prompt chunk), bit for bit (SDPA's rows differ in their last bits, which W8A8
    rounds into its activations). On for a W8A8 (W4A8) model; fp32 keeps SDPA and agrees to rounding."""
    from specpipe.engine import native
    from specpipe.engine.runner import PACKED_WEIGHTS, ROUNDED_ACTIVATIONS

    model = tiny_model()
    native.pack_linears(model, PACKED_WEIGHTS[weights])
    ids = list(range(10, 50))
    one_by_one, chunked = new_slot(model, 2048), new_slot(model, 2048)
    batched_forward(model, [_chain(one_by_one, ids[:30])])
    alone = torch.cat([batched_forward(model, [_chain(one_by_one, [t])])[0] for t in ids[30:36]])
    batched_forward(model, [_chain(chunked, ids[:27])])
    in_chunk = batched_forward(model, [_chain(chunked, ids[27:36])])[0][3:]  # rows 30..35 of a 9-token chunk
    if weights in ROUNDED_ACTIVATIONS:
        assert torch.equal(alone, in_chunk)
    else:
        torch.testing.assert_close(alone, in_chunk, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("weights", ["w8a8", "w4a8"])
def test_a_w8a8_verifier_decodes_a_token_alike_alone_and_in_drafts(tiny_tokenizer, tiny_drafter, weights):
    """A W8A8 (W4A8) verifier (int8 activations: a last-bit change of attention can round into another
    token) attends row by row: its speculative output equals its own greedy decoding, chains, trees
    and the prompt prefilled in chunks; with batching off it refuses to start."""
    model = tiny_model()
    verifier = ModelVerifier(model, model_info(ModelSpec("tiny"), model), mode="packed", weights=weights,
                             batch=BatchConfig(prefill_chunk=8))
    generator = Generator(tiny_tokenizer, verifier, {"model": tiny_drafter})
    ids = tuple(range(5, 45))
    alone, _ = run(generator, GenerationRequest(ids, 40, speculation=SpeculationOptions("none")))
    for spec in (SpeculationOptions("model", draft_len=4, adaptive="off"),
                 SpeculationOptions("model", draft_len=3, width=3, adaptive="off"), SpeculationOptions("model")):
        tokens, chunks = run(generator, GenerationRequest(ids, 40, speculation=spec))
        assert tokens == alone, spec
        assert sum(c.round.accepted for c in chunks) > 0
    with pytest.raises(FailedPrecondition, match=f"{weights.upper()} verifier"):
        ModelVerifier(tiny_model(), model_info(ModelSpec("tiny"), model), mode="packed", weights=weights,
                      batching=False)


@pytest.mark.slow
@pytest.mark.parametrize("forward", [{}, {"mode": "packed", "weights": "int8"}], ids=["eager", "packed int8"])
def test_concurrent_sessions_equal_verifier_greedy_smollm2(forward):
    """A real Llama-family model: four chats at once through the batched verifier, each == generate()
    of the same verifier (packed int8: the int8 model's)."""
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.config.presets import model_specs
    from specpipe.engine.models import load_tokenizer
    from specpipe.models import packaged
    from tests.test_golden_smollm2 import CHATS

    packaged.prepare("smollm2-135m", progress=False)
    verifier_spec, drafter_spec = model_specs("smollm2")
    verifier = ModelVerifier.load(verifier_spec, batch=BatchConfig(prefill_chunk=8), **forward)
    assert verifier.batched
    tokenizer = load_tokenizer(verifier_spec)
    generator = Generator(tokenizer, verifier, {"model": ModelDrafter.load(drafter_spec)})
    prompts = [tuple(tokenizer(chat)["input_ids"]) for chat in CHATS]
    expected = [reference_greedy(verifier.model, ids, MAX_NEW_TOKENS) for ids in prompts]
    outputs = _concurrently(
        [
            lambda ids=ids, w=1 + i % 2: run(
                generator,
                GenerationRequest(
                    ids,
                    MAX_NEW_TOKENS,
                    speculation=SpeculationOptions(drafter="model", draft_len=4, width=w, adaptive="off"),
                ),
            )[0]
            for i, ids in enumerate(prompts)
        ]
    )
    assert outputs == expected


def test_a_round_does_not_wait_for_a_long_prefill():
    """A round queued while a long prompt prefills in chunks runs in the next forward, mixed with
    the next chunk: it returns while the prompt is still entering."""
    model = tiny_model()
    scheduler = Scheduler(model, BatchConfig(prefill_chunk=4))
    try:
        long_prefill = Work(
            new_slot(model, 2048), one_step(Step(tuple(range(1, 255)) * 4, chunked=True))
        )  # ~250 chunks
        thread = threading.Thread(target=scheduler.run, args=(long_prefill,))
        thread.start()
        from tests.grpc_harness import wait_until

        assert wait_until(lambda: long_prefill.started, timeout_s=10)
        kv = new_slot(model, 2048)
        scheduler.run(Work(kv, one_step(Step((5, 6, 7), chunked=True))))  # a prompt of its own
        round_ = scheduler.run(
            Work(
                kv,
                one_step(
                    Step(
                        (8, 9),
                        positions=torch.tensor([3, 4]),
                        allowed=torch.ones(2, 2, dtype=torch.bool).tril(),
                        logit_rows=2,
                    )
                ),
            )
        )
        fed_when_done = long_prefill.kv.length
        thread.join()
        assert round_.result.shape == (2, 257)
        assert fed_when_done < 254 * 4
        # what adaptive control learns the forward's cost from: it fed a prompt chunk beside the round
        assert round_.batch_sessions == 2 and 2 < round_.batch_tokens <= 2 + 4  # the chunk bounded by time
    finally:
        scheduler.close()

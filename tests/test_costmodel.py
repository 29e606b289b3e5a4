"""The simulated clock (specpipe.engine.costmodel): a curve's time for each forward shape, as the
graphs mode would run it; a forward held to it, and one slower than it kept and counted."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from specpipe.core.errors import InvalidArgument
from specpipe.engine import costmodel
from specpipe.engine.costmodel import ClockedForward, ForwardCurve, batch_ms, chunk_ms, forward_ms
from specpipe.runtime import metrics

CURVE = ForwardCurve("literal", "GPU", "verifier",
                     {(1, 1): 4.0, (1, 8): 5.0, (2, 1): 4.5, (2, 8): 6.0, (32, 1): 8.0, (32, 8): 10.0},
                     {1: 4.0, 32: 5.0, 64: 6.0})


@pytest.mark.parametrize("sessions,tokens,ms", [
    (1, 1, 4.0),    # recorded
    (1, 3, 5.0),    # tokens pad up to the next recorded bucket
    (2, 8, 6.0),
    (3, 1, 8.0),    # sessions pad up to the next recorded bucket
    (1, 16, 5.0 + 8 / 7),  # past the largest tokens: the slope of the last two points (1/7 ms a token)
    (40, 1, 8.0),   # past the largest sessions: the largest bucket (forward_ms splits into groups)
])
def test_a_batch_pads_to_the_recorded_shape_and_extrapolates_past_it(sessions, tokens, ms):
    assert batch_ms(CURVE, sessions, tokens) == pytest.approx(ms)


def test_chunks_pad_up_and_grow_past_the_largest_with_the_whole_range_slope():
    assert chunk_ms(CURVE, 20) == 5.0
    assert chunk_ms(CURVE, 64) == 6.0
    assert chunk_ms(CURVE, 256) == pytest.approx(6.0 + (6.0 - 4.0) / 63 * 192)


def test_a_forward_splits_like_the_graphs_mode():
    assert forward_ms(CURVE, []) == 0.0
    assert forward_ms(CURVE, [1] * 32) == 8.0
    assert forward_ms(CURVE, [1] * 33) == 8.0 + 4.0  # groups of 32: the second a batch of one
    assert forward_ms(CURVE, [1, 5, 100]) == pytest.approx(
        6.0 + chunk_ms(CURVE, 100)
    )  # steps padded to 8; a chunk alone
    scaled = ForwardCurve(CURVE.source, CURVE.device, CURVE.role, CURVE.steps_ms, CURVE.chunk_ms, scale=3.0)
    assert forward_ms(scaled, [1] * 32) == 24.0
    assert "x3" in scaled.label and "GPU" in scaled.label


def test_curves_load_from_a_gpu_record_a_curve_file_or_a_packaged_name(tmp_path):
    record = {
        "environment": {"gpu": "NVIDIA H200"},
        "cost": {"verifier": {"batched_graphs_ms": {"1x1": 4.4, "32x1": 7.9}, "graphs_ms": {"1": 4.6, "64": 6.5}}},
    }
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    curve = costmodel.load_curve(str(path), "verifier")
    assert curve.device == "NVIDIA H200" and curve.steps_ms[(32, 1)] == 7.9 and curve.chunk_ms[64] == 6.5
    assert costmodel.load_curve(f"{path}:x2", "verifier").scale == 2.0
    packaged = costmodel.load_curve("nvidia-h200-qwen-coder", "verifier")
    assert packaged.steps_ms[(32, 1)] == pytest.approx(7.931) and packaged.device == "NVIDIA H200"
    assert costmodel.load_curve("nvidia-h200-qwen-coder", "drafter").steps_ms[(1, 1)] == pytest.approx(3.523)
    with pytest.raises(InvalidArgument, match="no curve for the cache"):
        costmodel.load_curve("nvidia-h200-qwen-coder", "cache")
    with pytest.raises(InvalidArgument, match="not a packaged curve"):
        costmodel.load_curve("no-such-curve", "verifier")
    with pytest.raises(InvalidArgument, match="no batched graphs times for the drafter"):
        costmodel.load_curve(str(path), "drafter")


def segments(*lengths):
    return [SimpleNamespace(token_ids=(0,) * n) for n in lengths]


def test_a_clocked_forward_takes_the_curves_time_and_a_slower_one_its_own():
    curve = ForwardCurve("literal", "GPU", "verifier", {(1, 1): 30.0, (2, 1): 40.0}, {1: 30.0})
    calls = []
    fast = ClockedForward(lambda s: calls.append(len(s)) or ["rows"] * len(s), curve)
    start = time.perf_counter()
    assert fast(segments(1, 1)) == ["rows", "rows"]
    assert time.perf_counter() - start >= 0.040 and calls == [2]  # the real forward ran, then the clock

    overruns = metrics.SIMULATED_OVERRUNS.labels(role="verifier")._value.get()
    slow = ClockedForward(lambda s: time.sleep(0.06) or [None], curve)
    start = time.perf_counter()
    slow(segments(1))
    assert 0.06 <= time.perf_counter() - start < 0.06 + 0.03  # its own time, not padded to 30 ms more
    assert metrics.SIMULATED_OVERRUNS.labels(role="verifier")._value.get() == overruns + 1


@pytest.mark.parametrize("speculation", [
    "verifier only", "model sequential", "model branch adaptive", "ngram branch adaptive", "hybrid tree"])
def test_golden_through_the_simulated_clock(tiny_tokenizer, speculation):
    """Speculative greedy output == verifier-only greedy output with the verifier and the drafter held to
    the H200 curve (scaled down: the test's time), their adaptive control learning the curve's flat T(k)."""
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters
    from specpipe.config.presets import ModelSpec
    from specpipe.core.types import SpeculationOptions
    from specpipe.engine.models import model_info, tiny_model
    from tests.golden import GOLDEN_PROMPTS, assert_golden, reference_greedy
    from verifier_service.verifier import ModelVerifier

    specs = {"verifier only": SpeculationOptions(drafter="none"),
             "model sequential": SpeculationOptions("model", 4, schedule="sequential", adaptive="off"),
             "model branch adaptive": SpeculationOptions("model", schedule="branch"),
             "ngram branch adaptive": SpeculationOptions("ngram", schedule="branch"),
             "hybrid tree": SpeculationOptions("hybrid", 4, 2, adaptive="off")}
    verifier_model, drafter_model = tiny_model(), tiny_model(2)
    verifier = ModelVerifier(verifier_model, model_info(ModelSpec("tiny"), verifier_model),
                             cost_model=costmodel.load_curve("nvidia-h200-qwen-coder:x0.2", "verifier"))
    drafter = ModelDrafter(drafter_model, model_info(ModelSpec("tiny", 2), drafter_model),
                           cost_model=costmodel.load_curve("nvidia-h200-qwen-coder:x0.2", "drafter"))
    from cache_service.memory import InMemoryNgramCache

    store = InMemoryNgramCache()
    generator = Generator(tiny_tokenizer, verifier, build_drafters(("model", "ngram", "hybrid"), store, drafter,
                                                                   verifier.info()), specs[speculation], store)
    references = {}
    for prompt in GOLDEN_PROMPTS[:4]:
        ids = generator.encode(prompt=prompt)
        references[prompt] = (ids, reference_greedy(verifier_model, ids, 32))
    forwards = metrics.SIMULATED_FORWARDS.labels(role="verifier")._value.get()
    assert_golden(generator, references, 32, specs[speculation])
    assert metrics.SIMULATED_FORWARDS.labels(role="verifier")._value.get() > forwards

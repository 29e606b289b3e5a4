"""Compiled forward passes (`--compile on`): packed GEMMs (CPU) and the graphs mode (KV slots
through one working static cache and bucketed forwards, captured as CUDA graphs on CUDA; run here on
the CPU without capture, the same buffers and bookkeeping).

Slot bookkeeping (chunked prefill, crop, fork, tree compaction, trees past the largest bucket) gives
the logits of the eager DynamicCache path. Golden, for both compiled modes: speculative output ==
the verifier's greedy output run the same way (transformers generate() on the compiled model, and
the compiled verifier alone), for every drafter kind, both schedules and a tree (tiny preset).
scripts/gpu_check.py runs the same golden cases on a GPU, with the graphs captured.
"""

import subprocess
import sys

import pytest
import torch

from cache_service.memory import InMemoryNgramCache
from specpipe.core.types import ROOT, GenerationRequest, SpeculationOptions
from specpipe.engine import runner
from specpipe.engine.kv import SlotKV
from specpipe.engine.models import tiny_model
from tests.golden import GOLDEN_PROMPTS, golden_references, run
from tests.test_golden_ngram import generator_with

BUCKETS = (1, 8)
MAX_NEW_TOKENS = 32
CONTEXT = [(7 * i + 3) % 250 for i in range(50)]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_static_slot_matches_dynamic_cache(model):
    eager, static = runner.Runner(model), runner.Runner(model, "graphs", buckets=(1, 2, 4, 8))
    static.warm_up()
    dynamic_cache, slot = eager.new_cache(), static.new_cache()
    assert isinstance(slot, SlotKV)

    def both(token_ids, parents=None):
        a, b = eager.forward(dynamic_cache, token_ids, parents), static.forward(slot, token_ids, parents)
        assert close(a, b) and runner.cache_len(dynamic_cache) == runner.cache_len(slot)
        return a

    both(CONTEXT)                                   # 50 tokens: chunks of the largest bucket
    both([5, 6, 7])                                 # a chain, padded to 4
    parents = (ROOT, 0, ROOT, 2, 3)
    both([8, 9, 10, 11, 12, 13], parents)           # a tree, padded to 8
    for cache in (dynamic_cache, slot):
        runner.keep_tree_path(cache, len(CONTEXT) + 4, [2, 3, 4])  # a path that is not a chain prefix
    both([14])
    big_tree = (ROOT,) + tuple(range(11))           # 13 tokens with the root: past the largest bucket
    both(list(range(20, 33)), big_tree)
    for cache in (dynamic_cache, slot):
        runner.crop(cache, len(CONTEXT) + 2)
    forks = [runner.fork(c, len(CONTEXT)) for c in (dynamic_cache, slot)]
    a, b = eager.forward(forks[0], [40, 41]), static.forward(forks[1], [40, 41])
    assert close(a, b)
    both([42])                                      # the original slot is untouched by its fork


def test_slot_bounds_the_context(model):
    static = runner.Runner(model, "graphs", max_context=64, buckets=(1, 8))
    slot = static.new_cache()
    static.forward(slot, CONTEXT)
    with pytest.raises(ValueError, match="exceed the slot"):
        static.forward(slot, list(range(20)))
    from specpipe.config.presets import model_specs
    from specpipe.engine.models import model_info

    info = model_info(model_specs("tiny")[0], model)
    assert runner.served_info(info, static).max_context == 64
    assert runner.served_info(info, runner.Runner(model)).max_context == info.max_context


COMPILED = {  # fixture param -> (mode, batching, the verifier's weights, the drafter's weights)
    "packed": ("packed", True, "fp32", "int8"),
    "packed bf16": ("packed", True, "bf16", "bf16"),
    "packed int8": ("packed", True, "int8", "int8"),
    "graphs": ("graphs", True, "fp32", "fp32"),
    "graphs unbatched": ("graphs", False, "fp32", "fp32"),
}


@pytest.fixture(scope="module", params=list(COMPILED))
def compiled(request, tiny_tokenizer):
    """A compiled verifier and drafter (tiny preset) behind one generator over an in-memory store
    (packed: the drafter's weights in int8, as --draft-weights auto packs them; packed bf16 / int8:
    the verifier's packed weights in bf16 / int8, each a model of its own that speculation must
    reproduce exactly, and the drafter's in the same)."""
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.config.presets import model_specs
    from verifier_service.verifier import ModelVerifier

    verifier_spec, drafter_spec = model_specs("tiny")
    mode, batching, weights, drafter_weights = COMPILED[request.param]
    verifier = ModelVerifier.load(verifier_spec, mode=mode, buckets=BUCKETS, batching=batching, weights=weights)
    drafter = ModelDrafter.load(drafter_spec, mode=mode, buckets=BUCKETS, batching=batching, weights=drafter_weights)
    return generator_with(InMemoryNgramCache(), tiny_tokenizer, verifier, drafter)


@pytest.fixture(scope="module")
def references(compiled, tiny_tokenizer):
    """transformers greedy generate() of the verifier run the same way (packed: the packed model)."""
    return golden_references(tiny_tokenizer, compiled.verifier.model, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def eager_references(tiny_tokenizer, tiny_verifier):
    return golden_references(tiny_tokenizer, tiny_verifier.model, MAX_NEW_TOKENS)


def test_compiled_verifier_alone_equals_generate(compiled, references, eager_references):
    fp32 = compiled.verifier._runner.weights == "fp32"
    for prompt, (ids, expected) in references.items():
        tokens, _ = run(compiled, GenerationRequest(ids, MAX_NEW_TOKENS, speculation=SpeculationOptions("none")))
        assert tokens == expected
        if fp32:  # here no token changes between eager and compiled fp32 (bf16, int8 weights are other models)
            assert expected == eager_references[prompt][1]


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("schedule", ["sequential", "branch"])
def test_golden_compiled(compiled, references, drafter, schedule):
    speculation = SpeculationOptions(drafter, 4, schedule=schedule, adaptive="off")
    accepted = 0
    for ids, expected in references.values():
        tokens, chunks = run(compiled, GenerationRequest(ids, MAX_NEW_TOKENS, speculation=speculation))
        assert tokens == expected
        accepted += sum(c.round.accepted for c in chunks if c.round)
    assert accepted > 0


def test_golden_compiled_tree(compiled, references):
    speculation = SpeculationOptions("model", 4, width=2, adaptive="off")
    for ids, expected in references.values():
        assert run(compiled, GenerationRequest(ids, MAX_NEW_TOKENS, speculation=speculation))[0] == expected


def _buffers(service) -> list:
    """The addresses a service's captured graphs read and write: its batched forward's (BatchGraphs),
    or one session per forward, its runner's (the working cache, each bucket's inputs)."""
    if service._scheduler is not None:
        graphs = service._scheduler._forward.__self__
        return [graphs.keys.data_ptr(), graphs.values.data_ptr(), graphs.lengths.data_ptr(),
                *((key, *(t.data_ptr() for t in inputs.values())) for key, (inputs, _) in graphs._graphs.items())]
    r = service._runner
    return [r._working.keys.data_ptr(), r._working.values.data_ptr(), r._working.length.data_ptr(),
            *((size, f.ids.data_ptr(), f.positions.data_ptr(), f.mask.data_ptr()) for size, f in r._forwards.items())]


@pytest.mark.parametrize("compiled", ["graphs", "graphs unbatched"], indirect=True)
def test_graphs_keep_their_buffers(compiled, references):
    """A captured CUDA graph replays on fixed addresses: new sessions, forks and rollbacks run through
    the buffers warm-up made, never new ones."""
    services = [compiled.verifier, compiled.drafters["model"]]

    def addresses():
        return [_buffers(service) for service in services]

    before = addresses()
    assert all(service.batched == compiled.verifier.batched for service in services)
    ids = references[GOLDEN_PROMPTS[0]][0]
    for schedule in ("sequential", "branch"):
        run(
            compiled,
            GenerationRequest(ids, 16, speculation=SpeculationOptions("model", 4, schedule=schedule, adaptive="off")),
        )
    assert addresses() == before


@pytest.mark.parametrize("device, compile_, dtype, mode, model_dtype, weights", [
    ("cpu", "off", "auto", "eager", "float32", "fp32"),
    ("cpu", "on", "auto", "packed", "float32", "w4a8"),  # the CPU verifier on its 4-bit blocks
    ("cuda", "auto", "auto", "graphs", "bfloat16", "fp32"),  # a GPU's defaults: captured graphs in bfloat16
    ("cuda:1", "on", "float32", "graphs", "float32", "fp32"),
    ("cuda", "off", "auto", "eager", "bfloat16", "fp32"),
])
def test_forward_mode_dtype_and_verifier_weights_follow_the_device(device, compile_, dtype, mode, model_dtype,
                                                                   weights):
    from specpipe.app.wiring import forward_mode, verifier_weights
    from specpipe.config.services import ModelConfig

    model = ModelConfig(device=device, compile=compile_, dtype=dtype)
    assert (forward_mode(model), model.torch_dtype, verifier_weights(model)) == (mode, model_dtype, weights)
    # W4A8 attends row by row in batched forwards only: one session per forward keeps fp32 unless asked
    assert verifier_weights(ModelConfig(device=device, compile=compile_, batching=False)) == "fp32"
    assert verifier_weights(ModelConfig(compile="on", verifier_weights="int8")) == "int8"


def test_models_load_in_the_dtype_asked_for():
    from specpipe.config.presets import ModelSpec
    from specpipe.core.errors import InvalidArgument
    from specpipe.engine.models import load_model

    assert load_model(ModelSpec("tiny"), "cpu", "bfloat16").dtype == torch.bfloat16
    with pytest.raises(InvalidArgument, match="unknown dtype 'half'"):
        load_model(ModelSpec("tiny"), "cpu", "half")


@pytest.mark.parametrize("source", ["no-such-org/no-such-model", "/no/such/model/folder"])
def test_a_model_that_is_not_here_is_a_clear_error_never_a_download(source, monkeypatch):
    """Models load from local files only (a packaged model, a folder, the local Hugging Face cache): no
    host is even looked up (transformers' loaders ask the hub for an id even with local_files_only)."""
    import socket

    from specpipe.config.presets import ModelSpec
    from specpipe.core.errors import InvalidArgument
    from specpipe.engine.models import load_model, load_tokenizer

    asked = []
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: asked.append(host) or [])
    for load in (load_model, load_tokenizer):
        with pytest.raises(InvalidArgument, match="is not here.*nothing is downloaded"):
            load(ModelSpec(source))
    assert asked == []


def test_a_model_id_in_the_local_hugging_face_cache_loads_without_asking_the_hub(tmp_path, monkeypatch,
                                                                                  tiny_verifier, tiny_tokenizer):
    import socket

    from huggingface_hub import constants

    from specpipe.config.presets import ModelSpec
    from specpipe.engine.models import load_model, load_tokenizer

    snapshot = tmp_path / "models--local--tiny" / "snapshots" / "abc"
    tiny_verifier.model.save_pretrained(snapshot)
    tiny_tokenizer.save_pretrained(snapshot)
    (tmp_path / "models--local--tiny" / "refs").mkdir()
    (tmp_path / "models--local--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    asked = []
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: asked.append(host) or [])
    model = load_model(ModelSpec("local/tiny"))
    assert model.config.num_hidden_layers == tiny_verifier.model.config.num_hidden_layers
    assert load_tokenizer(ModelSpec("local/tiny"))("def f():")["input_ids"] == tiny_tokenizer("def f():")["input_ids"]
    assert asked == []


@pytest.mark.parametrize("argv, message", [
    (["generate", "--compile", "maybe", "hi"], "invalid choice: 'maybe'"),
    (["generate", "--compile", "off", "--draft-weights", "bf16", "--prompt", "hi"],
     "--draft-weights bf16 packs the drafter's weights"),
    (["generate", "--compile", "off", "--verifier-weights", "bf16", "--prompt", "hi"],
     "--verifier-weights bf16 packs the verifier's weights"),
    (["generate", "--compile", "off", "--verifier-weights", "int8", "--prompt", "hi"],
     "--verifier-weights int8 packs the verifier's weights"),
    (["bench", "--forward-curve", "--acceptance", "1.5"], "--acceptance takes rates in [0, 1]"),
    (["bench", "--forward-curve", "--acceptance", "high"], "--acceptance takes rates in [0, 1]"),
])
def test_cli_rejects_bad_compile_flags(cli, argv, message):
    code, stderr = cli(*argv, "--preset", "tiny")
    assert code != 0 and message in stderr, stderr


def test_forward_curve_and_bounds(model):
    from specpipe.bench import curve

    measured = curve.forward_curves({"a": runner.Runner(model), "b": runner.Runner(model)}, sizes=(1, 2, 5),
                                    context_len=20, repeats=1)
    assert set(measured) == {"a", "b"} and all(set(c) == {1, 2, 5} and all(t > 0 for t in c.values())
                                               for c in measured.values())
    assert curve.expected_tokens(0.0, 4) == 1.0 and curve.expected_tokens(1.0, 4) == 5.0
    flat = {1: 1.0, 2: 1.0, 5: 1.0}  # verifying is free, drafting costs 0.25 of a verify per token
    sequential, overlapped = curve.speedup_bounds(flat, 0.25, 1.0, 4)
    assert sequential == pytest.approx(5 / 2) and overlapped == pytest.approx(5 / 1)
    rows = curve.bounds_table(flat, 0.25, [1.0])
    assert rows[0]["sequential_gamma"] == 4 and rows[0]["overlapped_gamma"] == 4
    assert "| eager | 1.00 | 2.50x (4) | 5.00x (4) |" in curve.bounds_markdown({"eager": rows})


@pytest.mark.slow
def test_bench_compiled_over_grpc_reports_both_baselines(tmp_path):
    """`bench --compile on --transport grpc`: compiled services, the eager generate() baseline and the
    compiled verifier alone in one run; compiled methods are checked against the compiled verifier."""
    import json

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specpipe.cli.main",
            "bench",
            "--preset",
            "tiny",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--transport",
            "grpc",
            "--compile",
            "on",
            "--verifier-weights",  # the compiled fp32 verifier, whose greedy output is eager's here
            "fp32",
            "--no-pin",
            "--methods",
            "model:branch/4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled vs eager: the compiled verifier alone gave the eager generate() output on 2 of 2" in proc.stdout
    methods = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    alone, branch = (
        methods["specpipe verifier alone compiled"],
        methods["specpipe model k=4 width=1 branch calibrated M=1"],
    )
    assert alone["reference"] == "verifier-only generate()" and alone["speedup_reference"] is None
    assert branch["reference"] == "specpipe verifier alone compiled" and branch["identical"] == 2
    assert branch["speedup_reference"] > 0 and branch["speedup"] > 0

"""The verifier and the drafter on a GPU: the golden cases on CUDA, and the cost curves of the
qwen-coder architectures (docs/gpu.md). scripts/gpu_check.sh runs it on a lent GPU machine.

    PYTHONPATH=. python3 scripts/gpu_check.py --out gpu.json                    # everything, on cuda
    PYTHONPATH=. python3 scripts/gpu_check.py --device cpu --quick --out x.json  # the same code, small, on a CPU

- golden: the tiny preset, greedy, on the device in float32 and bfloat16, for three forward setups
  (eager batched, eager one session per forward, graphs: CUDA graphs captured per bucket), every
  drafter kind, both schedules, adaptive control on and off, and a tree; each output is compared with
  transformers generate() of the same model and with specpipe's verifier alone in the same setup.
  A mismatch records where the output first differs and the reference's top-2 logit gap there (a
  gap near the dtype's rounding is a near tie, anything larger a bug). Sampling: the same seed gives
  the same tokens under both schedules.
- cost: the Qwen2.5-Coder-1.5B verifier and 0.5B drafter architectures (configs below, the models'
  own; weights generated here, bfloat16): T(k) of one session for k = 1..64 eager and with CUDA
  graphs, the batched forward of 1-32 sessions feeding 1, 2, 4 or 8 tokens each, the drafter's step.

Each section is written to --out as soon as it ends, and one that fails records its error, so a run
cut short still reports what it measured. A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from cache_service.memory import InMemoryNgramCache
from drafter_service.hybrid import HybridDrafter
from drafter_service.model_drafter import ModelDrafter
from drafter_service.ngram_drafter import NgramDrafter
from orchestrator.generator import Generator
from specpipe.config.presets import ModelSpec, model_specs
from specpipe.core.types import GenerationRequest, SamplingParams, SpeculationOptions
from specpipe.engine import runner as runners
from specpipe.engine.batched import BatchGraphs, Segment, batched_forward
from specpipe.engine.kv import new_slot, synchronize
from specpipe.engine.models import DTYPES, load_tokenizer, model_info
from tests.golden import golden_references, run
from verifier_service.verifier import ModelVerifier

# The models' own config.json values (Qwen2.5-Coder-1.5B-Instruct, Qwen2.5-Coder-0.5B-Instruct).
QWEN2_COMMON = dict(vocab_size=151936, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                    bos_token_id=151643, eos_token_id=151645)
ARCHITECTURES = {
    "verifier": dict(
        QWEN2_COMMON, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12
    ),
    "drafter": dict(
        QWEN2_COMMON, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14
    ),
}
SETUPS = {  # forward setup -> (runner mode, batching)
    "eager batched": ("eager", True),
    "eager one session per forward": ("eager", False),
    "graphs batched": ("graphs", True),
    "graphs one session per forward": ("graphs", False),
}
GOLDEN_BUCKETS = (1, 2, 4, 8, 16)  # the tiny preset's drafts stay within 16 tokens
COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
BATCH_SESSIONS = (1, 2, 4, 8, 16, 32)
BATCH_TOKENS = (1, 2, 4, 8)
SERVED_SESSIONS = (1, 4, 16, 32)
CONTEXT = 300  # cached tokens before each timed forward


def speculations() -> dict[str, SpeculationOptions]:
    cases = {"verifier alone": SpeculationOptions("none")}
    for drafter in ("model", "ngram", "hybrid"):
        for schedule in ("sequential", "branch"):
            for adaptive in ("off", "on"):
                cases[f"{drafter} {schedule} adaptive {adaptive}"] = SpeculationOptions(
                    drafter, 4, schedule=schedule, adaptive=adaptive)
    cases["model tree width 2"] = SpeculationOptions("model", 4, width=2, adaptive="off")
    return cases


def top2(model, prompt_ids, output, at: int) -> dict:
    """The reference's top logit, and its gap to the second, where a speculative output first differed."""
    ids = torch.tensor([[*prompt_ids, *output[:at]]], device=model.device)
    with torch.inference_mode():
        top = model(input_ids=ids).logits[0, -1].float().topk(2).values
    return {"reference_top_logit": float(top[0]), "reference_top2_gap": float(top[0] - top[1])}


def golden_setup(device: str, dtype: str, setup: str, max_new_tokens: int, quick: bool) -> dict:
    """Every speculation case in one forward setup; outputs against generate() and the verifier alone."""
    mode, batching = SETUPS[setup]
    verifier_spec, drafter_spec = model_specs("tiny")
    tokenizer = load_tokenizer(verifier_spec)
    start = time.perf_counter()
    verifier = ModelVerifier.load(verifier_spec, device, dtype, mode=mode, batching=batching, buckets=GOLDEN_BUCKETS)
    model_drafter = ModelDrafter.load(drafter_spec, device, dtype, mode=mode, batching=batching, buckets=GOLDEN_BUCKETS)
    warm_up_s = time.perf_counter() - start
    store = InMemoryNgramCache()
    ngram = NgramDrafter(store, verifier.info())
    generator = Generator(tokenizer, verifier, {"model": model_drafter, "ngram": ngram,
                                                "hybrid": HybridDrafter(model_drafter, ngram)}, cache=store)
    references = golden_references(tokenizer, verifier.model, max_new_tokens)
    if quick:
        references = dict(list(references.items())[:2])
    alone = {}
    cases = {}
    for name, speculation in speculations().items():
        if quick and name not in ("verifier alone", "model branch adaptive on", "hybrid sequential adaptive off",
                                  "model tree width 2"):
            continue
        case = {"prompts": len(references), "equal_generate": 0, "equal_alone": 0, "drafted": 0, "accepted": 0,
                "mismatches": []}
        started = time.perf_counter()
        for prompt, (ids, expected) in references.items():
            tokens, chunks = run(generator, GenerationRequest(ids, max_new_tokens, speculation=speculation))
            if name == "verifier alone":
                alone[prompt] = tokens
            case["equal_generate"] += tokens == expected
            case["equal_alone"] += tokens == alone.get(prompt)
            case["drafted"] += sum(c.round.drafted for c in chunks if c.round)
            case["accepted"] += sum(c.round.accepted for c in chunks if c.round)
            if tokens != expected:
                at = next(
                    (i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), min(len(tokens), len(expected))
                )
                case["mismatches"].append({"prompt": prompt, "first_difference": at,
                                           **top2(verifier.model, ids, expected, at)})
        case["seconds"] = round(time.perf_counter() - started, 2)
        cases[name] = case
        print(
            f"  {dtype:8s} {setup:30s} {name:34s} generate {case['equal_generate']}/{case['prompts']} "
            f"alone {case['equal_alone']}/{case['prompts']} accepted {case['accepted']}/{case['drafted']}",
            flush=True,
        )
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    ids = next(iter(references.values()))[0]
    outputs = {schedule: run(generator, GenerationRequest(ids, max_new_tokens, sampling=sampled, speculation=
                             SpeculationOptions("model", 4, schedule=schedule, adaptive="off")))[0]
               for schedule in ("sequential", "branch")}
    return {"mode": mode, "batching": batching, "verifier_batched": verifier.batched, "warm_up_s": round(warm_up_s, 2),
            "cases": cases, "sampling_same_across_schedules": outputs["sequential"] == outputs["branch"]}


def generated_model(role: str, device: str, dtype: str, quick: bool):
    """A Qwen2 of the role's architecture with generated weights (quick: two layers, for a CPU try)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**dict(ARCHITECTURES[role], **({"num_hidden_layers": 2} if quick else {})))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=DTYPES[dtype], attn_implementation="sdpa")
    return model.eval()


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)  # fn ends once the device is done (Runner, batched_forward)
    return statistics.median(times)


def forward_curve(runner: runners.Runner, sizes, repeats: int) -> dict[int, float]:
    """k -> median ms of one forward of k new tokens after CONTEXT cached ones (one warm-up each)."""
    vocab = runner.model.config.vocab_size
    cache = runner.new_cache()
    runner.forward(cache, [(7 * i + 10) % vocab for i in range(CONTEXT)])
    curve = {}
    for k in sizes:
        def once():
            runner.forward(cache, [11] * k)
            runners.crop(cache, CONTEXT)
        once()
        curve[k] = round(median_ms(once, repeats), 3)
    return curve


def batched_curve(model, forward, sessions, tokens, repeats: int) -> dict[str, float]:
    """'sessions x tokens' -> median ms of one batched forward (forward(segments)) where each session
    feeds that many tokens (a chain) after CONTEXT cached ones, logits for all of them."""
    vocab = model.config.vocab_size
    slots = [new_slot(model, 4096) for _ in range(max(sessions))]
    prompt = tuple((7 * i + 10) % vocab for i in range(CONTEXT))
    causal = torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).tril()
    for slot in slots:
        batched_forward(model, [Segment(slot, prompt, torch.arange(CONTEXT), causal, 0)])
    curve = {}
    for b in sessions:
        for n in tokens:
            allowed = torch.ones(n, n, dtype=torch.bool).tril()
            segments = [Segment(slot, (11,) * n, torch.arange(CONTEXT, CONTEXT + n), allowed, n) for slot in slots[:b]]

            def once():
                forward(segments)
                for slot in slots[:b]:
                    slot.crop(CONTEXT)
            once()
            curve[f"{b}x{n}"] = round(median_ms(once, repeats), 3)
    return curve


class IdsOnly:
    """The generated models' stand-in tokenizer: requests carry token ids, and the text is not read."""

    def decode(self, tokens, **kwargs) -> str:
        return ""


def plain_decode(model, new_tokens: int, quick: bool) -> dict:
    """Tokens/s of decoding without drafts (the verifier alone): transformers generate() against
    specpipe's verifier in each forward setup, the same prompt and weights."""
    vocab = model.config.vocab_size
    model.generation_config.eos_token_id = model.config.eos_token_id = None  # generated weights: no early end
    prompt = tuple((7 * i + 10) % vocab for i in range(CONTEXT))
    ids = torch.tensor([prompt], device=model.device)
    out = {}

    def generate():
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
            )
        synchronize(model.device)
    generate()
    start = time.perf_counter()
    generate()
    out["transformers generate()"] = round(new_tokens / (time.perf_counter() - start), 2)
    spec = ModelSpec("generated " + model.config.model_type)
    for setup, (mode, batching) in SETUPS.items():
        verifier = ModelVerifier(model, model_info(spec, model), mode=mode, batching=batching,
                                 buckets=(1, 2, 4) if quick else runners.BUCKETS)
        generator = Generator(IdsOnly(), verifier, {})
        request = GenerationRequest(prompt, new_tokens, speculation=SpeculationOptions("none"))
        run(generator, request)
        start = time.perf_counter()
        tokens, _ = run(generator, request)
        out[f"specpipe {setup}"] = round(len(tokens) / (time.perf_counter() - start), 2)
    return out


def served_throughput(model, concurrency, new_tokens: int, quick: bool) -> dict[str, dict[int, float]]:
    """Aggregate tokens/s of N sessions decoding at once without drafts (each on its own thread,
    prompts of different lengths), per forward setup."""
    vocab = model.config.vocab_size
    out = {}
    for setup, (mode, batching) in SETUPS.items():
        if setup == "eager one session per forward":
            continue  # the graphs one is the faster of the two
        verifier = ModelVerifier(model, model_info(ModelSpec("generated"), model), mode=mode, batching=batching,
                                 buckets=(1, 2, 4) if quick else runners.BUCKETS)
        generator = Generator(IdsOnly(), verifier, {})
        out[setup] = {}
        for sessions in concurrency:
            requests = [GenerationRequest(tuple((7 * i + s) % vocab for i in range(CONTEXT - 5 * s)), new_tokens,
                                          speculation=SpeculationOptions("none")) for s in range(sessions)]
            outputs: list[int] = [0] * sessions

            def one(i: int) -> None:
                outputs[i] = len(run(generator, requests[i])[0])
            threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            out[setup][sessions] = round(sum(outputs) / (time.perf_counter() - start), 1)
    return out


def cost_role(role: str, device: str, quick: bool) -> dict:
    model = generated_model(role, device, "bfloat16", quick)
    repeats = 3 if quick else 20
    sizes = (1, 2, 4) if quick else COST_SIZES
    out = {"architecture": ARCHITECTURES[role], "layers_run": model.config.num_hidden_layers, "dtype": "bfloat16",
           "parameters": sum(p.numel() for p in model.parameters())}
    out["eager_ms"] = forward_curve(runners.Runner(model, "eager"), sizes, repeats)
    print(f"  {role} eager T(k) ms: {out['eager_ms']}", flush=True)
    start = time.perf_counter()
    graphs = runners.Runner(model, "graphs", max_context=1024, buckets=(1, 2, 4) if quick else runners.BUCKETS)
    graphs.warm_up()
    out["graphs_capture_s"] = round(time.perf_counter() - start, 2)
    out["graphs_ms"] = forward_curve(graphs, sizes, repeats)
    print(f"  {role} graphs T(k) ms: {out['graphs_ms']} (captured in {out['graphs_capture_s']} s)", flush=True)
    del graphs
    sessions = (1, 2, 4) if quick else BATCH_SESSIONS
    tokens = (1, 2) if quick else (BATCH_TOKENS if role == "verifier" else (1,))
    out["batched_ms"] = batched_curve(model, lambda segments: batched_forward(model, segments), sessions, tokens,
                                      max(3, repeats // 2))
    print(f"  {role} batched ms: {out['batched_ms']}", flush=True)
    start = time.perf_counter()
    graphs = BatchGraphs(model, max_context=1024, sessions=sessions, tokens=tokens)
    graphs.warm_up()
    out["batched_graphs_capture_s"] = round(time.perf_counter() - start, 2)
    out["batched_graphs_ms"] = batched_curve(model, graphs.forward, sessions, tokens, max(3, repeats // 2))
    print(f"  {role} batched graphs ms: {out['batched_graphs_ms']} (captured in {out['batched_graphs_capture_s']} s)",
          flush=True)
    del graphs
    if role == "verifier":
        out["served_tokens_per_s"] = served_throughput(model, (1, 2) if quick else SERVED_SESSIONS, 16 if quick else 64,
                                                       quick)
        print(f"  {role} concurrent plain decoding, aggregate tokens/s: {out['served_tokens_per_s']}", flush=True)
        out["plain_decode_tokens_per_s"] = plain_decode(model, 16 if quick else 64, quick)
        print(f"  {role} plain decoding tokens/s: {out['plain_decode_tokens_per_s']}", flush=True)
    return out


def environment(device: str) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=torch.cuda.get_device_name(device), capability=f"{props.major}.{props.minor}",
                   memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True, help="JSON written after every section")
    parser.add_argument("--sections", default="golden,cost", help="comma list of golden, cost (default: %(default)s)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--quick", action="store_true", help="a few cases and two-layer models: try the script on a CPU"
    )
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu --quick to try the script")
    result = {"environment": environment(args.device), "golden": {}, "cost": {}, "errors": []}
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    def attempt(label: str, fn):
        started = time.perf_counter()
        print(f"{label} ...", flush=True)
        try:
            return fn()
        except Exception:  # record it and go on: the other sections still report
            result["errors"].append({"section": label, "error": traceback.format_exc()})
            print(traceback.format_exc(), flush=True)
        finally:
            print(f"{label}: {time.perf_counter() - started:.1f} s", flush=True)
            save()

    sections = args.sections.split(",")
    if "golden" in sections:
        for dtype in args.dtypes.split(","):
            for setup in SETUPS:
                result["golden"][f"{dtype} {setup}"] = attempt(f"golden {dtype} {setup}", lambda: golden_setup(
                    args.device, dtype, setup, args.max_new_tokens, args.quick))
    if "cost" in sections:
        for role in ARCHITECTURES:
            result["cost"][role] = attempt(f"cost {role}", lambda: cost_role(role, args.device, args.quick))
    save()
    print(f"wrote {out}; errors: {len(result['errors'])}")


if __name__ == "__main__":
    main()

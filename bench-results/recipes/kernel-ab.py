"""Interleaved T(k) of the packed GEMM at two git revisions of specpipe/engine/native/packed_gemm.c: each built
as specpipe.engine.native builds it (the host compiler, its FLAGS; -fopenmp for the revisions whose threads
were OpenMP's, before 2026-12-08), one packed verifier (W8A8 and W4A8: in the batched forward a service runs
them in), the kernels in turn at every forward (the order alternating), the best and the median of --repeats
(on a shared host the median is what a run meets); every forward's logits must be the same bits under both
kernels. --gemm: the GEMM alone at the model's layer shapes instead, on weights read from memory at every
call.

    python3 bench-results/recipes/kernel-ab.py --before d69ada6^ --after d69ada6 [--weights bf16]
    python3 bench-results/recipes/kernel-ab.py --before HEAD --after worktree --weights w4a8 --gemm --sizes 1,2,4,8,16

A revision of "worktree" is the file as it is in this checkout.

Both revisions must take the kernel arguments of this checkout (the int8 weights' scales came with
2026-11-29: compare revisions from then on, or revisions from before it in a checkout of before it).
"""

import argparse
import ctypes
import functools
import itertools
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch

from specpipe.config.presets import PRESETS, ModelSpec
from specpipe.engine import batched, native
from specpipe.engine import runner as runners
from specpipe.engine.kv import SlotKV
from specpipe.engine.models import load_model
from specpipe.engine.native import toolchain
from specpipe.models import packaged

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--before", default="HEAD^", help="git revision of the first kernel")
parser.add_argument("--after", default="HEAD", help="git revision of the second kernel")
parser.add_argument("--preset", default="qwen-coder", help="whose verifier runs the forwards")
parser.add_argument("--sizes", default="1,2,4,8,12,16,24,64", help="k: new tokens a forward")
parser.add_argument("--context", type=int, default=300, help="cached tokens before each forward")
parser.add_argument("--repeats", type=int, default=7)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--weights", default="fp32", choices=tuple(runners.PACKED_WEIGHTS),
                    help="the packed weights' precision (a GGUF model's w4a8: its own Q4_K blocks)")
parser.add_argument("--gemm", action="store_true",
                    help="time the GEMM alone at qwen-coder's layer shapes (k: rows), not the verifier's forwards")
args = parser.parse_args()


def build(revision: str, directory: pathlib.Path) -> ctypes.CDLL:
    source = directory / f"{revision.replace('/', '_')}.c"
    if revision == "worktree":
        source.write_text(toolchain.SOURCE.read_text())
    else:
        source.write_text(subprocess.run(["git", "show", f"{revision}:specpipe/engine/native/packed_gemm.c"],
                                         check=True, capture_output=True, text=True).stdout)
    target = source.with_suffix(".so")
    subprocess.run(["cc", *toolchain.FLAGS, "-fopenmp", str(source), "-o", str(target)], check=True)
    native.build = lambda cc=None: target  # library() declares the kernels' argument types
    native.library.cache_clear()
    return native.library()


def one_session(model, runner):
    """(forward(token_ids) -> logits, crop(length)) of one session, as a service runs the model: the batched
    forward over a slot where the weights round activations (they run batched only), else the runner's."""
    if args.weights not in runners.ROUNDED_ACTIVATIONS:
        cache = runner.new_cache()
        return functools.partial(runner.forward, cache), functools.partial(runners.crop, cache)
    config = model.config
    kv = SlotKV(config.num_hidden_layers, config.num_key_value_heads, config.hidden_size // config.num_attention_heads,
                torch.float32, torch.device("cpu"), args.context + 128)
    plans = {}  # kernel -> the layers' plans, which bind their kernel functions once

    def forward(token_ids):
        n = len(token_ids)
        positions, allowed = torch.arange(kv.length, kv.length + n), torch.ones(n, n, dtype=torch.bool).tril()
        if current[0] not in plans:
            plans[current[0]] = batched.layer_plans(model)
        segment = batched.Segment(kv, tuple(token_ids), positions, allowed, n)
        return batched.batched_forward(model, [segment], batched.min_rows(model), plans[current[0]])[0]

    def crop(length):
        kv.length = length

    return forward, crop


GEMM_SHAPES = {"gate+up": (17920, 1536), "down": (1536, 8960), "o": (1536, 1536)}  # qwen2.5-coder-1.5b's


def gemm_call(x, n, scale, copies):
    return lambda: native.packed_linear(x, next(copies), n, None, scale)


def gemm_calls(sizes):
    """(label, k) -> a call of the packed GEMM alone on k rows, on one of copies of a random weight (packed as
    --weights packs) that together outgrow the caches: each call reads its weight from memory, as a forward does."""
    calls = {}
    for shape, (n, k_in) in GEMM_SHAPES.items():
        w = torch.randn(n, k_in)
        if args.weights == "w4a8":
            packed, scale = native.pack_q4k(native.quantize_q4k(w)), None
        elif runners.PACKED_WEIGHTS[args.weights] in native.QUANTIZED:
            q, scale = native.quantize_int8(w)
            packed = native.pack_weight(q, runners.PACKED_WEIGHTS[args.weights])
        else:
            packed, scale = native.pack_weight(w, runners.PACKED_WEIGHTS[args.weights]), None
        copies = itertools.cycle([packed.clone() for _ in range(max(2, 400_000_000 // packed.nbytes))])
        for m in sizes:
            calls[shape, m] = gemm_call(torch.randn(m, k_in), n, scale, copies)
    return calls


torch.set_num_threads(args.threads)
sizes = [int(s) for s in args.sizes.split(",")]
times: dict[tuple[str, object], list[float]] = {}
with tempfile.TemporaryDirectory() as tmp:
    kernels = {revision: build(revision, pathlib.Path(tmp)) for revision in (args.before, args.after)}
    current = [kernels[args.before]]
    native.library = functools.partial(lambda box: box[0], current)  # the packed layers call library() each time
    if args.gemm:
        calls = gemm_calls(sizes)
    else:
        packaged.model_dir(PRESETS[args.preset].verifier)  # prepared here (`specpipe models prepare`): none is fetched
        model = load_model(ModelSpec(PRESETS[args.preset].verifier), packed=args.weights)
        forward, crop = one_session(model, runners.Runner(model, "packed", weights=args.weights))
        forward([(7 * i + 10) % 1000 for i in range(args.context)])
        calls = {("forward", k): functools.partial(lambda k: forward([11 + i for i in range(k)]), k) for k in sizes}
    for repeat in range(args.repeats):
        for key, call in calls.items():
            outputs = []
            for revision in list(kernels)[:: 1 if repeat % 2 == 0 else -1]:
                current[0] = kernels[revision]
                start = time.perf_counter()
                outputs.append(call())
                times.setdefault((revision, key), []).append(time.perf_counter() - start)
                if not args.gemm:
                    crop(args.context)
            assert torch.equal(outputs[0], outputs[1]), f"{key}: the kernels' outputs differ"
print(f"| what | k | {args.before} ms (best / median) | {args.after} ms (best / median) | after / before "
      "(best / median) |")
print("| --- | ---: | ---: | ---: | ---: |")
for label, k in calls:
    (b, bm), (a, am) = ((min(t), statistics.median(t)) for t in (times[r, (label, k)] for r in kernels))
    print(f"| {label} | {k} | {b * 1e3:.2f} / {bm * 1e3:.2f} | {a * 1e3:.2f} / {am * 1e3:.2f} | "
          f"{a / b:.2f} / {am / bm:.2f} |")

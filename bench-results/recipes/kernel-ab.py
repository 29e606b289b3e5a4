"""Interleaved T(k) of the packed GEMM at two git revisions of specpipe/engine/native/packed_gemm.c:
each built as specpipe.engine.native builds it (the host compiler, its FLAGS, OpenMP), one packed
verifier, the kernels in turn at every forward (the order alternating), best of --repeats; every
forward's logits must be the same bits under both kernels.

    python3 bench-results/recipes/kernel-ab.py --before d69ada6^ --after d69ada6 [--weights bf16]

Both revisions must take the kernel arguments of this checkout (the int8 weights' scales came with
2026-11-29: compare revisions from then on, or revisions from before it in a checkout of before it).
"""

import argparse
import ctypes
import functools
import pathlib
import subprocess
import tempfile
import time

import torch

from specpipe.config.presets import PRESETS, ModelSpec
from specpipe.engine import native
from specpipe.engine import runner as runners
from specpipe.engine.models import load_model
from specpipe.engine.native import toolchain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--before", default="HEAD^", help="git revision of the first kernel")
parser.add_argument("--after", default="HEAD", help="git revision of the second kernel")
parser.add_argument("--preset", default="qwen-coder", help="whose verifier runs the forwards")
parser.add_argument("--sizes", default="1,2,4,8,12,16,24,64", help="k: new tokens a forward")
parser.add_argument("--context", type=int, default=300, help="cached tokens before each forward")
parser.add_argument("--repeats", type=int, default=7)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--weights", default="fp32", choices=("fp32", "bf16"), help="the packed weights' precision")
args = parser.parse_args()


def build(revision: str, directory: pathlib.Path) -> ctypes.CDLL:
    source = directory / f"{revision.replace('/', '_')}.c"
    source.write_text(subprocess.run(["git", "show", f"{revision}:specpipe/engine/native/packed_gemm.c"],
                                     check=True, capture_output=True, text=True).stdout)
    target = source.with_suffix(".so")
    subprocess.run(["cc", *toolchain.FLAGS, "-fopenmp", str(source), "-o", str(target)], check=True)
    native.build = lambda cc=None: target  # library() declares the kernels' argument types
    native.library.cache_clear()
    return native.library()


torch.set_num_threads(args.threads)
with tempfile.TemporaryDirectory() as tmp:
    kernels = {revision: build(revision, pathlib.Path(tmp)) for revision in (args.before, args.after)}
    current = [kernels[args.before]]
    native.library = functools.partial(lambda box: box[0], current)  # the packed layers call library() each time
    runner = runners.Runner(load_model(ModelSpec(PRESETS[args.preset].verifier)), "packed", weights=args.weights)
    cache = runner.new_cache()
    runner.forward(cache, [(7 * i + 10) % 1000 for i in range(args.context)])
    sizes = [int(s) for s in args.sizes.split(",")]
    best: dict[str, dict[int, float]] = {revision: {} for revision in kernels}
    for repeat in range(args.repeats):
        for k in sizes:
            logits = []
            for revision in list(kernels)[:: 1 if repeat % 2 == 0 else -1]:
                current[0] = kernels[revision]
                start = time.perf_counter()
                logits.append(runner.forward(cache, [11 + i for i in range(k)]))
                seconds = time.perf_counter() - start
                runners.crop(cache, args.context)
                best[revision][k] = min(best[revision].get(k, seconds), seconds)
            assert torch.equal(logits[0], logits[1]), f"k={k}: the kernels' logits differ"
print(f"| k | {args.before} ms | T(k)/T(1) | {args.after} ms | T(k)/T(1) | after / before |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
before, after = best[args.before], best[args.after]
for k in sizes:
    print(f"| {k} | {before[k] * 1e3:.1f} | {before[k] / before[1]:.2f} | {after[k] * 1e3:.1f} | "
          f"{after[k] / after[1]:.2f} | {after[k] / before[k]:.2f} |")

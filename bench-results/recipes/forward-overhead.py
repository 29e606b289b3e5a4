"""What a batched forward costs beyond its GEMMs: one packed model's decode / verify step of n tokens
after a 150-token context, timed as it is and with every packed GEMM replaced by a call that does
nothing (the rest of the forward unchanged), median of --repeats. Run it at two revisions to compare:

    python3 bench-results/recipes/forward-overhead.py --preset smollm2
    git worktree add /tmp/before HEAD^ && PYTHONPATH=/tmp/before python3 bench-results/recipes/forward-overhead.py
"""

import argparse
import ctypes
import time

import torch

from specpipe.config.presets import PRESETS, ModelSpec
from specpipe.engine import batched, native, runner
from specpipe.engine.kv import new_slot
from specpipe.engine.models import load_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="smollm2")
parser.add_argument("--role", choices=("verifier", "drafter"), default="verifier",
                    help="the verifier (fp32 weights) or the drafter (bf16, as the product packs it)")
parser.add_argument("--sizes", default="1,4,9", help="n: new tokens a forward")
parser.add_argument("--repeats", type=int, default=41)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()

torch.set_num_threads(args.threads)
preset = PRESETS[args.preset]
spec = ModelSpec(preset.verifier) if args.role == "verifier" else ModelSpec(preset.drafter, preset.drafter_layers)
model = load_model(spec)
runner.Runner(model, "packed", weights="fp32" if args.role == "verifier" else "bf16")
slot = new_slot(model, 2048)


def segment(tokens: list[int]) -> batched.Segment:
    n, past = len(tokens), slot.length
    return batched.Segment(slot, tuple(tokens), torch.arange(past, past + n),
                           torch.ones(n, n, dtype=torch.bool).tril(), n)


def step_ms(forward, n: int) -> float:
    times = []
    for _ in range(args.repeats):
        step = segment([500 + i for i in range(n)])
        start = time.perf_counter()
        forward([step])
        times.append(time.perf_counter() - start)
        slot.crop(slot.length - n)
    return sorted(times)[len(times) // 2] * 1e3


def service_forward():
    """The forward as a service runs it (made after any patching below)."""
    return batched.service_forward(model, "packed", 2048)


forward = service_forward()
forward([segment(list(range(100, 250)))])  # the context
sizes = [int(s) for s in args.sizes.split(",")]
real = {n: step_ms(forward, n) for n in sizes}


def no_op(x, m, k, w, n, bias, y, threads) -> int:
    """The kernel's signature: zeros for y (no garbage floats downstream), success."""
    ctypes.memset(y, 0, m * n * 4)
    return 0


native._kernel = lambda dtype: no_op  # bound at plan time (after this change) or looked up per call
no_kernels = type("NoKernels", (), {"specpipe_packed_linear_f32": staticmethod(no_op),
                                    "specpipe_packed_linear_bf16": staticmethod(no_op)})()
native.library = lambda: no_kernels
forward = service_forward()
empty = {n: step_ms(forward, n) for n in sizes}
print(f"| n | forward ms | GEMMs as no-ops ms | ({args.preset} {args.role}, {args.threads} threads)")
print("| ---: | ---: | ---: |")
for n in sizes:
    print(f"| {n} | {real[n]:.2f} | {empty[n]:.2f} |")

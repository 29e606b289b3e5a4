"""Time the packed GEMM on a model's layer shapes, per packed weight and row count: the milliseconds one
kernel call takes (median of repeats, on the cores the process may use), and each weight's ratio to int8.
The shapes are qwen2.5-coder-1.5b's (its MLP's and attention output's); the weights random, rounded as
each packing rounds them.

    python3 bench-results/recipes/packed-gemm.py --weights int8,w8a8,w4a8 --rows 1,2,4,8,16 --json out.json
"""

import argparse
import json
import statistics
import time

import torch

from specpipe.engine import cores, native
from specpipe.engine.runner import PACKED_WEIGHTS

SHAPES = {"gate/up (8960 x 1536)": (8960, 1536), "down (1536 x 8960)": (1536, 8960), "o (1536 x 1536)": (1536, 1536)}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--weights", default="int8,w8a8,w4a8")
parser.add_argument("--rows", default="1,2,4,8,16")
parser.add_argument("--repeats", type=int, default=30)
parser.add_argument("--json", default=None)
args = parser.parse_args()
weights = args.weights.split(",")
rows = [int(m) for m in args.rows.split(",")]


def packed(w: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    dtype = PACKED_WEIGHTS[name]
    if dtype in native.QUANTIZED:
        q, scale = native.quantize_int8(w)
        return native.pack_weight(q, dtype), scale
    return native.pack_weight(w, dtype), None


def millis(weight: torch.Tensor, scale: torch.Tensor | None, n: int, x: torch.Tensor) -> float:
    for _ in range(3):
        native.packed_linear(x, weight, n, None, scale)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        native.packed_linear(x, weight, n, None, scale)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


torch.manual_seed(0)
results = []
print(f"threads: {cores.threads()}, W8A8 on {native.q8_simd()}, W4A8 on {native.q4_simd()}")
for shape, (n, k) in SHAPES.items():
    w = torch.randn(n, k)
    packs = {name: packed(w, name) for name in weights}
    for m in rows:
        x = torch.randn(m, k)
        ms = {name: millis(*packs[name], n, x) for name in weights}
        results.append({"shape": shape, "rows": m, "ms": ms})
        ratio = {name: f" ({ms['int8'] / ms[name]:.2f}x int8)" if "int8" in ms else "" for name in weights}
        print(f"{shape:22} M={m:2}: " + ", ".join(f"{name} {ms[name]:.2f} ms{ratio[name]}" for name in weights),
              flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"threads": cores.threads(), "q8_simd": native.q8_simd(), "q4_simd": native.q4_simd(),
                   "results": results}, f, indent=1)

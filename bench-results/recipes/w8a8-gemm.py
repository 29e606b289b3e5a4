"""The packed GEMM on int8 weights, fp32 arithmetic ("int8") against int8 activations in integer dot
products ("w8a8"), at one of qwen-coder's MLP shapes (8960 x 1536, random weights), for the row counts
decoding, verification and a prompt feed: best of --repeats of --calls calls, ms a call.

    python3 bench-results/recipes/w8a8-gemm.py [--rows 1,4,8,16,150] [--json out.json]
"""

import argparse
import json
import time

import torch

from specpipe.engine import native

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", default="1,4,6,8,12,16,150", help="M: rows (tokens) a call")
parser.add_argument("--out-features", type=int, default=8960)
parser.add_argument("--in-features", type=int, default=1536)
parser.add_argument("--calls", type=int, default=20)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--json", default=None)
args = parser.parse_args()

torch.manual_seed(0)
n, k = args.out_features, args.in_features
q, scale = native.quantize_int8(torch.randn(n, k))
layers = {name: native.bound_linear(native.pack_weight(q, dtype), n, None, scale)
          for name, dtype in (("int8", torch.int8), ("w8a8", torch.uint8))}
rows = []
for m in map(int, args.rows.split(",")):
    x = torch.randn(m, k)
    row = {"rows": m}
    for name, layer in layers.items():
        layer(x)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.calls):
                layer(x)
            best = min(best, (time.perf_counter() - start) / args.calls)
        row[f"{name}_ms"] = best * 1e3
    row["int8_over_w8a8"] = row["int8_ms"] / row["w8a8_ms"]
    rows.append(row)
    print(f"M={m:4d}  int8 {row['int8_ms']:.3f} ms  w8a8 {row['w8a8_ms']:.3f} ms  {row['int8_over_w8a8']:.2f}x")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)

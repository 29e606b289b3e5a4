"""T(k) of one model's packed forward with its weights in each precision, the precisions in turn at every
forward (the order alternating), best of --repeats: what --draft-weights (or --verifier-weights) costs
per forward of k new tokens after --context cached ones.

    python3 bench-results/recipes/weights-tk.py --role drafter --weights bf16,int8
    python3 bench-results/recipes/weights-tk.py --role verifier --weights fp32,bf16 --sizes 1,8,16
"""

import argparse
import time

import torch

from specpipe.config.presets import model_specs
from specpipe.engine import runner as runners
from specpipe.engine.models import load_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="qwen-coder")
parser.add_argument("--role", default="drafter", choices=("verifier", "drafter"))
parser.add_argument("--weights", default="bf16,int8", help="the arms: packed weights' precisions (fp32, bf16, int8)")
parser.add_argument("--sizes", default="1,2,4,8,16", help="k: new tokens a forward")
parser.add_argument("--context", type=int, default=300, help="cached tokens before each forward")
parser.add_argument("--repeats", type=int, default=15)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()

torch.set_num_threads(args.threads)
spec = model_specs(args.preset)[args.role == "drafter"]
weights = args.weights.split(",")
arms = {w: runners.Runner(load_model(spec), "packed", weights=w) for w in weights}
caches = {w: arm.new_cache() for w, arm in arms.items()}
for w, arm in arms.items():
    arm.forward(caches[w], [(7 * i + 10) % 1000 for i in range(args.context)])
sizes = [int(s) for s in args.sizes.split(",")]
best: dict[str, dict[int, float]] = {w: {} for w in weights}
for repeat in range(args.repeats):
    for k in sizes:
        for w in weights[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            arms[w].forward(caches[w], [11 + i for i in range(k)])
            seconds = time.perf_counter() - start
            runners.crop(caches[w], args.context)
            best[w][k] = min(best[w].get(k, seconds), seconds)
print(
    "| k | "
    + " | ".join(f"{w} ms" for w in weights)
    + " | "
    + " | ".join(f"{w} / {weights[0]}" for w in weights[1:])
    + " |"
)
print("| ---: |" + " ---: |" * (2 * len(weights) - 1))
for k in sizes:
    times = [best[w][k] for w in weights]
    print(f"| {k} | " + " | ".join(f"{t * 1e3:.1f}" for t in times) + " | "
          + " | ".join(f"{t / times[0]:.2f}" for t in times[1:]) + " |")

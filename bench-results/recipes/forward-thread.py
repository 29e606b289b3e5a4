"""A verifier's forward of k tokens (--sizes; after a --context-token prompt) timed on the main thread
and on a thread of its own, as a service's scheduler runs it, after the main thread ran the model (loading,
a prompt): the median and best of --repeats each, the CPU switches a forward made, and whether the
logits are the same bits. Run it at two revisions to compare:

    python3 bench-results/recipes/forward-thread.py
    git worktree add /tmp/before HEAD^ && PYTHONPATH=/tmp/before python3 bench-results/recipes/forward-thread.py
"""

# ruff: noqa: I001 (specpipe first: the process settings it makes before torch loads, specpipe/__init__.py)
import argparse
import resource
import statistics
import threading
import time

import specpipe  # noqa: F401
import torch

from specpipe.config.presets import PRESETS, ModelSpec
from specpipe.engine import batched
from specpipe.engine import runner as runners
from specpipe.engine.kv import new_slot
from specpipe.engine.models import load_model
from specpipe.models import packaged

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="qwen-coder")
parser.add_argument("--weights", default="w4a8", choices=tuple(runners.PACKED_WEIGHTS))
parser.add_argument("--context", type=int, default=300)
parser.add_argument("--sizes", default="1", help="k: new tokens a forward")
parser.add_argument("--repeats", type=int, default=25)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()

torch.set_num_threads(args.threads)
packaged.model_dir(PRESETS[args.preset].verifier)  # prepared here (`specpipe models prepare`): none is fetched
model = load_model(ModelSpec(PRESETS[args.preset].verifier), packed=args.weights)
runners.Runner(model, "packed", weights=args.weights)
slot, plans = new_slot(model, args.context + 64), batched.layer_plans(model)


def forward(tokens: list[int]) -> torch.Tensor:
    n, past = len(tokens), slot.length
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    segment = batched.Segment(slot, tuple(tokens), torch.arange(past, past + n), allowed, n)
    return batched.batched_forward(model, [segment], 1, plans)[0]


forward([(7 * i + 10) % 1000 for i in range(args.context)])
sizes = [int(k) for k in args.sizes.split(",")]
results: dict[tuple[str, int], tuple[list[float], float, torch.Tensor]] = {}


def timed(where: str) -> None:
    for k in sizes:
        times, logits = [], None
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(args.repeats):
            start = time.perf_counter()
            logits = forward([11 + i for i in range(k)])
            times.append(time.perf_counter() - start)
            slot.length = args.context
        after = resource.getrusage(resource.RUSAGE_SELF)
        results[where, k] = (times, (after.ru_nvcsw - before.ru_nvcsw) / args.repeats, logits)


timed("main thread")
thread = threading.Thread(target=timed, args=("a thread of its own",))
thread.start()
thread.join()
print(f"| {args.preset} {args.weights}, {args.threads} threads | k | median ms | best ms | switches a forward |")
print("| --- | ---: | ---: | ---: | ---: |")
for (where, k), (times, switches, _) in results.items():
    print(f"| {where} | {k} | {statistics.median(times) * 1e3:.1f} | {min(times) * 1e3:.1f} | {switches:.0f} |")
same = all(torch.equal(results["main thread", k][2], results["a thread of its own", k][2]) for k in sizes)
print("same logits on both threads:", same)

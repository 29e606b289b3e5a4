"""A verifier's one-token forward (after a --context-token prompt) timed on the main thread and on a
thread of its own, as a service's scheduler runs it, after the main thread ran the model (loading,
a prompt): the median and best of --repeats each, the CPU switches a forward made, and whether the
logits are the same bits. Run it at two revisions to compare:

    python3 bench-results/recipes/forward-thread.py
    git worktree add /tmp/before HEAD^ && PYTHONPATH=/tmp/before python3 bench-results/recipes/forward-thread.py
"""

import argparse
import resource
import statistics
import threading
import time

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
results: dict[str, tuple[list[float], float, torch.Tensor]] = {}


def timed(where: str) -> None:
    times, logits = [], None
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.repeats):
        start = time.perf_counter()
        logits = forward([11])
        times.append(time.perf_counter() - start)
        slot.length = args.context
    after = resource.getrusage(resource.RUSAGE_SELF)
    switches = (after.ru_nvcsw - before.ru_nvcsw) / args.repeats
    results[where] = (times, switches, logits)


timed("main thread")
thread = threading.Thread(target=timed, args=("a thread of its own",))
thread.start()
thread.join()
print(f"| {args.preset} {args.weights}, {args.threads} threads | median ms | best ms | voluntary switches a forward |")
print("| --- | ---: | ---: | ---: |")
for where, (times, switches, _) in results.items():
    print(f"| {where} | {statistics.median(times) * 1e3:.1f} | {min(times) * 1e3:.1f} | {switches:.0f} |")
(_, _, main), (_, _, other) = results.values()
print("same logits on both threads:", torch.equal(main, other))

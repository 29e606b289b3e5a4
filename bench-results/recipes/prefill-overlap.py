"""A prompt's prefill by the verifier alone, then overlapped with the drafter's prefill of the same
prompt on the same cores, as in one process (specpipe.engine.cores: the forward that starts first
keeps every core, the later one gets what is left, at least one): what the verifier's prefill, and so
the time to the first token, pays when the drafter's warm-up runs beside it.

    python3 bench-results/recipes/prefill-overlap.py --verifier-weights bf16
"""

import argparse
import threading
import time

import torch

from specpipe.config.presets import PRESETS, ModelSpec
from specpipe.engine import cores
from specpipe.engine import runner as runners
from specpipe.engine.models import load_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="qwen-coder")
parser.add_argument("--verifier-weights", default="fp32", choices=("fp32", "bf16", "int8"))
parser.add_argument("--draft-weights", default="bf16", choices=("fp32", "bf16"))
parser.add_argument("--tokens", type=int, default=150, help="the prompt's length")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--repeats", type=int, default=3)
args = parser.parse_args()

torch.set_num_threads(args.threads)
preset = PRESETS[args.preset]
models = {"verifier": runners.Runner(load_model(ModelSpec(preset.verifier)), "packed", weights=args.verifier_weights),
          "drafter": runners.Runner(load_model(ModelSpec(preset.drafter, preset.drafter_layers)), "packed",
                                    weights=args.draft_weights)}
prompt = [(7 * i + 10) % 1000 for i in range(args.tokens)]


def prefill(role: str, ms: dict[str, float], delay_s: float = 0.0) -> None:
    time.sleep(delay_s)
    runner = models[role]
    cache = runner.new_cache()
    start = time.perf_counter()
    with cores.forward(role):
        runner.forward(cache, prompt)
    ms[role] = (time.perf_counter() - start) * 1e3


print("| run | verifier alone ms | drafter alone ms | sum | verifier overlapped ms | drafter overlapped ms |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for repeat in range(args.repeats):
    alone: dict[str, float] = {}
    prefill("verifier", alone)
    prefill("drafter", alone)
    overlapped: dict[str, float] = {}
    threads = [threading.Thread(target=prefill, args=("verifier", overlapped)),
               threading.Thread(target=prefill, args=("drafter", overlapped, 0.02))]  # the verifier first
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(
        f"| {repeat + 1} | {alone['verifier']:.0f} | {alone['drafter']:.0f} "
        f"| {alone['verifier'] + alone['drafter']:.0f} "
        f"| {overlapped['verifier']:.0f} | {overlapped['drafter']:.0f} |"
    )

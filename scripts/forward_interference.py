"""How much a drafter's work on the other core slows the verifier's forward
(docs/results/2026-11-25-load-curve-256-tokens.md, "What a drafter costs the verifier"): the verifier's
batched forward of n tokens, pinned to one core, timed while a drafter process pinned to another core is idle,
decodes (steps of one token per session, as when drafting), or catches up (chunks of 32 tokens, as a warm-up
feeds them).

    PYTHONPATH=. python scripts/forward_interference.py --preset qwen-coder --tokens 1,8,16

The drafter loads are taken in turns, a few forwards each, over several passes, so a drift of the
host falls on all alike. Both processes use the served forward (packed where a C compiler is there).
A measurement, not a test: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import torch
from tqdm import tqdm

from orchestrator.schedules import WARM_LAG
from specpipe.config.presets import model_specs
from specpipe.core.verification import tree_allowed, tree_position_ids
from specpipe.engine import batched
from specpipe.engine.batched import Segment
from specpipe.engine.kv import new_slot
from specpipe.engine.models import load_model
from specpipe.engine.native import toolchain
from specpipe.engine.runner import Runner

LOADS = ("idle", "decode", "catch-up")
CONTEXT = 300          # cached positions before each forward
SESSIONS = 8           # the verifier's sessions, and the drafter's in its decode steps


def _model(spec, core: int):
    """The model on one core, its linear layers packed as served (eager without a C compiler)."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    model = load_model(spec, "cpu")
    Runner(model, "packed" if toolchain.unavailable() is None else "eager")  # packs the linears in place
    return model


def _segments(slots, tokens: int) -> list[Segment]:
    """One segment per slot, tokens split over them as rounds (a chain each), after CONTEXT cached."""
    per, extra = divmod(tokens, len(slots))
    segments = []
    for i, slot in enumerate(slots):
        n = per + (i < extra)
        if n == 0:
            continue
        slot.crop(CONTEXT)
        parents = list(range(-1, n - 2))  # the draft nodes after the root: a chain of n - 1
        segments.append(Segment(slot, tuple([11] * n), tree_position_ids(parents, CONTEXT)[0],
                                tree_allowed(parents, 0), n))
    return segments


def _prefilled_slots(model, count: int) -> list:
    """count slots, each holding the same CONTEXT-token prompt."""
    prompt = tuple((7 * i + 10) % model.config.vocab_size for i in range(CONTEXT))
    causal = torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).tril()
    slots = [new_slot(model, 4096) for _ in range(count)]
    batched.batched_forward(model, [Segment(slot, prompt, torch.arange(CONTEXT), causal, 0) for slot in slots])
    return slots


def drafter_loop(spec, core: int, load, ready, stop) -> None:
    """Runs the drafter's forwards back to back while load says what to run (idle: sleeps)."""
    model = _model(spec, core)
    slots = _prefilled_slots(model, SESSIONS)
    ready.set()
    while not stop.is_set():
        kind = LOADS[load.value]
        if kind == "idle":
            time.sleep(0.005)
            continue
        tokens = SESSIONS if kind == "decode" else WARM_LAG  # a warm-up feeds WARM_LAG tokens
        batched.batched_forward(model, _segments(slots if kind == "decode" else slots[:1], tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument(
        "--tokens", default="1,8,16", help=f"verifier tokens per forward, spread over {SESSIONS} sessions"
    )
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=4, help="timed forwards per load per pass")
    parser.add_argument("--out", default=None, help="write the medians and every sample (ms) as JSON here")
    args = parser.parse_args()
    verifier_spec, drafter_spec = model_specs(args.preset)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores: one for the verifier, one for the drafter")
    ctx = mp.get_context("spawn")
    load, ready, stop = ctx.Value("i", 0), ctx.Event(), ctx.Event()
    drafter = ctx.Process(target=drafter_loop, args=(drafter_spec, cores[1], load, ready, stop), daemon=True)
    drafter.start()
    model = _model(verifier_spec, cores[0])
    slots = _prefilled_slots(model, SESSIONS)
    ready.wait()
    sizes = [int(t) for t in args.tokens.split(",")]
    times: dict[tuple[str, int], list[float]] = {(kind, n): [] for kind in LOADS for n in sizes}
    try:
        for _ in tqdm(range(args.passes), desc="passes"):
            for i, kind in enumerate(LOADS):
                load.value = i
                time.sleep(0.3)  # the drafter's forward in flight ends, the new load starts
                for n in sizes:
                    batched.batched_forward(model, _segments(slots, n))  # not timed
                    for _ in range(args.forwards):
                        segments = _segments(slots, n)
                        start = time.perf_counter()
                        batched.batched_forward(model, segments)
                        times[kind, n].append((time.perf_counter() - start) * 1e3)
    finally:
        stop.set()
        drafter.join(timeout=30)
    medians = {f"{kind} {n}": statistics.median(v) for (kind, n), v in times.items()}
    print(f"verifier forward ms (median of {args.passes * args.forwards}), drafter on the other core:")
    print("| tokens | " + " | ".join(LOADS) + " | " + " | ".join(f"{k} / idle" for k in LOADS[1:]) + " |")
    print("| ---: |" + " ---: |" * (2 * len(LOADS) - 1))
    for n in sizes:
        idle = medians[f"idle {n}"]
        row = [f"{medians[f'{kind} {n}']:.1f}" for kind in LOADS]
        row += [f"{medians[f'{kind} {n}'] / idle:.3f}x" for kind in LOADS[1:]]
        print(f"| {n} | " + " | ".join(row) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"preset": args.preset, "cores": cores, "medians_ms": medians,
                       "samples_ms": {f"{k} {n}": v for (k, n), v in times.items()}}, f, indent=1)


if __name__ == "__main__":
    main()

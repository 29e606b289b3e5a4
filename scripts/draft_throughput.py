"""Proposals/s of N sessions drafting at once with the model drafter alone: batched (every pending
proposal's next step in one forward) against one proposal per forward, in one run.

    PYTHONPATH=. python scripts/draft_throughput.py --preset smollm2 --concurrency 1,4,8 --compile on

Each session proposes `--rounds` chains of 4 along a growing context (2 draft tokens kept and one
other token each round, so every proposal re-syncs its cache by longest common prefix). The final
drafts of both configurations must be equal (batching changes no draft). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from drafter_service.model_drafter import ModelDrafter
from specpipe.config.presets import model_specs
from specpipe.core.types import GREEDY, ProposeRequest
from specpipe.engine.models import load_model, load_tokenizer, model_info
from tests.golden import GOLDEN_PROMPTS


def session(drafter: ModelDrafter, session_id: str, prompt: list[int], rounds: int) -> tuple[int, ...]:
    context = list(prompt)
    for _ in range(rounds):
        draft = drafter.propose(ProposeRequest(session_id, context, 4, 1, GREEDY)).draft
        context += [*draft.tokens[:2], 7]
    drafter.release(session_id)
    return draft.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--compile", default="off", choices=("off", "on"), help="on: the packed CPU GEMM")
    args = parser.parse_args()
    torch.set_num_threads(1)
    verifier_spec, drafter_spec = model_specs(args.preset)
    tokenizer = load_tokenizer(verifier_spec)
    model = load_model(drafter_spec)
    info = model_info(drafter_spec, model)
    mode = "packed" if args.compile == "on" else "eager"
    drafters = {"one proposal per forward": ModelDrafter(model, info, mode=mode, batching=False),
                "batched": ModelDrafter(model, info, mode="eager")}  # the model is packed once, by the first
    prompts = [list(tokenizer(p)["input_ids"]) for p in GOLDEN_PROMPTS]
    for drafter in drafters.values():  # warm-up
        session(drafter, "warm-up", prompts[0], 1)
    print(f"{'sessions':>8} | " + " | ".join(f"{name:>24}" for name in drafters) + " | speed-up")
    for n in (int(c) for c in args.concurrency.split(",")):
        rates, drafts = [], []
        for name, drafter in drafters.items():
            finals: list = [None] * n
            threads = [threading.Thread(target=lambda i=i: finals.__setitem__(i, session(
                drafter, f"{name}-{n}-{i}", prompts[i % len(prompts)], args.rounds))) for i in range(n)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rates.append(n * args.rounds / (time.perf_counter() - start))
            drafts.append(finals)
        if drafts[0] != drafts[1]:
            raise SystemExit("batching changed a draft: this is a bug")
        print(
            f"{n:>8} | " + " | ".join(f"{rate:>12.1f} proposals/s" for rate in rates) + f" | {rates[1] / rates[0]:.2f}x"
        )


if __name__ == "__main__":
    main()

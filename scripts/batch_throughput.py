"""Aggregate tokens/s of N concurrent embedded generations: the batched verifier (and, with
--drafter model, the batched model drafter) against one session per forward (the services before
batching), on the same prompts, in one run.

    PYTHONPATH=. python scripts/batch_throughput.py --preset smollm2 --concurrency 1,2,4,8 --compile on
    PYTHONPATH=. python scripts/batch_throughput.py --preset smollm2 --concurrency 1,4,8 --compile on --drafter model

Greedy; every output is checked against the first configuration's (batching changes no token).
A measurement, not a test: absolute numbers depend on the machine; compare rows of one run.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from orchestrator.generator import Generator
from specpipe.config.presets import model_specs
from specpipe.core.types import GenerationRequest, SpeculationOptions
from specpipe.engine.models import load_model, load_tokenizer, model_info
from tests.golden import GOLDEN_PROMPTS, run
from verifier_service.verifier import ModelVerifier


def generate_concurrently(generator: Generator, requests: list[GenerationRequest]) -> tuple[list[list[int]], float]:
    """Every request on its own thread at once; returns the outputs and the wall time in seconds."""
    outputs: list[list[int]] = [[] for _ in requests]

    def one(i: int) -> None:
        outputs[i] = run(generator, requests[i])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outputs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafter", default="none", choices=("none", "model"),
                        help="none: plain (batched) decoding; model: speculation with the preset's drafter "
                        "(batched along with the verifier, or one proposal per forward along with it)")
    parser.add_argument("--adaptive", default="on", choices=("on", "off"),
                        help="on: adaptive control picks k <= 4 each round (the default); off: k = 4 fixed")
    parser.add_argument("--schedule", default="sequential", choices=("sequential", "branch"))
    parser.add_argument("--compile", default="off", choices=("off", "on"), help="on: the packed CPU GEMM")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    verifier_spec, drafter_spec = model_specs(args.preset)
    tokenizer = load_tokenizer(verifier_spec)
    model = load_model(verifier_spec)
    mode = "packed" if args.compile == "on" else "eager"
    info = model_info(verifier_spec, model)  # before packing (it reads the lm_head's weight)
    # configuration -> (verifier, drafters); each model is packed once, by its first service
    services = {"one session per forward": (ModelVerifier(model, info, mode=mode, batching=False), {}),
                "batched": (ModelVerifier(model, info, mode="eager"), {})}
    if args.drafter == "model":
        from drafter_service.model_drafter import ModelDrafter

        draft_model = load_model(drafter_spec)
        draft_info = model_info(drafter_spec, draft_model)
        services["one session per forward"][1]["model"] = ModelDrafter(
            draft_model, draft_info, mode=mode, batching=False
        )
        services["batched"][1]["model"] = ModelDrafter(draft_model, draft_info, mode="eager")
    speculation = SpeculationOptions(drafter=args.drafter, draft_len=4, adaptive=args.adaptive, schedule=args.schedule)
    prompts = [tuple(tokenizer(p)["input_ids"]) for p in GOLDEN_PROMPTS]
    for verifier, drafters in services.values():  # warm-up: first-call costs are not the batching's
        generate_concurrently(Generator(tokenizer, verifier, drafters, speculation),
                              [GenerationRequest(prompts[0], 8, speculation=speculation)])
    print(f"preset {args.preset}, drafter {args.drafter}, adaptive {args.adaptive}, {args.schedule}, {mode}, "
          f"{args.max_new_tokens} new tokens per stream")
    print(f"{'streams':>7} | " + " | ".join(f"{name:>24}" for name in services) + " | speed-up")
    for n in (int(c) for c in args.concurrency.split(",")):
        requests = [GenerationRequest(prompts[i % len(prompts)], args.max_new_tokens, speculation=speculation)
                    for i in range(n)]
        rates, reference = [], None
        for verifier, drafters in services.values():
            generator = Generator(tokenizer, verifier, drafters, speculation)
            outputs, seconds = generate_concurrently(generator, requests)
            reference = reference or outputs
            if outputs != reference:
                raise SystemExit("batching changed an output: this is a bug")
            rates.append(sum(len(o) for o in outputs) / seconds)
        print(f"{n:>7} | " + " | ".join(f"{rate:>18.1f} tok/s" for rate in rates) + f" | {rates[1] / rates[0]:.2f}x")


if __name__ == "__main__":
    main()

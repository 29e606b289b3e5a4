"""Aggregate tokens/s of N concurrent embedded generations: the batched verifier against one
session per forward (the verifier before batching), on the same prompts, in one run.

    PYTHONPATH=. python scripts/batch_throughput.py --preset smollm2 --concurrency 1,2,4,8 --compile on

Greedy; every output is checked against the first configuration's (batching changes no token).
A measurement, not a test: absolute numbers depend on the machine; compare rows of one run.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from orchestrator.generator import Generator
from specpipe.models import load_model, load_tokenizer, model_info
from specpipe.presets import model_specs
from specpipe.types import GenerationRequest, SpeculationOptions
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
                        "(the drafter itself is not batched)")
    parser.add_argument("--compile", default="off", choices=("off", "on"), help="on: the packed CPU GEMM")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    verifier_spec, drafter_spec = model_specs(args.preset)
    tokenizer = load_tokenizer(verifier_spec)
    model = load_model(verifier_spec)
    mode = "packed" if args.compile == "on" else "eager"
    drafters = {}
    if args.drafter == "model":
        from drafter_service.model_drafter import ModelDrafter

        drafters["model"] = ModelDrafter.load(drafter_spec, mode=mode)
    info = model_info(verifier_spec, model)  # before packing (it reads the lm_head's weight)
    verifiers = {"one session per forward": ModelVerifier(model, info, mode=mode, batching=False),
                 "batched": ModelVerifier(model, info, mode="eager")}  # the model is packed once, by the first
    speculation = SpeculationOptions(drafter=args.drafter, draft_len=4)
    prompts = [tuple(tokenizer(p)["input_ids"]) for p in GOLDEN_PROMPTS]
    for verifier in verifiers.values():  # warm-up: first-call costs are not the batching's
        generate_concurrently(Generator(tokenizer, verifier, drafters, speculation),
                              [GenerationRequest(prompts[0], 8, speculation=speculation)])
    print(f"preset {args.preset}, drafter {args.drafter}, {mode}, {args.max_new_tokens} new tokens per stream")
    print(f"{'streams':>7} | " + " | ".join(f"{name:>24}" for name in verifiers) + " | speed-up")
    for n in (int(c) for c in args.concurrency.split(",")):
        requests = [GenerationRequest(prompts[i % len(prompts)], args.max_new_tokens, speculation=speculation)
                    for i in range(n)]
        rates, reference = [], None
        for verifier in verifiers.values():
            generator = Generator(tokenizer, verifier, drafters, speculation)
            outputs, seconds = generate_concurrently(generator, requests)
            reference = reference or outputs
            if outputs != reference:
                raise SystemExit("batching changed an output: this is a bug")
            rates.append(sum(len(o) for o in outputs) / seconds)
        print(f"{n:>7} | " + " | ".join(f"{rate:>18.1f} tok/s" for rate in rates) + f" | {rates[1] / rates[0]:.2f}x")


if __name__ == "__main__":
    main()

"""Exact repeats: the same chat prompts sent several times to one embedded generator with the
defaults (the n-gram drafter, learning on), printing tokens per verifier forward and tokens/s of each
try, and whether each output equals the first (which drafted from nothing the store had learned).

    python3 scripts/exact_repeat.py --preset smollm2 --max-new-tokens 80 [--cache redis://...]
"""

from __future__ import annotations

import argparse
import time

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config
from specpipe.core.types import GenerationRequest

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number, with a docstring and an example.",
           "Explain in three sentences why the sky is blue.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smollm2")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--cache", default="memory", help="the n-gram store (default: %(default)s)")
    args = parser.parse_args()
    generator = embedded_generator(generator_config({"preset": args.preset, "cache": args.cache}))
    print("| prompt | try | tokens | verifier forwards | tokens per forward | tokens/s | same as try 0 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for prompt in PROMPTS:
        first = None
        for attempt in range(args.tries):
            start, tokens, rounds = time.perf_counter(), [], 0
            for chunk in generator.generate(
                GenerationRequest(generator.encode(messages=(("user", prompt),)), args.max_new_tokens)
            ):
                tokens += chunk.token_ids
                rounds += chunk.round is not None
            seconds = time.perf_counter() - start
            first = tokens if first is None else first
            print(f"| {prompt[:32]}... | {attempt} | {len(tokens)} | {rounds} | {len(tokens) / max(rounds, 1):.2f} | "
                  f"{len(tokens) / seconds:.1f} | {tokens == first} |", flush=True)


if __name__ == "__main__":
    main()

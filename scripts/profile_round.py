"""Where a round's time goes: one embedded generator with the defaults (or the flags given) decodes
a suite's prompt to warm up, then the next one (or --prompt) measured; prints the round parts of the
generation and of its median round (RoundStats: specpipe.core.types.ROUND_PARTS, with the verifier's
forward inside the verify call), and the orchestrator thread's Python profile (cProfile, by own time)
of the measured generation. Pure Python work of the orchestrator shows in the profile; the verifier's
forward runs on its batch thread and shows only as the call's wait. docs/profile.md reads one.

    python3 scripts/profile_round.py --preset smollm2 --suite humaneval --index 0 --max-new-tokens 128
    python3 scripts/profile_round.py --preset smollm2 --prompt "Explain why the sky is blue."
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from specpipe.app.wiring import embedded_generator
from specpipe.bench.measure import ORCHESTRATION, time_parts
from specpipe.bench.prompts import load_suite
from specpipe.config.services import generator_config
from specpipe.core.types import ROUND_PARTS, GenerationRequest, RoundStats


def round_row(name: str, stats: RoundStats) -> str:
    cells = [getattr(stats, f"{part}_ms") for part in ROUND_PARTS]
    return f"| {name} | {stats.drafted} | {stats.accepted} | " + " | ".join(f"{ms:.2f}" for ms in cells) + \
        f" | {stats.verify_ms:.2f} | {sum(cells):.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smollm2")
    parser.add_argument("--suite", default="humaneval")
    parser.add_argument("--index", type=int, default=0, help="which prompt of the suite (default: %(default)s)")
    parser.add_argument("--prompt", default=None, help="profile this chat message instead of a suite's prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", default=None, help="the drafter (default: the product's)")
    parser.add_argument("--schedule", default=None, help="the schedule (default: the product's)")
    parser.add_argument("--verifier-weights", default="fp32", choices=("fp32", "bf16", "int8"))
    parser.add_argument("--top", type=int, default=15, help="profile lines to print (default: %(default)s)")
    args = parser.parse_args()
    values = {"preset": args.preset, "verifier_weights": args.verifier_weights}
    values |= {key: value for key, value in (("drafter", args.drafter), ("schedule", args.schedule)) if value}
    generator = embedded_generator(generator_config(values))
    first, second = load_suite(args.suite, args.index + 2)[args.index:]
    warm_up, measured = (first.messages, second.messages) if args.prompt is None else \
        (second.messages, (("user", args.prompt),))
    # a warm-up on another prompt: the n-gram store learns its output, which would make a repeat exact
    list(generator.generate(GenerationRequest(generator.encode(messages=warm_up), args.max_new_tokens,
                                              speculation=generator.defaults)))
    request = GenerationRequest(
        generator.encode(messages=measured), args.max_new_tokens, speculation=generator.defaults
    )
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    chunks = list(generator.generate(request))
    profile.disable()
    wall_ms = (time.perf_counter() - start) * 1e3
    rounds = [c.round for c in chunks if c.round is not None]
    tokens = sum(len(c.token_ids) for c in chunks)
    what = "the given prompt" if args.prompt else f"{args.suite} prompt {args.index + 2}"
    print(f"{args.preset}, {what}: {tokens} tokens in {len(rounds)} rounds, "
          f"{wall_ms:.0f} ms ({tokens / wall_ms * 1e3:.2f} tokens/s)\n")
    parts = time_parts(rounds, wall_ms)
    print("| part | ms | share of the wall time |\n| --- | ---: | ---: |")
    for part, ms in parts.items():
        print(f"| {part}{' (orchestration)' if part in ORCHESTRATION else ''} | {ms:.1f} | {ms / wall_ms:.1%} |")
    orchestration = sum(parts[p] for p in ORCHESTRATION)
    print(f"| orchestration, all | {orchestration:.1f} | {orchestration / wall_ms:.1%} |\n")
    decode = rounds[1:]
    median = sorted(decode, key=lambda r: sum(getattr(r, f"{p}_ms") for p in ROUND_PARTS))[len(decode) // 2]
    print("| round | drafted | accepted | " + " | ".join(f"{p} ms" for p in ROUND_PARTS) +
          " | of the call: forward ms | all ms |")
    print("| --- |" + " ---: |" * (len(ROUND_PARTS) + 4))
    print(round_row("first", rounds[0]))
    print(round_row("median", median))
    mean = RoundStats(
        round(statistics.mean(r.drafted for r in decode)),
        round(statistics.mean(r.accepted for r in decode)),
        0.0,
        statistics.mean(r.verify_ms for r in decode),
        **{f"{p}_ms": statistics.mean(getattr(r, f"{p}_ms") for r in decode) for p in ROUND_PARTS},
    )
    print(round_row("mean after the first", mean))
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print("\nThe orchestrator thread, by own time (waits for the verifier and drafter threads included):")
    print(out.getvalue())


if __name__ == "__main__":
    main()

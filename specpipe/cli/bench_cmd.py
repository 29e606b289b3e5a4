"""`specpipe bench`: verifier-only greedy vs speculative on a prompt suite, in one run."""

from __future__ import annotations

import argparse
import json
import os
import platform

from dataclasses import replace

from specpipe.cli import options
from specpipe.errors import InvalidArgument
from specpipe.types import DRAFTER_KINDS

SUITES = ("humaneval", "mtbench", "gsm8k")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the verifier alone",
        description="Run verifier-only transformers greedy generate() and speculative decoding on the same "
        "prompts in one run; report tokens/s, speed-up, tokens per verify call, and whether every output "
        "is identical to the baseline. One CPU core per service: --threads 1 --pin (the default).",
    )
    parser.add_argument("--suite", choices=SUITES, default="humaneval", help="prompt suite (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=10, help="prompts from the suite (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--drafters", default=None, metavar="LIST",
                        help="comma-separated drafters to compare in this run, e.g. model,ngram,hybrid "
                        "(default: the one --drafter names)")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin the process to one CPU core (pinned by default)")
    options.add_model_args(parser)
    options.add_speculation_args(parser)
    parser.set_defaults(func=run, threads=1)


def run(args: argparse.Namespace) -> int:
    from specpipe.bench import benchmark, markdown_table, to_json
    from specpipe.cli.wiring import embedded_generator
    from specpipe.prompts import load_suite

    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    kinds = tuple(args.drafters.split(",")) if args.drafters else (args.drafter,)
    unknown = [k for k in kinds if k not in DRAFTER_KINDS]
    if unknown:
        raise InvalidArgument(f"unknown drafters {unknown}; choose from {', '.join(DRAFTER_KINDS)}")
    if args.cache != "memory":
        raise InvalidArgument("bench gives each method a fresh in-memory n-gram store (so no method drafts from "
                              "outputs another learned); leave --cache at memory")
    generator = embedded_generator(args, kinds)
    prompts = [(p.id, generator.encode(messages=p.messages)) for p in load_suite(args.suite, args.limit)]
    methods = {}
    for kind in kinds:
        speculation = replace(options.speculation_options(args), drafter=kind)
        methods[f"specpipe {kind} k={speculation.draft_len} width={speculation.width}"] = \
            (with_fresh_store(generator, kind), speculation)
    summaries = benchmark(generator.verifier.model, generator.info.eos_token_ids, prompts, args.max_new_tokens, methods)
    print(markdown_table(summaries))
    ok = all(s.identical == s.prompts for s in summaries)
    print("lossless check: every output is identical to the verifier-only output" if ok else
          "LOSSLESS CHECK FAILED: some outputs differ from the verifier-only output")
    if args.json_file:
        import torch

        meta = {"preset": args.preset, "suite": args.suite, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                "threads": torch.get_num_threads(), "pinned": args.pin, "machine": platform.processor() or platform.machine(),
                "cpu_count": os.cpu_count(), "models": generator.info.model_name, "cache": args.cache}
        with open(args.json_file, "w") as f:
            json.dump(to_json(summaries, meta), f, indent=1)
    return 0 if ok else 1


def with_fresh_store(generator, kind: str):
    """The generator's models with the drafters of kind over a new, empty in-memory n-gram store."""
    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import Generator
    from specpipe.cli.wiring import build_drafters

    if kind not in ("ngram", "hybrid"):
        return generator
    store = InMemoryNgramCache()
    drafters = build_drafters((kind,), store, generator.drafters.get("model"), generator.info)
    return Generator(generator.tokenizer, generator.verifier, drafters, generator.defaults, store)

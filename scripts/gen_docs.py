"""Regenerate the parts of the docs that come from the code and the results: every command's --help
(docs/cli.md), every Prometheus metric (docs/api-and-metrics.md) and the README's headline table
(from bench-results/'s summaries), between `<!-- generated:NAME:begin -->` and
`<!-- generated:NAME:end -->` markers.

    python scripts/gen_docs.py          # rewrite them
    python scripts/gen_docs.py --check  # fail if they are stale
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HELP_COLUMNS = "100"
# The defaults some flags read from the environment, cleared so the text is the same everywhere.
ENV_DEFAULTS = ("SPECPIPE_PRESET", "SPECPIPE_CACHE", "SPECPIPE_VERIFIER_ADDR", "SPECPIPE_DRAFTER_ADDR")


def subparser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    """The parser of `specpipe <path...>`."""
    for name in path:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = actions[0].choices[name]
    return parser


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand, depth first, in registration order."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += command_paths(child, (*path, name))
    return paths


def cli_section() -> str:
    os.environ["COLUMNS"] = HELP_COLUMNS
    for name in ENV_DEFAULTS:
        os.environ.pop(name, None)
    from specpipe.cli.main import build_parser

    parser = build_parser()
    blocks = []
    for path in command_paths(parser):
        title = " ".join(("specpipe", *path))
        blocks.append(f"### `{title}`\n\n```text\n{subparser(parser, list(path)).format_help().rstrip()}\n```")
    return "\n\n".join(blocks)


def metrics_section() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from specpipe.runtime import metrics

    rows = ["| metric | type | labels | what it counts |", "| --- | --- | --- | --- |"]
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in value._labelnames) or "-"
            rows.append(f"| `{name}` | {value._type} | {labels} | {value._documentation} |")
    return "\n".join(rows)


HEADLINE = "2026-12-07-headline-128"  # the run folder under bench-results/ the README's table comes from
HEADLINE_RUNS = tuple(f"{HEADLINE}/{preset}-{suite}" for preset in ("qwen-coder", "smollm2")
                      for suite in ("humaneval", "gsm8k", "mtbench"))


def headline_section() -> str:
    """The README's table: the default configuration against its baselines, from the runs' summaries."""
    from specpipe.bench.report import HEADLINE_COLUMNS, load, summary_table

    results, metas = {}, {}
    for stem in HEADLINE_RUNS:
        loaded, loaded_metas = load([str(ROOT / "bench-results" / f"{stem}.json")])
        (suite,) = loaded
        results[stem], metas[stem] = loaded[suite], loaded_metas[suite]
    return summary_table(results, metas, HEADLINE_COLUMNS, "suite (prompts), preset")


SECTIONS = [("docs/cli.md", "cli", cli_section), ("docs/api-and-metrics.md", "metrics", metrics_section),
            ("README.md", "headline", headline_section)]


def replace(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- generated:{name}:begin -->", f"<!-- generated:{name}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    stale = []
    for relpath, name, section in SECTIONS:
        path = ROOT / relpath
        text = path.read_text()
        new = replace(text, name, section())
        if new != text:
            stale.append(relpath)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        sys.exit(f"generated docs are stale, run scripts/gen_docs.py: {stale}")
    print("generated docs are up to date" if args.check else f"rewrote: {', '.join(stale) or 'nothing'}")


if __name__ == "__main__":
    main()

"""`specpipe cache seed FILE... --cache URL`'s flags; what it runs: specpipe.app.seed."""

from __future__ import annotations

import argparse

from specpipe.cli import options
from specpipe.config.services import SeedConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cache", help="manage the n-gram store", description="Manage the n-gram store.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    seed = actions.add_parser(
        "seed",
        help="learn text files in the store's learned store (a corpus)",
        description="Learn text files in a tenant's learned store of a shared n-gram "
        "store (docs/cache.md), tokenized with the verifier's tokenizer. A .jsonl file holds one document "
        'per line (its "text" field, else its string fields); any other file is one document.',
    )
    seed.add_argument("files", nargs="+", metavar="FILE", help=".txt, .md, .py, any text (one document) or .jsonl")
    options.add_settings(seed, SeedConfig, "cache", "preset", "verifier", "tenant", "chunk_tokens", "timeout")
    seed.set_defaults(func=run_seed)


def run_seed(args: argparse.Namespace) -> int:
    from specpipe.app.seed import seed
    from specpipe.config.services import seed_config

    seeded = seed(seed_config(vars(args)))
    table = f"tenant {args.tenant}'s learned store" if args.tenant else "the learned store"
    print(f"specpipe cache seed: {seeded.documents} documents, {seeded.tokens} tokens, {seeded.recorded} tokens "
          f"learned in {table} of {seeded.store}")
    return 0

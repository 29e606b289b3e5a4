"""`specpipe cache seed FILE... --cache URL`'s flags; what it runs: specpipe.app.seed."""

from __future__ import annotations

import argparse

from specpipe.config.env import environment
from specpipe.config.presets import DEFAULT_PRESET, PRESETS
from specpipe.config.services import SeedConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="manage the n-gram store", description="Manage the n-gram store.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    seed = actions.add_parser("seed", help="record text files in the store's global (corpus) table",
                              description="Record text files in the global (corpus) table of a shared n-gram "
                              "store, tokenized with the verifier's tokenizer. A .jsonl file holds one document "
                              "per line (its \"text\" field, else its string fields); any other file is one document.")
    seed.add_argument("files", nargs="+", metavar="FILE", help=".txt, .md, .py, any text (one document) or .jsonl")
    seed.add_argument("--cache", default=environment().cache, metavar="URL",
                      help="the shared store: redis://[:password@]host:port/db, rediss://... or grpc://host:port "
                      "(env SPECPIPE_CACHE; memory is refused: the seed would die with this process)")
    seed.add_argument("--preset", default=environment().preset or DEFAULT_PRESET, choices=sorted(PRESETS),
                      help="whose verifier's tokenizer to use (default: %(default)s; env SPECPIPE_PRESET)")
    seed.add_argument("--verifier", default=None, help="local path or model id of the verifier (overrides the preset)")
    seed.add_argument("--tenant", default="", metavar="ID",
                      help="seed this tenant's global table (docs/security.md, \"Tenants\") (default: the default "
                      "tenant's)")
    seed.add_argument("--chunk-tokens", type=int, default=SeedConfig.chunk_tokens, metavar="N",
                      help="tokens per store call (default: %(default)s)")
    seed.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per store call (default: %(default)s)")
    seed.set_defaults(func=run_seed)


def run_seed(args: argparse.Namespace) -> int:
    from specpipe.app.seed import seed
    from specpipe.config.services import seed_config

    seeded = seed(seed_config(vars(args)))
    table = f"tenant {args.tenant}'s global table" if args.tenant else "the global table"
    print(f"specpipe cache seed: {seeded.documents} documents, {seeded.tokens} tokens, {seeded.recorded} pairs "
          f"recorded in {table} of {seeded.store}")
    return 0

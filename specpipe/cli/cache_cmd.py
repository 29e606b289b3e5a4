"""`specpipe cache seed FILE... --cache URL`'s flags; what it runs: specpipe.app.seed."""

from __future__ import annotations

import argparse

from specpipe.config.env import environment
from specpipe.config.presets import DEFAULT_PRESET, PRESETS
from specpipe.config.services import SeedConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="manage the n-gram store", description="Manage the n-gram store.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    seed = actions.add_parser("seed", help="learn text files in the store's learned store (a corpus)",
                              description="Learn text files in a tenant's learned store of a shared n-gram "
                              "store (docs/cache.md), tokenized with the verifier's tokenizer. A .jsonl file holds one document "
                              "per line (its \"text\" field, else its string fields); any other file is one document.")
    seed.add_argument("files", nargs="+", metavar="FILE", help=".txt, .md, .py, any text (one document) or .jsonl")
    seed.add_argument("--cache", default=environment().cache, metavar="URL",
                      help="the shared store: redis://[:password@]host:port/db, rediss://..., "
                      "redis+cluster://host:port or grpc://host:port "
                      "(env SPECPIPE_CACHE; memory is refused: the seed would die with this process)")
    seed.add_argument("--preset", default=environment().preset or DEFAULT_PRESET, choices=sorted(PRESETS),
                      help="whose verifier's tokenizer to use (default: %(default)s; env SPECPIPE_PRESET)")
    seed.add_argument("--verifier", default=None, help="local model folder, or a model id in the local Hugging Face cache, of the verifier (overrides the preset)")
    seed.add_argument("--tenant", default="", metavar="ID",
                      help="seed this tenant's learned store (docs/security.md, \"Tenants\") (default: the "
                      "default tenant's)")
    seed.add_argument("--chunk-tokens", type=int, default=SeedConfig.chunk_tokens, metavar="N",
                      help="tokens per store call: each chunk is a document, overlapping the previous one by 32 "
                      "tokens (default: %(default)s)")
    seed.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per store call (default: %(default)s)")
    seed.set_defaults(func=run_seed)


def run_seed(args: argparse.Namespace) -> int:
    from specpipe.app.seed import seed
    from specpipe.config.services import seed_config

    seeded = seed(seed_config(vars(args)))
    table = f"tenant {args.tenant}'s learned store" if args.tenant else "the learned store"
    print(f"specpipe cache seed: {seeded.documents} documents, {seeded.tokens} tokens, {seeded.recorded} tokens "
          f"learned in {table} of {seeded.store}")
    return 0

"""`specpipe cache seed FILE... --cache URL`: fill the n-gram store's global (corpus) table from text
files (Self-Draft corpus cache), tokenized with the verifier's tokenizer so that every session of that
model drafts from it. .jsonl files hold one document per line (its "text" field, else its string
fields joined by newlines); any other file is one document."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Iterator, Sequence

from specpipe.config.env import environment
from specpipe.config.presets import DEFAULT_PRESET, PRESETS
from specpipe.core.errors import InvalidArgument
from specpipe.core.tenancy import check_tenant

CHUNK_TOKENS = 4096  # tokens per update_global call (one Redis round trip, a bounded Lua run)


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
    seed.add_argument("--chunk-tokens", type=int, default=CHUNK_TOKENS, metavar="N",
                      help="tokens per store call (default: %(default)s)")
    seed.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per store call (default: %(default)s)")
    seed.set_defaults(func=run_seed)


def run_seed(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from cache_service.redis_store import redacted
    from cache_service.stores import open_store
    from specpipe.config.presets import model_specs
    from specpipe.core.ngram import NgramConfig
    from specpipe.engine.models import load_tokenizer

    check_tenant(args.tenant)
    if not args.cache:
        raise InvalidArgument("--cache is required: the store to seed (redis://host:port or grpc://host:port)")
    if args.cache == "memory":
        raise InvalidArgument("--cache memory would seed this process's own store, lost when it exits; "
                              "seed a shared store: redis://host:port or grpc://host:port")
    paths = [pathlib.Path(f) for f in args.files]
    for path in paths:
        if not path.is_file():
            raise InvalidArgument(f"{path}: no such file")
    config = NgramConfig()  # the defaults the services use: N decides the chunk overlap
    if args.chunk_tokens < config.max_n:
        raise InvalidArgument(f"--chunk-tokens must be at least {config.max_n}, got {args.chunk_tokens}")
    tokenizer = load_tokenizer(model_specs(args.preset, args.verifier)[0])
    store = open_store(args.cache, config, args.timeout)
    num_documents = num_tokens = recorded = 0
    try:
        with tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc="seeding",
                  disable=None, file=sys.stderr) as progress:  # disable=None: no bar unless stderr is a terminal
            for path in paths:
                for text, size in documents(path):
                    if text:
                        tokens = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
                        for chunk in chunks(tokens, args.chunk_tokens, config.max_n - 1):
                            recorded += store.update_global(chunk, args.tenant)
                        num_documents += 1
                        num_tokens += len(tokens)
                    progress.update(size)
    finally:
        store.close()
    table = f"tenant {args.tenant}'s global table" if args.tenant else "the global table"
    print(f"specpipe cache seed: {num_documents} documents, {num_tokens} tokens, {recorded} pairs recorded "
          f"in {table} of {redacted(args.cache)}")
    return 0


def documents(path: pathlib.Path) -> Iterator[tuple[str, int]]:
    """(text, bytes of the file it covers) per document of a file; "" for a blank .jsonl line."""
    if path.suffix.lower() != ".jsonl":
        yield path.read_text(encoding="utf-8", errors="replace"), path.stat().st_size
        return
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                yield "", len(line)
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise InvalidArgument(f"{path}:{number}: not JSON: {err}") from None
            yield jsonl_text(record), len(line)


def jsonl_text(record) -> str:
    """A .jsonl line's document: its "text" field, else its string fields joined by newlines."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return ""
    if isinstance(record.get("text"), str):
        return record["text"]
    return "\n".join(value for value in record.values() if isinstance(value, str))


def chunks(tokens: Sequence[int], size: int, overlap: int) -> Iterator[Sequence[int]]:
    """Windows of at most size tokens covering tokens, each starting overlap tokens before the end of
    the previous one: with overlap = N-1 every n-gram (n <= N) lies whole in some window. The n-grams
    inside an overlap are recorded twice, which leaves an LRU table as one pass would (they were the
    most recent already) but counts them twice in `recorded`. Nothing for fewer than 2 tokens."""
    if size <= overlap:
        raise ValueError(f"size {size} must exceed overlap {overlap}")
    start = 0
    while len(tokens) >= 2:
        yield tokens[start:start + size]
        if start + size >= len(tokens):
            return
        start += size - overlap

"""`specpipe cache seed`: text files into a shared n-gram store's learned store (Self-Draft's corpus
cache; specpipe.core.learned), tokenized with the verifier's tokenizer so that every session of that
model and tenant drafts from it. A .jsonl file holds one document per line (its "text" field, else
its string fields joined by newlines); any other file is one document, learned in overlapping chunks."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specpipe.config.services import SeedConfig
from specpipe.core.errors import InvalidArgument
from specpipe.core.tenancy import check_tenant


@dataclass(frozen=True)
class Seeded:
    documents: int
    tokens: int
    recorded: int   # tokens learned: those of chunk overlaps twice, none of a document the store had
    store: str      # the store's URL, password redacted


def seed(config: SeedConfig) -> Seeded:
    from tqdm import tqdm

    from cache_service.redis_store import redacted
    from cache_service.stores import open_store
    from specpipe.config.presets import model_specs
    from specpipe.core.learned import MATCH_TOKENS
    from specpipe.core.ngram import NgramConfig
    from specpipe.engine.models import load_tokenizer

    check_tenant(config.tenant)
    if not config.cache:
        raise InvalidArgument("--cache is required: the store to seed (redis://host:port or grpc://host:port)")
    if config.cache == "memory":
        raise InvalidArgument("--cache memory would seed this process's own store, lost when it exits; "
                              "seed a shared store: redis://host:port or grpc://host:port")
    paths = [pathlib.Path(f) for f in config.files]
    for path in paths:
        if not path.is_file():
            raise InvalidArgument(f"{path}: no such file")
    ngram = NgramConfig()  # the defaults the services use
    if config.chunk_tokens <= 2 * MATCH_TOKENS:
        raise InvalidArgument(f"--chunk-tokens must be more than {2 * MATCH_TOKENS}, got {config.chunk_tokens}")
    tokenizer = load_tokenizer(model_specs(config.preset, config.verifier)[0])
    store = open_store(config.cache, ngram, config.timeout)
    num_documents = num_tokens = recorded = 0
    try:
        with tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc="seeding",
                  disable=None, file=sys.stderr) as progress:  # disable=None: no bar unless stderr is a terminal
            for path in paths:
                for text, size in documents(path):
                    if text:
                        tokens = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
                        for chunk in chunks(tokens, config.chunk_tokens, MATCH_TOKENS):
                            recorded += store.update_global(chunk, config.tenant)
                        num_documents += 1
                        num_tokens += len(tokens)
                    progress.update(size)
    finally:
        store.close()
    return Seeded(num_documents, num_tokens, recorded, redacted(config.cache))


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


def jsonl_text(record: Any) -> str:
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
    the previous one: with overlap = MATCH_TOKENS a match of the longest length a lookup measures
    lies whole in some window. Nothing for fewer than 2 tokens."""
    if size <= overlap:
        raise ValueError(f"size {size} must exceed overlap {overlap}")
    start = 0
    while len(tokens) >= 2:
        yield tokens[start:start + size]
        if start + size >= len(tokens):
            return
        start += size - overlap

"""The n-gram store's semantics, once: table updates and the Multi-Level N-gram lookup. Both backends
of cache_service (in-memory, Redis Lua) implement exactly these functions; the contract tests compare
them against this module on random token streams.

A table maps a prefix of n-1 tokens (n = 2..max_n, all levels in one dict: the level of a prefix is
len(prefix) + 1) to its continuations, most recently seen first, at most `max_continuations` of them:
an LRU queue per prefix (Self-Draft, "context cache"). Lookup follows ANPD Algorithm 2 (Multi-Level
N-gram): try the longest suffix (n = max_n) first and fall back to shorter ones; chain K steps as in
ANPD Algorithm 1 (each step queries the context plus the tokens drafted so far).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specpipe.errors import InvalidArgument
from specpipe.types import ROOT, Draft

Prefix = tuple[int, ...]
Table = dict[Prefix, list[int]]  # prefix [n-1] -> continuations, most recent first

MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 on the wire (protos/specpipe/v1)
SUFFIX_TOKENS = 16  # context tokens callers send with a lookup or before an update; stores keep their own N-1 (N <= 17)


@dataclass(frozen=True)
class NgramConfig:
    max_n: int = 5                # N: the longest n-gram (ANPD: N = 5)
    max_continuations: int = 4    # LRU bound per prefix (Self-Draft)
    session_ttl_s: float = 3600.0  # a session's tables expire this long after its last update
    max_draft_len: int = 64       # lookups clip k to this (a repeating context would chain forever)
    use_global: bool = True       # lookups fall back to the global (corpus) table

    def __post_init__(self):
        if self.max_n < 2 or self.max_continuations < 1 or self.session_ttl_s <= 0 or self.max_draft_len < 0:
            raise ValueError(f"bad NgramConfig: {self}")


@dataclass(frozen=True)
class NgramDraft:
    draft: Draft                # deterministic (q = None)
    levels: tuple[int, ...]     # [num_nodes] the n of the n-gram that produced each node


EMPTY_NGRAM_DRAFT = NgramDraft(Draft(), ())


def ngram_updates(tokens: Sequence[int], start: int, max_n: int) -> list[tuple[Prefix, int]]:
    """The (prefix, next) pairs that appending tokens[start:] adds: every new token with each prefix
    of length 1..max_n-1 ending right before it (ANPD "Update"), in token order, short prefixes first."""
    updates = []
    for i in range(max(start, 1), len(tokens)):
        for m in range(1, min(max_n - 1, i) + 1):
            updates.append((tuple(tokens[i - m:i]), tokens[i]))
    return updates


def record(table: Table, prefix: Prefix, next_token: int, max_continuations: int) -> None:
    """Move next_token to the front of prefix's continuations, keeping at most max_continuations."""
    continuations = table.get(prefix)
    if continuations is None:
        table[prefix] = [next_token]
        return
    if next_token in continuations:
        continuations.remove(next_token)
    continuations.insert(0, next_token)
    del continuations[max_continuations:]


def apply_updates(table: Table, tokens: Sequence[int], start: int, config: NgramConfig) -> int:
    """Record tokens[start:] in table; returns the number of (prefix, next) pairs recorded."""
    updates = ngram_updates(tokens, start, config.max_n)
    for prefix, next_token in updates:
        record(table, prefix, next_token, config.max_continuations)
    return len(updates)


def longest_match(tables: Sequence[Table], suffix: Sequence[int], max_n: int) -> tuple[list[int], int] | None:
    """(continuations, n) of the first hit: tables in order, and within a table n = max_n down to 2
    (ANPD Algorithm 2). So a session's own 2-gram beats a global 5-gram: context drafts are worth
    more than corpus drafts (Self-Draft ablation)."""
    for table in tables:
        for n in range(min(max_n, len(suffix) + 1), 1, -1):
            continuations = table.get(tuple(suffix[len(suffix) - (n - 1):]))
            if continuations:
                return continuations, n
    return None


def mln_lookup(tables: Sequence[Table], context: Sequence[int], k: int, width: int, max_n: int = 5) -> NgramDraft:
    """Draft up to k tokens after context: a greedy chain of the most recent continuation of the
    longest matching suffix, plus at the first step up to width-1 other continuations of that same
    prefix as leaves. Node layout as drafter_service/model_drafter.py: each chain node is followed by
    its sibling alternatives; parents[i] < i, ROOT = the last context token."""
    suffix = list(context[max(0, len(context) - (max_n - 1)):])
    tokens: list[int] = []
    parents: list[int] = []
    levels: list[int] = []
    parent = ROOT
    for depth in range(k):
        match = longest_match(tables, suffix, max_n)
        if match is None:
            break
        continuations, n = match
        branch = continuations[:width] if depth == 0 else continuations[:1]
        chain_parent = parent
        for position, token in enumerate(branch):
            tokens.append(token)
            parents.append(chain_parent)
            levels.append(n)
            if position == 0:
                parent = len(tokens) - 1
        suffix = (suffix + [branch[0]])[-(max_n - 1):]
    return NgramDraft(Draft(tuple(tokens), tuple(parents)), tuple(levels))


# --- validation shared by every implementation (same errors embedded and over gRPC) ---------------

def check_session_id(session_id: str) -> None:
    if not session_id:
        raise InvalidArgument("session_id must not be empty")


def check_tokens(tokens: Sequence[int], what: str) -> None:
    for token in tokens:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgument(f"{what}: token id {token} is outside [0, {MAX_TOKEN_ID}]")


def check_lookup(session_id: str, context_suffix: Sequence[int], k: int, width: int) -> None:
    check_session_id(session_id)
    if k < 0 or width < 1:
        raise InvalidArgument(f"k must be >= 0 and width >= 1, got k={k} and width={width}")
    check_tokens(context_suffix, "context_suffix")


def check_update(tokens: Sequence[int], start: int) -> None:
    if not 0 <= start <= len(tokens):
        raise InvalidArgument(f"start must be in [0, {len(tokens)}], got {start}")
    check_tokens(tokens, "tokens")

"""The learned store's semantics, once: what a tenant's store keeps of finished outputs and how it
drafts from them (SuffixDecoding, arXiv 2411.04975, over an index instead of a suffix tree). Both
backends of cache_service (in-memory, Redis Lua) implement exactly these functions; the contract
tests compare them on random token streams.

A tenant's store holds documents (a finished output after the last MATCH_TOKENS of its prompt, or a
`specpipe cache seed` chunk), each with a count (how often it was learned: an exact repeat counts,
it is not stored twice) and a place in an LRU order, and an index from every `index_n` tokens of a
document to where they occur (document, position of the token after them), most recent first.

A lookup finds the occurrences of the context's last index_n tokens, extends each match backward
against the context (up to MATCH_TOKENS), keeps the occurrences of the longest match (a suffix
tree's deepest node) and walks their continuations: at each depth the token with the most weight
(the documents' counts) among the occurrences still alive, while the product of the shares stays
at least min_share, and at most `reach` times as deep as the match is long. Each node's confidence comes from
that evidence (the match's length and the token's share: `evidence`), which adaptive control and the
branch predictor calibrate online. A short match drafts little, a long one with a history of being
followed drafts long, none drafts nothing.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Sequence

from specpipe.core.types import ROOT, Draft

MATCH_TOKENS = 32  # the longest match a lookup measures; also the prompt tail learned before an output


@dataclass(frozen=True)
class LearnedConfig:
    index_n: int = 3                  # tokens of an index key: the shortest match
    max_occurrences: int = 16         # occurrences kept per index key, most recent first
    min_share: float = 0.3            # a draft stops where the product of its tokens' shares falls below this
    reach: int = 2                    # a draft is at most reach times as deep as its match is long
    max_tokens: int = 1 << 20         # per tenant: least recently used documents are evicted beyond this
    ttl_s: float = 7 * 24 * 3600.0    # a tenant's store expires this long after it last learned

    def __post_init__(self) -> None:
        if (not 1 <= self.index_n <= MATCH_TOKENS or self.max_occurrences < 1 or not 0.0 < self.min_share <= 1.0
                or self.reach < 1 or self.max_tokens < 1 or self.ttl_s <= 0):
            raise ValueError(f"bad LearnedConfig: {self}")


@dataclass
class Document:
    tokens: tuple[int, ...]
    count: int = 1   # times learned
    used: int = 0    # the store's clock when it was last learned or drafted from (LRU)


@dataclass
class LearnedStore:
    """One tenant's store (the in-memory layout; Redis keeps the same in hashes: redis_store.py)."""

    documents: dict[int, Document] = field(default_factory=dict)
    index: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict)  # key -> [(doc, pos)]
    digests: dict[str, int] = field(default_factory=dict)  # document digest -> id
    tokens: int = 0    # tokens in all documents
    next_id: int = 1
    clock: int = 0


@dataclass(frozen=True)
class Candidate:
    match: int                  # tokens of the context matched, ending at the occurrence
    weight: int                 # the document's count
    continuation: tuple[int, ...]
    doc: int


def digest(tokens: Sequence[int]) -> str:
    """A document's identity: the sha1 of its tokens as little-endian int32 (Redis: redis.sha1hex)."""
    return hashlib.sha1(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


def evidence(match: int, share: float) -> float:
    """A draft token's prior acceptance from its evidence: the share of the occurrences that continue
    with it, discounted for a short match (match / (match + 1))."""
    return share * match / (match + 1)


def learn(store: LearnedStore, tokens: Sequence[int], config: LearnedConfig) -> int:
    """Learn a document; returns the tokens it added (0 for a repeat, which counts, or one too short
    to index or longer than the store may hold). Least recently used documents are evicted while the
    store holds more than config.max_tokens tokens."""
    tokens = tuple(tokens)
    if len(tokens) <= config.index_n or len(tokens) > config.max_tokens:
        return 0
    store.clock += 1
    key = digest(tokens)
    known = store.digests.get(key)
    if known is not None:
        document = store.documents[known]
        document.count += 1
        document.used = store.clock
        return 0
    doc = store.next_id
    store.next_id += 1
    store.documents[doc] = Document(tokens, 1, store.clock)
    store.digests[key] = doc
    store.tokens += len(tokens)
    for pos in range(config.index_n, len(tokens)):
        occurrences = store.index.setdefault(tokens[pos - config.index_n:pos], [])
        occurrences.insert(0, (doc, pos))
        del occurrences[config.max_occurrences:]
    while store.tokens > config.max_tokens:
        evict(store, min(store.documents, key=lambda d: (store.documents[d].used, d)), config)
    return len(tokens)


def evict(store: LearnedStore, doc: int, config: LearnedConfig) -> None:
    """Remove a document and its occurrences from the index."""
    document = store.documents.pop(doc)
    del store.digests[digest(document.tokens)]
    store.tokens -= len(document.tokens)
    for pos in range(config.index_n, len(document.tokens)):
        key = document.tokens[pos - config.index_n:pos]
        occurrences = [o for o in store.index.get(key, ()) if o[0] != doc]
        if occurrences:
            store.index[key] = occurrences
        else:
            store.index.pop(key, None)


def candidates(store: LearnedStore, suffix: Sequence[int], k: int, config: LearnedConfig) -> list[Candidate]:
    """The occurrences of the longest match of suffix's end (at least index_n tokens, at most
    MATCH_TOKENS), in index order, each with up to k tokens of continuation."""
    suffix = tuple(suffix[-MATCH_TOKENS:])
    if len(suffix) < config.index_n:
        return []
    found: list[Candidate] = []
    for doc, pos in store.index.get(suffix[-config.index_n:], ()):
        tokens = store.documents[doc].tokens
        match = config.index_n
        while match < len(suffix) and pos - match - 1 >= 0 and tokens[pos - match - 1] == suffix[-match - 1]:
            match += 1
        found.append(Candidate(match, store.documents[doc].count, tokens[pos:pos + k], doc))
    longest = max((c.match for c in found), default=0)
    return [c for c in found if c.match == longest]


@dataclass(frozen=True)
class LearnedDraft:
    draft: Draft                   # deterministic, sources unset
    match: int                     # the longest match's length (0: none)
    confidence: tuple[float, ...]  # [num_nodes] evidence(match, share) of each node
    used: tuple[int, ...]          # the documents that drafted the first token (LRU: drafted from)


def walk(found: Sequence[Candidate], k: int, width: int, config: LearnedConfig) -> LearnedDraft:
    """Draft from the longest match's occurrences: a chain of the heaviest continuation, at most
    min(k, reach * match) deep, while the product of shares is >= min_share; at the first depth, up to
    width - 1 other continuations as leaves. Ties go to the most recent occurrence."""
    if not found:
        return LearnedDraft(Draft(), 0, (), ())
    match = found[0].match
    alive = list(found)
    tokens: list[int] = []
    parents: list[int] = []
    confidence: list[float] = []
    used: tuple[int, ...] = ()
    parent, product = ROOT, 1.0
    for depth in range(min(k, config.reach * match)):
        weights: dict[int, int] = {}  # next token -> weight, in the order first seen
        for c in alive:
            if depth < len(c.continuation):
                token = c.continuation[depth]
                weights[token] = weights.get(token, 0) + c.weight
        if not weights:
            break
        total = sum(weights.values())
        ranked = sorted(weights, key=lambda t: -weights[t])  # stable: ties keep first-seen order
        best = ranked[0]
        product *= weights[best] / total
        if product < config.min_share:
            break
        chain_parent = parent
        tokens.append(best)
        parents.append(chain_parent)
        confidence.append(evidence(match, weights[best] / total))
        parent = len(tokens) - 1
        if depth == 0:
            used = tuple(c.doc for c in alive if c.continuation and c.continuation[0] == best)
            for other in ranked[1:width]:
                tokens.append(other)
                parents.append(chain_parent)
                confidence.append(evidence(match, weights[other] / total))
        alive = [c for c in alive if depth < len(c.continuation) and c.continuation[depth] == best]
    return LearnedDraft(Draft(tuple(tokens), tuple(parents)), match if tokens else 0, tuple(confidence), used)


def lookup(store: LearnedStore, suffix: Sequence[int], k: int, width: int, config: LearnedConfig) -> LearnedDraft:
    """Draft up to k tokens after suffix from the store; the documents drafted from become the most
    recently used."""
    found = walk(candidates(store, suffix, k, config), k, width, config)
    if found.used:
        store.clock += 1
        for doc in found.used:
            store.documents[doc].used = store.clock
    return found

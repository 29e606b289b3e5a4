"""The n-gram store's semantics, once: table updates and the Multi-Level N-gram lookup. Both backends
of cache_service (in-memory, Redis Lua) implement exactly these functions; the contract tests compare
them against this module on random token streams.

A table maps a prefix of n-1 tokens (n = 2..max_n, all levels in one dict: the level of a prefix is
len(prefix) + 1) to its continuations, most recently seen first, at most `max_continuations` of them:
an LRU queue per prefix (Self-Draft, "context cache"). Lookup follows ANPD Algorithm 2 (Multi-Level
N-gram): try the longest suffix (n = max_n) first and fall back to shorter ones; chain K steps as in
ANPD Algorithm 1 (each step queries the context plus the tokens drafted so far).

Three sources: the session's context (its prompt and confirmed tokens, searched where the drafter
has it: context_lookup, as vLLM's n-gram proposer does, so the store needs no update per round), the
session's verifier table in the store (the verifier's argmax after draft nodes it did not accept:
n-grams the verifier would have continued with, the Self-Draft idea at zero extra forward passes;
verifier_branches), and the tenant's learned store of finished outputs (global: specpipe.core.learned).
Every node carries a confidence from its evidence (the match's length, the continuation's share:
learned.evidence), and a lookup takes the source whose draft is expected to land the most tokens
(better), not a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specpipe.core.errors import InvalidArgument
from specpipe.core.learned import MATCH_TOKENS, LearnedConfig, LearnedDraft, evidence
from specpipe.core.trees import attach, first_path_nodes
from specpipe.core.types import ROOT, Draft

Prefix = tuple[int, ...]
Table = dict[Prefix, list[int]]  # prefix [n-1] -> continuations, most recent first

MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 on the wire (protos/specpipe/v1)
SUFFIX_TOKENS = MATCH_TOKENS  # context tokens callers send with a lookup or before an update


@dataclass(frozen=True)
class NgramConfig:
    max_n: int = 5                # N: the longest n-gram (ANPD: N = 5)
    max_continuations: int = 4    # LRU bound per prefix (Self-Draft)
    session_ttl_s: float = 3600.0  # a session's tables expire this long after its last update
    max_draft_len: int = 64       # lookups clip k to this (a repeating context would chain forever)
    use_global: bool = True       # lookups also draft from the tenant's learned store
    learned: LearnedConfig = LearnedConfig()  # the learned store (specpipe.core.learned)

    def __post_init__(self) -> None:
        if self.max_n < 2 or self.max_continuations < 1 or self.session_ttl_s <= 0 or self.max_draft_len < 0:
            raise ValueError(f"bad NgramConfig: {self}")


TABLES = ("verifier", "global")  # the store's sources (DRAFT_SOURCES): a session's verifier table, the learned store


@dataclass(frozen=True)
class NgramDraft:
    draft: Draft                # deterministic (q = None)
    levels: tuple[int, ...]     # [num_nodes] the n of the n-gram that produced each node (a match of n-1 tokens)
    sources: tuple[str, ...]    # [num_nodes] the source (DRAFT_SOURCES) that produced each node
    confidence: tuple[float, ...] = ()  # [num_nodes] prior acceptance from the evidence (learned.evidence)

    def as_draft(self) -> Draft:
        """The Draft with its sources and confidences (no runner-up: a deterministic draft)."""
        n = len(self.draft)
        return Draft(self.draft.tokens, self.draft.parents, sources=self.sources, confidence=self.confidence,
                     runner_up=(-1,) * n, runner_up_confidence=(0.0,) * n)


EMPTY_NGRAM_DRAFT = NgramDraft(Draft(), (), (), ())


def learned_draft(found: LearnedDraft) -> NgramDraft:
    """A learned store's draft as the store's lookups return it (source global, level match + 1)."""
    n = len(found.draft)
    return NgramDraft(found.draft, (found.match + 1,) * n, ("global",) * n, found.confidence)


def ngram_confidence(parents: Sequence[int], levels: Sequence[int]) -> tuple[float, ...]:
    """The confidence of n-gram table nodes: evidence(n - 1, share), the share of a node being 1/(rank + 1)
    among its siblings (a table keeps continuations most recent first, without counts)."""
    ranks: dict[int, int] = {}
    confidence = []
    for parent, level in zip(parents, levels):
        rank = ranks.get(parent, 0)
        ranks[parent] = rank + 1
        confidence.append(evidence(level - 1, 1.0 / (rank + 1)))
    return tuple(confidence)


def expected_tokens(found: NgramDraft) -> float:
    """Tokens a draft is expected to land by its confidences: the sum over its main chain of the
    product of the confidences up to each node."""
    total, product = 0.0, 1.0
    for node in first_path_nodes(found.draft):
        product *= found.confidence[node]
        total += product
    return total


def better(first: NgramDraft, second: NgramDraft) -> NgramDraft:
    """The draft expected to land more tokens; first on a tie."""
    return second if expected_tokens(second) > expected_tokens(first) else first


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


def record_all(table: Table, updates: Sequence[tuple[Prefix, int]], max_continuations: int) -> int:
    """record() every (prefix, next) pair; returns the number of pairs recorded."""
    for prefix, next_token in updates:
        record(table, prefix, next_token, max_continuations)
    return len(updates)


def apply_updates(table: Table, tokens: Sequence[int], start: int, config: NgramConfig) -> int:
    """Record tokens[start:] in table; returns the number of (prefix, next) pairs recorded."""
    return record_all(table, ngram_updates(tokens, start, config.max_n), config.max_continuations)


def branch_updates(branches: Sequence[Sequence[int]], max_n: int) -> list[tuple[Prefix, int]]:
    """The (prefix, next) pairs of record_branches: each branch's last token after each of its last
    1..max_n-1 tokens before it (ngram_updates of the branch with start = its last token)."""
    return [update for branch in branches for update in ngram_updates(branch, len(branch) - 1, max_n)]


def apply_branches(table: Table, branches: Sequence[Sequence[int]], config: NgramConfig) -> int:
    """Record branches (verifier_branches) in a session's verifier table; returns pairs recorded."""
    return record_all(table, branch_updates(branches, config.max_n), config.max_continuations)


def verifier_branches(context_tail: Sequence[int], draft: Draft, accepted_nodes: Sequence[int],
                      node_argmax: Sequence[int], max_n: int = 5) -> list[tuple[int, ...]]:
    """The verifier's free n-grams of one round: for every draft node i off the accepted path, the
    tokens up to and including i (context_tail, ending with the root, then the path root -> i) followed
    by the verifier's argmax after i, node_argmax[i + 1]; each branch is its last max_n tokens.

    node_argmax: [num_nodes + 1], the argmax after the root (index 0) and after each node (VerifyResult).
    Accepted nodes (and the root) are skipped: their argmax is the next confirmed token, which the
    context table records anyway; so are nodes whose argmax is unknown (negative: a replayed verifier
    knows its transcript's argmax only, verifier_service/replay.py). Branches come in node order."""
    keep = max_n - 1
    root_tail = tuple(context_tail[max(0, len(context_tail) - keep):])
    tails: list[tuple[int, ...]] = []  # [num_nodes] the last max_n-1 tokens up to and including node i
    for token, parent in zip(draft.tokens, draft.parents):
        tails.append(((root_tail if parent == ROOT else tails[parent]) + (token,))[-keep:])
    accepted = set(accepted_nodes)
    return [tails[i] + (node_argmax[i + 1],) for i in range(len(draft.tokens))
            if i not in accepted and node_argmax[i + 1] >= 0]


def longest_match(tables: Sequence[Table], suffix: Sequence[int], max_n: int) -> tuple[list[int], int, int] | None:
    """(continuations, n, table index) of the first hit: tables in order, and within a table n = max_n
    down to 2 (ANPD Algorithm 2)."""
    for index, table in enumerate(tables):
        for n in range(min(max_n, len(suffix) + 1), 1, -1):
            continuations = table.get(tuple(suffix[len(suffix) - (n - 1):]))
            if continuations:
                return continuations, n, index
    return None


def mln_lookup(tables: Sequence[Table], context: Sequence[int], k: int, width: int, max_n: int = 5,
               sources_of: Sequence[str] = TABLES) -> NgramDraft:
    """Draft up to k tokens after context: a greedy chain of the most recent continuation of the
    longest matching suffix, plus at the first step up to width-1 other continuations of that same
    prefix as leaves. Node layout as drafter_service/model_drafter.py: each chain node is followed by
    its sibling alternatives; parents[i] < i, ROOT = the last context token.

    tables: in the order of sources_of (the store has one: the session's verifier table)."""
    if len(tables) > len(sources_of):
        raise ValueError(f"at most {len(sources_of)} tables ({', '.join(sources_of)}), got {len(tables)}")
    suffix = list(context[max(0, len(context) - (max_n - 1)):])
    tokens: list[int] = []
    parents: list[int] = []
    levels: list[int] = []
    sources: list[str] = []
    parent = ROOT
    for depth in range(k):
        match = longest_match(tables, suffix, max_n)
        if match is None:
            break
        continuations, n, index = match
        branch = continuations[:width] if depth == 0 else continuations[:1]
        chain_parent = parent
        for position, token in enumerate(branch):
            tokens.append(token)
            parents.append(chain_parent)
            levels.append(n)
            sources.append(sources_of[index])
            if position == 0:
                parent = len(tokens) - 1
        suffix = (suffix + [branch[0]])[-(max_n - 1):]
    return NgramDraft(Draft(tuple(tokens), tuple(parents)), tuple(levels), tuple(sources),
                      ngram_confidence(parents, levels))


def occurrences(context: np.ndarray, tail: Sequence[int]) -> tuple[list[int], list[int]]:
    """Where tail's last token occurs in context followed by a token: (ends: the index of the token
    after each occurrence; whole: how many of tail's last tokens, at most MATCH_TOKENS, end there), both
    in context order. context: [num_tokens] int64 (one vectorised scan; what follows works on the few
    occurrences as Python ints, which numpy's per-call cost would dominate)."""
    ends = np.flatnonzero(context[:-1] == tail[-1]) + 1
    return ends.tolist(), match_lengths(context, ends, tail).tolist()


def advance(context: Sequence[int], ends: list[int], whole: list[int], token: int) -> tuple[list[int], list[int]]:
    """The occurrences of tail + [token] whose whole match is two tokens or more, from tail's (ends,
    whole): the ones followed by token and by one more, one token on. Every other occurrence of the
    new tail matches just its last token."""
    last = len(context) - 1
    on = [i for i, end in enumerate(ends) if end < last and context[end] == token]
    return [ends[i] + 1 for i in on], [min(whole[i] + 1, MATCH_TOKENS) for i in on]


def match_lengths(context: np.ndarray, ends: np.ndarray, tail: Sequence[int]) -> np.ndarray:
    """[len(ends)] how many of tail's last tokens (at most MATCH_TOKENS) the context's tokens before
    each index in ends equal: the whole match a continuation follows (at least the n-gram's n - 1)."""
    reach = min(len(tail), MATCH_TOKENS)
    before = ends[:, None] - np.arange(1, reach + 1)  # [candidates, reach] indices, nearest first
    want = np.asarray(tail[len(tail) - reach:][::-1], dtype=np.int64)
    same = (before >= 0) & (context[np.maximum(before, 0)] == want)
    return np.where(same.all(axis=1), reach, np.argmin(same, axis=1))


def context_lookup(
    context: Sequence[int], k: int, width: int, max_n: int = 5, max_continuations: int = 4
) -> NgramDraft:
    """mln_lookup over the session's context alone, as if its context table held every token of it:
    a chain of up to k tokens (each step matching the context plus the tokens drafted so far against
    the context) and, at the first step, up to width-1 other continuations as leaves. Where the longest
    n-gram occurs more than once, the chain follows the occurrence whose whole match is longest (up to
    MATCH_TOKENS, the most recent of those; SuffixDecoding), not the table's most recent; a chain node's
    confidence is the evidence of that whole match (as the learned store's): a copy of a long stretch
    of the context is told from a 4-token coincidence. The longest n-gram is the longest whole match
    cut to max_n - 1, so one ranking by whole match does both. A step after the first searches the
    context again only where no occurrence of the last step continues (advance)."""
    tokens_in = list(context)
    ids = np.asarray(tokens_in, dtype=np.int64)
    keep = max(MATCH_TOKENS, max_n - 1)
    tail = tokens_in[max(0, len(tokens_in) - keep):]  # the context and the chain so far: its suffix
    found = occurrences(ids, tail) if len(ids) >= 2 else None
    draft: list[tuple[int, int, int, float]] = []  # (token, parent, n, confidence)
    parent = ROOT
    for depth in range(k):
        if found is None or not found[0]:
            break
        ends, whole = found
        longest = max(whole)
        n = min(longest, max_n - 1) + 1
        first = tokens_in[ends[len(whole) - 1 - whole[::-1].index(longest)]]  # the most recent longest match
        continuations = [first]
        if depth == 0:  # the n-gram's other continuations, most recent first
            others = [tokens_in[end] for end, w in zip(ends, whole) if min(w, max_n - 1) == n - 1][::-1]
            continuations = list(dict.fromkeys(continuations + others))[:min(width, max_continuations)]
        chain_parent = parent
        for rank, token in enumerate(continuations):
            matched = longest if rank == 0 else n - 1
            draft.append((token, chain_parent, n, evidence(matched, 1.0 / (rank + 1))))
            if rank == 0:
                parent = len(draft) - 1
        tail = (tail + [first])[-keep:]
        found = advance(tokens_in, ends, whole, first)
        if not found[0]:
            found = occurrences(ids, tail)
    tokens, parents, levels, confidence = (tuple(column) for column in zip(*draft)) if draft else ((),) * 4
    return NgramDraft(Draft(tokens, parents), levels, ("context",) * len(draft), confidence)


def after_chain(first: NgramDraft, second: NgramDraft) -> NgramDraft:
    """second's nodes after the last node of first's main chain (first_path)."""
    chain = first_path_nodes(first.draft)
    return NgramDraft(
        attach(first.draft, second.draft, chain[-1] if chain else ROOT),
        first.levels + second.levels,
        first.sources + second.sources,
        first.confidence + second.confidence,
    )


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


def check_branches(branches: Sequence[Sequence[int]]) -> None:
    for i, branch in enumerate(branches):
        if len(branch) < 2:
            raise InvalidArgument(f"branches[{i}] has {len(branch)} tokens; a branch needs at least 2")
        check_tokens(branch, f"branches[{i}]")

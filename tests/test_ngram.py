"""The n-gram semantics (specpipe.core.ngram) on literal tiny cases: updates, LRU per prefix, the
verifier's branches, the confidences and the choice between sources, and the Multi-Level N-gram lookup (ANPD
Algorithm 2: longest suffix first, fall back to shorter; tables in priority order, with sources)."""

from __future__ import annotations

import random

import pytest

from specpipe.core.learned import MATCH_TOKENS, evidence
from specpipe.core.ngram import (
    NgramConfig,
    after_chain,
    apply_branches,
    apply_updates,
    branch_updates,
    context_lookup,
    mln_lookup,
    ngram_updates,
    record,
    verifier_branches,
)
from specpipe.core.types import ROOT, Draft


@pytest.mark.parametrize("tokens, start, max_n, expected", [
    ([1, 2, 3], 0, 3, [((1,), 2), ((2,), 3), ((1, 2), 3)]),
    ([1, 2, 3, 4], 3, 5, [((3,), 4), ((2, 3), 4), ((1, 2, 3), 4)]),
    ([1, 2, 3, 4, 5, 6], 5, 3, [((5,), 6), ((4, 5), 6)]),     # prefixes of at most N-1 tokens
    ([1, 2, 3], 3, 5, []),                                    # nothing new
    ([7], 0, 5, []),                                          # a lone token has no prefix
    ([], 0, 5, []),
], ids=["from start", "context before start", "N bounds the prefix", "nothing new", "one token", "empty"])
def test_ngram_updates(tokens, start, max_n, expected):
    assert ngram_updates(tokens, start, max_n) == expected


def test_record_is_lru_per_prefix():
    table = {}
    for token in (5, 6, 5, 7):
        record(table, (1,), token, max_continuations=2)
    assert table == {(1,): [7, 5]}  # most recent first, 6 evicted, 5 moved to the front once


def test_apply_updates_counts_pairs():
    table = {}
    assert apply_updates(table, [1, 2, 1, 3], 0, NgramConfig(max_n=3)) == 5
    assert table[(1,)] == [3, 2] and table[(2, 1)] == [3] and table[(1, 2)] == [1]


@pytest.mark.parametrize("branches, max_n, expected", [
    ([(1, 2, 3)], 5, [((2,), 3), ((1, 2), 3)]),
    ([(0, 1, 2, 3, 4, 9)], 3, [((4,), 9), ((3, 4), 9)]),   # only the last N-1 tokens before it
    ([(4, 7), (6, 8)], 5, [((4,), 7), ((6,), 8)]),
    ([], 5, []),
], ids=["one branch", "N bounds the prefix", "two branches", "none"])
def test_branch_updates(branches, max_n, expected):
    assert branch_updates(branches, max_n) == expected


def test_apply_branches_is_lru_per_prefix():
    table = {}
    assert apply_branches(table, [(1, 4, 5), (4, 6)], NgramConfig(max_continuations=1)) == 3
    assert table == {(4,): [6], (1, 4): [5]}


CHAIN = Draft.chain((5, 6, 7))
TREE = Draft((5, 6, 8), (-1, -1, 0))  # 5 and 6 at depth 1, 8 after 5


@pytest.mark.parametrize("draft, accepted, node_argmax, max_n, expected", [
    (CHAIN, (0, 1, 2), (5, 6, 7, 8), 5, []),
    (CHAIN, (), (9, 6, 3, 4), 5, [(1, 2, 5, 6), (1, 2, 5, 6, 3), (2, 5, 6, 7, 4)]),
    (CHAIN, (0,), (5, 6, 4, 8), 5, [(1, 2, 5, 6, 4), (2, 5, 6, 7, 8)]),
    (TREE, (1,), (6, 7, 9, 2), 5, [(1, 2, 5, 7), (1, 2, 5, 8, 2)]),
    (TREE, (), (3, 7, 9, 2), 2, [(5, 7), (6, 9), (8, 2)]),
    (Draft(), (), (3,), 5, []),
], ids=["all accepted", "first-token mismatch", "one accepted", "tree, the other sibling won",
        "N = 2", "empty draft"])
def test_verifier_branches(draft, accepted, node_argmax, max_n, expected):
    assert verifier_branches([1, 2], draft, accepted, node_argmax, max_n) == expected


def test_verifier_branches_with_a_short_context():
    assert verifier_branches([], CHAIN, (), (9, 6, 3, 4)) == [(5, 6), (5, 6, 3), (5, 6, 7, 4)]


LEVELS_TABLE = {(1,): [9], (2,): [8], (1, 2): [7]}


@pytest.mark.parametrize("context, tokens, levels", [
    ([1, 2], (7,), (3,)),        # the longest suffix (1, 2) wins over (2,)
    ([5, 2], (8,), (2,)),        # (5, 2) unknown: fall back to (2,)
    ([4, 4, 1], (9,), (2,)),
    ([3], (), ()),               # no level hits
    ([], (), ()),                # no context
], ids=["longest first", "fallback", "fallback to a bigram", "no hit", "empty context"])
def test_mln_lookup_levels(context, tokens, levels):
    result = mln_lookup([LEVELS_TABLE], context, k=1, width=1)
    assert (result.draft.tokens, result.levels) == (tokens, levels)
    assert result.sources == ("verifier",) * len(tokens)
    assert result.draft.q is None and result.draft.is_chain


def test_chain_of_k_each_step_looks_up_the_drafted_suffix():
    table = {}
    apply_updates(table, [1, 2, 3, 4, 1, 2], 0, NgramConfig())
    result = mln_lookup([table], [1, 2], k=5, width=1)
    assert result.draft.tokens == (3, 4, 1, 2, 3)
    assert result.draft.parents == (-1, 0, 1, 2, 3)
    # (1,2) is a 3-gram prefix, then (1,2,3) a 4-gram, then 5-grams until (3,4,1,2) is unknown.
    assert result.levels == (3, 4, 5, 5, 3)
    assert mln_lookup([table], [1, 2], k=0, width=3).draft.tokens == ()


def test_tree_width_at_the_first_step_only():
    table = {(1,): [5, 6, 7], (5,): [8, 9]}
    result = mln_lookup([table], [1], k=3, width=2)
    # chain node 5, its sibling 6 (a leaf), then the chain goes on from 5: 8 (no alternatives).
    assert result.draft.tokens == (5, 6, 8)
    assert result.draft.parents == (-1, -1, 0)
    assert result.levels == (2, 2, 2)
    wide = mln_lookup([table], [1], k=1, width=10)
    assert wide.draft.tokens == (5, 6, 7) and wide.draft.parents == (-1, -1, -1)


def test_tables_in_priority_order():
    verifier, global_table = {(2,): [8], (8,): [6]}, {(1, 2): [7], (6,): [4], (8,): [3]}
    result = mln_lookup([verifier, global_table], [1, 2], k=3, width=1)
    # The verifier's bigram beats a global trigram; the verifier's (8,) beats the global one.
    assert result.draft.tokens == (8, 6, 4) and result.levels == (2, 2, 2)
    assert result.sources == ("verifier", "verifier", "global")
    result = mln_lookup([{}, global_table], [1, 2], k=1, width=1)
    assert (result.draft.tokens, result.sources) == ((7,), ("global",))
    with pytest.raises(ValueError):
        mln_lookup([{}, {}, {}], [1], k=1, width=1)


def brute_context_lookup(context, k, width, max_n, max_continuations):
    """context_lookup by enumeration: at each step every occurrence of the context-and-chain's end in the
    context, ranked by its n-gram (<= max_n - 1 tokens), then its whole match (<= MATCH_TOKENS), then
    recency; alternatives are the n-gram's other continuations, most recent first."""
    tokens, parents, levels, confidence = [], [], [], []
    tail, parent = list(context), ROOT

    def matched(end):  # tail's last tokens equal to those before context[end], at most MATCH_TOKENS
        m = 0
        while m < min(MATCH_TOKENS, end) and context[end - 1 - m] == tail[-1 - m]:
            m += 1
        return m

    for depth in range(k):
        found = [(min(matched(end), max_n - 1), matched(end), end) for end in range(1, len(context))]
        found = [f for f in found if f[0] > 0]
        if not found:
            break
        n_1 = max(f[0] for f in found)
        ngram = [f for f in found if f[0] == n_1]
        _, whole, end = max(ngram, key=lambda f: (f[1], f[2]))
        others = [context[e] for _, _, e in sorted(ngram, key=lambda f: -f[2])]
        continuations = list(dict.fromkeys([context[end]] + others))[:max_continuations]
        chain_parent = parent
        for rank, token in enumerate(continuations[:width] if depth == 0 else continuations[:1]):
            tokens.append(token)
            parents.append(chain_parent)
            levels.append(n_1 + 1)
            confidence.append(evidence(whole if rank == 0 else n_1, 1.0 / (rank + 1)))
            if rank == 0:
                parent = len(tokens) - 1
        tail.append(continuations[0])
    return Draft(tuple(tokens), tuple(parents)), tuple(levels), tuple(confidence)


@pytest.mark.parametrize("seed", range(4))
def test_context_lookup_searches_the_whole_context(seed):
    """Searching the context finds the n-gram a table holding all of it would (the same first level)
    and follows that n-gram's occurrence with the longest whole match, as enumerating every occurrence
    does: random streams over small vocabularies (many hits) and streams that repeat themselves (chains
    past MATCH_TOKENS, where ties at the cap go to the most recent), every k, width and N."""
    rng = random.Random(seed)
    unlike_the_table = 0
    for _ in range(300):
        context = [rng.randrange(rng.choice([2, 3, 6, 30])) for _ in range(rng.randint(0, 50))]
        copies = rng.random() < 0.3
        if copies:
            context = context * rng.randint(2, 3) + context[:rng.randint(0, 40)]
        config = NgramConfig(max_n=rng.randint(2, 6), max_continuations=rng.randint(1, 4))
        table = {}
        apply_updates(table, context, 0, config)
        k, width = rng.randint(0, 40 if copies else 8), rng.randint(1, 4)
        by_table = mln_lookup([table], context, k, width, config.max_n, sources_of=("context",))
        found = context_lookup(context, k, width, config.max_n, config.max_continuations)
        brute = brute_context_lookup(context, k, width, config.max_n, config.max_continuations)
        assert (found.draft, found.levels, found.confidence) == brute
        assert found.sources == ("context",) * len(found.draft.tokens)
        assert found.levels[:1] == by_table.levels[:1]
        unlike_the_table += found.draft.tokens != by_table.draft.tokens
    assert unlike_the_table > 0  # the streams do tell the two rules apart


def test_context_confidence_is_the_whole_match():
    """A chain node's confidence is evidence(the match it continues), up to MATCH_TOKENS: a copy of
    a long stretch, growing with each drafted token, against a 4-token coincidence."""
    copy = context_lookup(list(range(100, 140)) + list(range(100, 130)), k=4, width=1)
    assert copy.draft.tokens == (130, 131, 132, 133)
    assert copy.confidence == tuple(evidence(m, 1.0) for m in (30, 31, MATCH_TOKENS, MATCH_TOKENS))
    coincidence = context_lookup([7, 1, 2, 3, 4, 9, 8, 8, 1, 2, 3, 4], k=2, width=1)
    assert coincidence.draft.tokens == (9, 8) and coincidence.confidence == (evidence(4, 1.0), evidence(5, 1.0))
    both = context_lookup([5, 1, 2, 3, 4, 9, 6, 1, 2, 3, 4, 7, 5, 1, 2, 3, 4], k=1, width=2)
    # the chain follows the earlier occurrence, which matches 5 tokens, not the most recent (4, as the
    # table would); the most recent is the alternative, with its n-gram's evidence
    assert both.draft.tokens == (9, 7) and both.confidence == (evidence(5, 1.0), evidence(4, 0.5))


def test_context_lookup_then_the_store():
    local = context_lookup([1, 2, 3, 1, 2, 5, 1, 2], k=2, width=2)
    # (1, 2) was followed by 3, then most recently by 5: chain 5 with 3 beside it; then (5, 1, 2, 5) -> 1.
    assert (local.draft.tokens, local.draft.parents, local.levels) == ((5, 3, 1), (-1, -1, 0), (3, 3, 4))
    stored = mln_lookup([{(9,): [4]}], [9], k=1, width=1)
    joined = after_chain(local, stored)  # the store's continuation goes after the chain's last node
    assert (joined.draft.tokens, joined.draft.parents) == ((5, 3, 1, 4), (-1, -1, 0, 2))
    assert joined.sources == ("context",) * 3 + ("verifier",) and joined.levels == (3, 3, 4, 2)
    assert after_chain(context_lookup([5], 2, 1), stored).draft.parents == (-1,)  # nothing local: the store's own


def test_max_n_bounds_the_suffix():
    table = {(1,): [9], (2,): [8], (1, 2): [7]}
    assert mln_lookup([table], [1, 2], k=1, width=1, max_n=2).draft.tokens == (8,)


@pytest.mark.parametrize("bad", [{"max_n": 1}, {"session_ttl_s": 0}])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        NgramConfig(**bad)

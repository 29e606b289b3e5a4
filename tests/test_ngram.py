"""The n-gram semantics (specpipe.ngram) on literal tiny cases: updates, LRU per prefix, and the
Multi-Level N-gram lookup (ANPD Algorithm 2: longest suffix first, fall back to shorter)."""

from __future__ import annotations

import pytest

from specpipe.ngram import NgramConfig, apply_updates, mln_lookup, ngram_updates, record


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


def test_session_tables_before_the_global_table():
    session, global_table = {(2,): [8]}, {(1, 2): [7], (8,): [6]}
    both = mln_lookup([session, global_table], [1, 2], k=2, width=1)
    assert both.draft.tokens == (8, 6) and both.levels == (2, 2)  # the session's bigram beats a global trigram
    assert mln_lookup([{}, global_table], [1, 2], k=1, width=1).draft.tokens == (7,)


def test_max_n_bounds_the_suffix():
    table = {(1,): [9], (2,): [8], (1, 2): [7]}
    assert mln_lookup([table], [1, 2], k=1, width=1, max_n=2).draft.tokens == (8,)


def test_config_is_validated():
    with pytest.raises(ValueError):
        NgramConfig(max_n=1)

"""The learned store's semantics (specpipe.core.learned) on literal cases: learning, repeats that count,
the index bound, LRU eviction, the longest match, draft length from match length and shares, and the
choice between sources by expected tokens (specpipe.core.ngram.better)."""

from __future__ import annotations

import pytest

from specpipe.core import learned, ngram
from specpipe.core.learned import LearnedConfig, LearnedStore, evidence

CONFIG = LearnedConfig(index_n=2, max_occurrences=4, min_share=0.3, max_tokens=100)


def store_of(*documents, config=CONFIG) -> LearnedStore:
    store = LearnedStore()
    for document in documents:
        learned.learn(store, document, config)
    return store


def test_learn_indexes_every_position_and_counts_repeats():
    store = LearnedStore()
    assert learned.learn(store, [1, 2, 3, 4], CONFIG) == 4
    assert store.index == {(1, 2): [(1, 2)], (2, 3): [(1, 3)]}  # (3, 4) is followed by nothing
    assert learned.learn(store, [1, 2, 3, 4], CONFIG) == 0      # a repeat counts, it is not stored twice
    assert store.documents[1].count == 2 and store.tokens == 4
    assert learned.learn(store, [7, 8], CONFIG) == 0             # too short to index
    assert learned.learn(store, list(range(101)), CONFIG) == 0   # longer than the store may hold
    assert len(store.documents) == 1


def test_occurrences_are_most_recent_first_and_bounded():
    store = store_of(*([5, 6, i] for i in range(10, 16)))
    assert store.index[(5, 6)] == [(6, 2), (5, 2), (4, 2), (3, 2)]  # max_occurrences = 4


def test_the_longest_match_drafts_and_its_length_bounds_the_draft():
    store = store_of([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [9, 9, 3, 4, 50, 51, 52])
    found = learned.lookup(store, [2, 3, 4], k=10, width=1, config=CONFIG)
    assert found.draft.tokens == (5, 6, 7, 8, 9, 10)  # the 3-token match beats the 2-token one; depth <= 2 * 3
    assert found.match == 3
    assert found.confidence == (evidence(3, 1.0),) * 6
    assert learned.lookup(store, [2, 3, 4], k=10, width=1, config=LearnedConfig(index_n=2, reach=1)).draft.tokens == (
        5, 6, 7)
    # both documents match 2 tokens; 5 and 50 weigh 1 each: the most recent occurrence's, at share 1/2
    found = learned.lookup(store, [0, 3, 4], k=10, width=1, config=CONFIG)
    assert found.draft.tokens == (50, 51, 52) and found.confidence == (evidence(2, 0.5),) + (evidence(2, 1.0),) * 2


def test_weights_and_shares_choose_and_stop():
    # (3, 4) -> 5 twice (a document learned twice), -> 50 once: 5 has share 2/3
    store = store_of([3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 50, 60])
    found = learned.lookup(store, [3, 4], k=2, width=2, config=CONFIG)
    assert found.draft.tokens == (5, 50, 6) and found.draft.parents == (-1, -1, 0)
    assert found.confidence == pytest.approx((evidence(2, 2 / 3), evidence(2, 1 / 3), evidence(2, 1.0)))
    # min_share: a first token with share 1/3 stops the draft at once where min_share > 1/3
    store = store_of([3, 4, 5], [3, 4, 6], [3, 4, 7])
    assert (
        learned.lookup(store, [3, 4], k=2, width=1, config=LearnedConfig(index_n=2, min_share=0.4)).draft.tokens == ()
    )
    assert learned.lookup(store, [3, 4], k=2, width=1, config=CONFIG).draft.tokens == (7,)


def test_ties_go_to_the_most_recent_occurrence():
    store = store_of([3, 4, 5, 0], [3, 4, 50, 0])
    assert learned.lookup(store, [3, 4], k=1, width=1, config=LearnedConfig(index_n=2, min_share=0.5)).draft.tokens == (
        50,
    )


def test_lru_eviction_keeps_what_was_drafted_from():
    config = LearnedConfig(index_n=2, max_tokens=12)
    store = store_of([1, 2, 3, 4], [5, 6, 7, 8], config=config)
    assert learned.lookup(store, [1, 2], k=2, width=1, config=config).draft.tokens == (3, 4)  # doc 1 used
    learned.learn(store, [9, 10, 11, 12, 13], config)  # 13 tokens > 12: the least recently used goes: doc 2
    assert sorted(store.documents) == [1, 3] and store.tokens == 9
    assert (6, 7) not in store.index and (5, 6) not in store.index and store.digests.keys() == {
        learned.digest(d.tokens) for d in store.documents.values()}
    assert learned.lookup(store, [5, 6], k=2, width=1, config=config).draft.tokens == ()


def test_nothing_matches():
    store = store_of([1, 2, 3])
    assert learned.lookup(store, [2], k=4, width=1, config=CONFIG).draft.tokens == ()  # shorter than index_n
    assert learned.lookup(store, [7, 8], k=4, width=1, config=CONFIG).match == 0
    assert learned.lookup(store, [1, 2], k=0, width=1, config=CONFIG).draft.tokens == ()


def test_better_takes_the_draft_expected_to_land_more():
    context = ngram.context_lookup([1, 2, 3, 1, 2], k=4, width=1)  # a 2-token match: (3, 1, 2, 3)
    store = store_of([9, 8, 7, 1, 2, 30, 31, 32, 33], config=CONFIG)
    long_match = ngram.learned_draft(learned.lookup(store, [9, 8, 7, 1, 2], k=4, width=1, config=CONFIG))
    assert long_match.levels == (6,) * 4 and long_match.sources == ("global",) * 4
    assert ngram.better(context, long_match) is long_match
    assert ngram.better(long_match, ngram.EMPTY_NGRAM_DRAFT) is long_match
    assert ngram.better(context, context) is context  # ties go to the first
    assert ngram.expected_tokens(long_match) == pytest.approx(sum(evidence(5, 1.0) ** d for d in range(1, 5)))


def test_ngram_confidence_by_level_and_rank():
    assert ngram.ngram_confidence((-1, -1, 0), (5, 5, 3)) == (evidence(4, 1.0), evidence(4, 0.5), evidence(2, 1.0))


@pytest.mark.parametrize("bad", [{"index_n": 0}, {"min_share": 0.0}, {"reach": 0}, {"max_tokens": 0}, {"ttl_s": 0}])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        LearnedConfig(**bad)

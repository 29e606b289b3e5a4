from specpipe.trees import first_path, merge_drafts
from specpipe.types import Draft


def test_merge_shares_prefixes_and_keeps_order():
    model = Draft.chain([5, 6, 7])
    ngram = Draft.chain([5, 6, 9, 10])
    merged, sources = merge_drafts([model, ngram], max_nodes=10)
    assert merged.tokens == (5, 6, 7, 9, 10)
    assert merged.parents == (-1, 0, 1, 1, 3)
    assert sources == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 3)]


def test_merge_budget_drops_subtrees():
    merged, _ = merge_drafts([Draft.chain([1, 2]), Draft.chain([3, 4, 5])], max_nodes=3)
    assert merged.tokens == (1, 2, 3) and merged.parents == (-1, 0, -1)


def test_merge_trees_and_empty():
    tree = Draft((1, 2, 3), (-1, -1, 0))
    merged, _ = merge_drafts([Draft(), tree, Draft.chain([2, 8])], max_nodes=8)
    assert merged.tokens == (1, 2, 3, 8) and merged.parents == (-1, -1, 0, 1)


def test_first_path_follows_first_children():
    assert first_path(Draft.chain([4, 5, 6])) == [4, 5, 6]
    tree = Draft((1, 9, 2, 8, 3), (-1, -1, 0, 0, 2))  # chain 1-2-3 with alternatives 9 and 8
    assert first_path(tree) == [1, 2, 3]
    assert first_path(Draft()) == []

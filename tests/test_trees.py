from specpipe.core.trees import (
    attach,
    common_prefix,
    first_path,
    merge_drafts,
    subtree,
    tried_children,
    within_depth,
)
from specpipe.core.types import Draft


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


def test_select_keeps_the_given_nodes_of_a_tree():
    tree = Draft((1, 9, 2, 8, 3, 4), (-1, -1, 0, 0, 2, 4))  # chain 1-2-3-4 with alternatives 9 and 8
    cut = tree.select([0, 1, 2, 4])
    assert cut.tokens == (1, 9, 2, 3) and cut.parents == (-1, -1, 0, 2)
    assert tree.select([]) == Draft() and tree.select(range(6)) == tree


def test_select_and_subtree_keep_every_column():
    tree = Draft((1, 9, 2), (-1, -1, 0), sources=("model", "context", "model"), confidence=(0.9, 0.05, 0.7),
                 runner_up=(9, -1, 4), runner_up_confidence=(0.05, 0.0, 0.2))
    cut = tree.select([0, 2])
    assert cut == Draft((1, 2), (-1, 0), sources=("model", "model"), confidence=(0.9, 0.7), runner_up=(9, 4),
                        runner_up_confidence=(0.05, 0.2))
    under, nodes = subtree(tree, 0)
    assert nodes == [2] and under == Draft((2,), (-1,), sources=("model",), confidence=(0.7,), runner_up=(4,),
                                           runner_up_confidence=(0.2,))


def test_merge_and_attach_fill_missing_columns_with_their_defaults():
    model = Draft.chain([1, 2], confidence=(0.9, 0.8), runner_up=(5, 6), runner_up_confidence=(0.1, 0.1))
    ngram = Draft.chain([1, 3], sources=("context", "global"))
    merged, _ = merge_drafts([model, ngram], max_nodes=8)
    assert merged.tokens == (1, 2, 3) and merged.parents == (-1, 0, 0)
    assert merged.sources == ("model", "model", "global") and merged.confidence == (0.9, 0.8, -1.0)
    assert merged.runner_up == (5, 6, -1) and merged.runner_up_confidence == (0.1, 0.1, 0.0)
    joined = attach(model, Draft.chain([7], sources=("verifier",)), 1)
    assert joined.tokens == (1, 2, 7) and joined.is_chain and joined.sources == ("model", "model", "verifier")
    assert attach(Draft.chain([1]), Draft.chain([2]), 0).sources is None
    beside = attach(Draft.chain([1, 2]), Draft((3, 4), (-1, 0)), -1)  # other's first level beside tree's
    assert beside.parents == (-1, 0, -1, 2)


def test_tried_children_stop_at_the_accepted_one():
    tree = Draft((1, 9, 2, 8, 3, 4), (-1, -1, 0, 0, 2, 4))
    # 1 accepted, then its children 2 (rejected) and 8 (accepted): the leaf 8 has no children
    assert tried_children(tree.parents, [0, 3]) == [(0, 1, 0, True), (2, 2, 0, False), (3, 2, 1, True)]
    # nothing accepted: both first-level nodes were tried
    assert tried_children(tree.parents, []) == [(0, 1, 0, False), (1, 1, 1, False)]
    assert tried_children(tree.parents, [0, 2, 4, 5]) == [(0, 1, 0, True), (2, 2, 0, True), (4, 3, 0, True),
                                                          (5, 4, 0, True)]


def test_common_prefix_of_the_main_chain_and_the_accepted_nodes():
    chain = [0, 2, 4]  # of the tree above
    assert common_prefix(chain, [0, 2, 4]) == 3 and common_prefix(chain, [0, 2]) == 2
    assert common_prefix(chain, [0, 3]) == 1 and common_prefix(chain, [1]) == 0 and common_prefix(chain, []) == 0


def test_within_depth_keeps_the_nodes_a_generation_can_still_emit():
    #        0 - 1 - 2 - 3      depths 1..4
    #         \- 4 - 5          depths 2, 3
    # 6                         depth 1 (a sibling of 0)
    draft = Draft((10, 11, 12, 13, 14, 15, 16), (-1, 0, 1, 2, 0, 4, -1))
    cut = within_depth(draft, 2)
    assert cut.tokens == (10, 11, 14, 16) and cut.parents == (-1, 0, 0, -1)
    assert within_depth(draft, 4) is draft and within_depth(draft, 0).tokens == ()

"""Greedy tree verification and tree attention: literal cases and equivalence with sequential decoding."""

import pytest
import torch

from specpipe.core.errors import InvalidArgument
from specpipe.core.verification import (
    ancestor_mask,
    check_tree,
    depths,
    row_argmax,
    tree_attention_mask,
    tree_position_ids,
    verify_greedy,
)
from specpipe.engine import runner

# (tokens, parents, target argmax after root and after each node, accepted nodes, correction)
GREEDY_CASES = {
    "perfect match": ([5, 6, 7], [-1, 0, 1], [5, 6, 7, 8], [0, 1, 2], 8),
    "first-token mismatch": ([5, 6, 7], [-1, 0, 1], [9, 6, 7, 8], [], 9),
    "mismatch in the middle": ([5, 6, 7], [-1, 0, 1], [5, 3, 7, 8], [0], 3),
    "empty draft": ([], [], [4], [], 4),
    "tree, second branch wins deeper": ([5, 9, 6, 1], [-1, -1, 0, 1], [9, 6, 1, 7, 3], [1, 3], 3),
    "tree, sibling leaf accepted": ([5, 6, 2], [-1, 0, 0], [5, 2, 0, 4], [0, 2], 4),
    "tree, deeper branch beats a shallow match": ([5, 6, 7, 3], [-1, 0, 0, 2], [5, 7, 1, 3, 8], [0, 2, 3], 8),
}


@pytest.mark.parametrize("tokens,parents,argmax,accepted,correction", GREEDY_CASES.values(), ids=GREEDY_CASES.keys())
def test_verify_greedy(tokens, parents, argmax, accepted, correction):
    assert verify_greedy(tokens, parents, argmax) == (accepted, correction)


def test_depths_and_ancestors():
    parents = [-1, -1, 0, 2, 1]
    assert depths(parents) == [1, 1, 2, 3, 2]
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(ancestor_mask(parents), expected)
    assert tree_position_ids(parents, past_len=10).tolist() == [[10, 11, 11, 12, 13, 12]]
    mask = tree_attention_mask(parents, past_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    assert (mask[0, 0, :, :4] == 0).all()  # context and root visible to all
    assert mask[0, 0, 0, 4:].min() < -1e30  # the root sees no node


def test_ancestor_mask_of_random_trees_and_chains():
    """The mask built in one indexing equals the row-by-row definition (each node: itself and its
    parent's row), for chains, forests and the empty draft."""
    import random

    rng = random.Random(0)
    for n in [0, 1, 2, 8, 32, *(rng.randint(3, 40) for _ in range(50))]:
        parents = [rng.randint(-1, i - 1) for i in range(n)] if n % 2 else list(range(-1, n - 1))
        expected = torch.eye(n, dtype=torch.bool)
        for i, parent in enumerate(parents):
            if parent != -1:
                expected[i] |= expected[parent]
        assert torch.equal(ancestor_mask(parents), expected)


def test_row_argmax_takes_the_first_maximum_as_torch_does():
    logits = torch.randn(6, 50_000)
    logits[1, [7, 900]] = 100.0  # a tie: the first one
    logits[2] = 0.0              # all equal: index 0
    assert row_argmax(logits) == logits.argmax(dim=-1).tolist()
    assert row_argmax(logits)[1:3] == [7, 0]
    assert row_argmax(logits[3:5]) == logits[3:5].argmax(dim=-1).tolist()  # a view of some rows


@pytest.mark.parametrize("parents", [[0], [-2], [-1, 1], [-1, 0, 3]])
def test_check_tree_rejects_malformed_parents(parents):
    with pytest.raises(InvalidArgument, match="malformed draft tree"):
        check_tree([1] * len(parents), parents, vocab_size=10)


def test_check_tree_rejects_out_of_vocab_and_length_mismatch():
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        check_tree([10], [-1], vocab_size=10)
    with pytest.raises(InvalidArgument, match="parents"):
        check_tree([1, 2], [-1], vocab_size=10)


def test_tree_forward_equals_sequential_paths(tiny_verifier):
    """Every tree node gets the logits of feeding its root-to-node path sequentially."""
    model = tiny_verifier.model
    context = list(range(40, 60))
    tokens, parents = [7, 8, 9, 10, 11, 12], [-1, -1, 0, 0, 2, 1]
    cache = runner.new_cache(model)
    runner.forward(model, cache, context[:-1])
    past = len(context) - 1
    tree_logits = runner.forward(model, cache, [context[-1], *tokens], tree_position_ids(parents, past),
                                 tree_attention_mask(parents, past, model.dtype))
    for node in range(len(tokens)):
        path, n = [], node
        while n != -1:
            path.insert(0, tokens[n])
            n = parents[n]
        sequential = runner.forward(model, runner.new_cache(model), context + path)[-1]
        torch.testing.assert_close(tree_logits[node + 1], sequential, atol=1e-4, rtol=1e-4)


def test_keep_tree_path_matches_fresh_cache(tiny_verifier):
    model = tiny_verifier.model
    context = list(range(30, 45))
    tokens, parents = [7, 8, 9], [-1, -1, 1]
    cache = runner.new_cache(model)
    runner.forward(model, cache, context[:-1])
    past = len(context) - 1
    runner.forward(model, cache, [context[-1], *tokens], tree_position_ids(parents, past),
                   tree_attention_mask(parents, past, model.dtype))
    runner.keep_tree_path(cache, past + 1, [1, 2])  # keep the path 8 -> 9
    after = runner.forward(model, cache, [5])[-1]
    fresh = runner.forward(model, runner.new_cache(model), context + [8, 9, 5])[-1]
    torch.testing.assert_close(after, fresh, atol=1e-4, rtol=1e-4)

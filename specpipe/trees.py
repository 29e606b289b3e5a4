"""Draft tree construction (pure functions)."""

from __future__ import annotations

from typing import Sequence

from specpipe.types import ROOT, Draft


def merge_drafts(drafts: Sequence[Draft], max_nodes: int) -> tuple[Draft, list[tuple[int, int]]]:
    """Merge deterministic drafts into one token tree (a trie: shared prefixes become one path),
    earlier drafts first, at most max_nodes nodes; a node that does not fit drops its subtree.
    Returns the tree and, per node, its origin: (index of the draft that first contributed it,
    node index in that draft)."""
    tokens: list[int] = []
    parents: list[int] = []
    origins: list[tuple[int, int]] = []
    index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for source, draft in enumerate(drafts):
        mapped: dict[int, int | None] = {ROOT: ROOT}
        for node, (token, parent) in enumerate(zip(draft.tokens, draft.parents)):
            merged_parent = mapped.get(parent)
            if merged_parent is None:  # its parent did not fit
                mapped[node] = None
                continue
            key = (merged_parent, token)
            if key not in index:
                if len(tokens) >= max_nodes:
                    mapped[node] = None
                    continue
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(merged_parent)
                origins.append((source, node))
            mapped[node] = index[key]
    return Draft(tuple(tokens), tuple(parents)), origins


def first_path(draft: Draft) -> list[int]:
    """The tokens of the path that follows each node's first child from the root: the chain of a
    chain draft, the main (most likely) chain of a drafter's tree."""
    return [draft.tokens[node] for node in first_path_nodes(draft)]


def first_path_nodes(draft: Draft) -> list[int]:
    """The node indices of first_path."""
    path: list[int] = []
    parent = ROOT
    for node, node_parent in enumerate(draft.parents):
        if node_parent == parent:
            path.append(node)
            parent = node
    return path


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (of token ids, or of node paths: how many accepted nodes
    follow the main chain when an alternative of it may have been accepted instead)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def subtree(draft: Draft, root: int) -> tuple[Draft, list[int]]:
    """The descendants of node root, as a draft rooted at it (q kept), and their node indices in draft."""
    mapped = {root: ROOT}
    nodes = []
    for node in range(root + 1, len(draft)):
        if draft.parents[node] in mapped:
            mapped[node] = len(nodes)
            nodes.append(node)
    return _pick(draft, nodes, mapped), nodes


def select(draft: Draft, nodes: Sequence[int]) -> Draft:
    """The draft of the given nodes (ascending, each node's parent among them), q kept."""
    mapped = {ROOT: ROOT} | {node: i for i, node in enumerate(nodes)}
    return _pick(draft, list(nodes), mapped)


def tried_children(parents: Sequence[int], accepted_nodes: Sequence[int]) -> list[tuple[int, int, int, bool]]:
    """(node, depth, rank, accepted) of each node that verification tried: the children of the root
    and of each accepted node, in order up to the accepted one (the verifier's token there). rank is
    the node's place among its siblings (0: the first child)."""
    tried = []
    for depth, parent in enumerate([ROOT, *accepted_nodes], start=1):
        taken = accepted_nodes[depth - 1] if depth <= len(accepted_nodes) else None
        children = [node for node, node_parent in enumerate(parents) if node_parent == parent]
        for rank, node in enumerate(children):
            tried.append((node, depth, rank, node == taken))
            if node == taken:
                break
    return tried


def _pick(draft: Draft, nodes: list[int], mapped: dict[int, int]) -> Draft:
    return Draft(
        tuple(draft.tokens[n] for n in nodes),
        tuple(mapped[draft.parents[n]] for n in nodes),
        tuple(draft.q[n] for n in nodes) if draft.q is not None else None,
    )

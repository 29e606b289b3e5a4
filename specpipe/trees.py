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


def subtree(draft: Draft, root: int) -> tuple[Draft, list[int]]:
    """The descendants of node root, as a draft rooted at it (q kept), and their node indices in draft."""
    mapped = {root: ROOT}
    nodes = []
    for node in range(root + 1, len(draft)):
        if draft.parents[node] in mapped:
            mapped[node] = len(nodes)
            nodes.append(node)
    sub = Draft(
        tuple(draft.tokens[n] for n in nodes),
        tuple(mapped[draft.parents[n]] for n in nodes),
        tuple(draft.q[n] for n in nodes) if draft.q is not None else None,
    )
    return sub, nodes

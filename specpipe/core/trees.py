"""Draft tree construction (pure functions)."""

from __future__ import annotations

from typing import Any, Sequence

from specpipe.core.types import ROOT, Draft

COLUMN_DEFAULTS = {"sources": "model", "confidence": -1.0, "runner_up": -1, "runner_up_confidence": 0.0}


def column_of(drafts: Sequence[Draft], name: str, origins: Sequence[tuple[int, int]]) -> tuple[Any, ...] | None:
    """Draft column `name` of nodes taken from drafts (origins: (draft, node) per node); None when no
    draft has it, else its default (COLUMN_DEFAULTS) where a draft lacks it."""
    if all(getattr(draft, name) is None for draft in drafts):
        return None
    default = COLUMN_DEFAULTS[name]
    return tuple(getattr(drafts[d], name)[n] if getattr(drafts[d], name) is not None else default for d, n in origins)


def merge_drafts(drafts: Sequence[Draft], max_nodes: int) -> tuple[Draft, list[tuple[int, int]]]:
    """Merge deterministic drafts into one token tree (a trie: shared prefixes become one path),
    earlier drafts first, at most max_nodes nodes; a node that does not fit drops its subtree.
    Columns come from the draft that first contributed a node. Returns the tree and, per node, its
    origin: (index of that draft, node index in it)."""
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
    columns = {name: column_of(drafts, name, origins) for name in COLUMN_DEFAULTS}
    return Draft(tuple(tokens), tuple(parents), **columns), origins


def attach(tree: Draft, other: Draft, at: int) -> Draft:
    """tree with other's nodes after tree's node `at` (ROOT: other's first level beside tree's),
    columns kept (q dropped: for deterministic drafts)."""
    parents = [*tree.parents, *(at if p == ROOT else p + len(tree) for p in other.parents)]
    origins = [(0, n) for n in range(len(tree))] + [(1, n) for n in range(len(other))]
    columns = {name: column_of((tree, other), name, origins) for name in COLUMN_DEFAULTS}
    return Draft((*tree.tokens, *other.tokens), tuple(parents), **columns)


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


def within_depth(draft: Draft, max_depth: int) -> Draft:
    """draft without its nodes deeper than max_depth (a generation's last tokens: what they would draft
    past it can never be emitted). Still a tree: a node's parent is shallower."""
    if len(draft) <= max_depth:
        return draft
    depth: list[int] = []
    for parent in draft.parents:
        depth.append(1 if parent == ROOT else depth[parent] + 1)
    if max(depth) <= max_depth:
        return draft
    return draft.select([node for node, d in enumerate(depth) if d <= max_depth])


def fit_nodes(draft: Draft, max_nodes: int) -> Draft:
    """draft cut to at most max_nodes nodes (the positions left in the verifier's context window):
    its first path (the drafter's best guess) first, then the other nodes in order, each only with
    its parent, so the result is still a tree."""
    if len(draft) <= max_nodes:
        return draft
    keep = set(first_path_nodes(draft)[: max(0, max_nodes)])
    for node, parent in enumerate(draft.parents):
        if len(keep) >= max_nodes:
            break
        if node not in keep and (parent == ROOT or parent in keep):
            keep.add(node)
    return draft.select(sorted(keep))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (of token ids, or of node paths: how many accepted nodes
    follow the main chain when an alternative of it may have been accepted instead)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def subtree(draft: Draft, root: int) -> tuple[Draft, list[int]]:
    """The descendants of node root, as a draft rooted at it (every column kept), and their node
    indices in draft."""
    mapped = {root: ROOT}
    nodes: list[int] = []
    for node in range(root + 1, len(draft)):
        if draft.parents[node] in mapped:
            mapped[node] = len(nodes)
            nodes.append(node)
    return draft.select(nodes, [mapped[draft.parents[n]] for n in nodes]), nodes


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

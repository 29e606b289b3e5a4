"""Forward passes over a per-session KV cache, shared by the verifier and the model drafter.

Rollback is explicit: a cache is cropped to a token prefix (longest common prefix sync) or
compacted to the positions of an accepted tree path; nothing else changes the cache.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions (transformers 5 crop takes the NEGATIVE count to drop)."""
    drop = cache_len(cache) - length
    if drop > 0:
        cache.crop(-drop)


def fork(cache: DynamicCache, length: int) -> DynamicCache:
    """A new cache holding the first `length` positions of cache, which stays as it is. Copy-on-write
    for free: the fork's layers start as views of the same tensors, and DynamicLayer.update appends
    by torch.cat (new tensors), never in place."""
    forked = copy.copy(cache)
    forked.layers = [copy.copy(layer) for layer in cache.layers]
    crop(forked, length)
    return forked


def keep_positions(cache: DynamicCache, positions: Sequence[int]) -> None:
    """Keep only the given cache positions, in order (the accepted path of a tree)."""
    index = None
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if index is None:
            index = torch.tensor(list(positions), device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


def keep_tree_path(cache: DynamicCache, prefix_len: int, nodes: Sequence[int]) -> None:
    """Keep the first prefix_len positions and, of the tree fed after them, the given nodes only."""
    if list(nodes) == list(range(len(nodes))):  # a chain prefix: cropping is enough
        crop(cache, prefix_len + len(nodes))
    else:
        keep_positions(cache, [*range(prefix_len), *(prefix_len + i for i in nodes)])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@torch.inference_mode()
def forward(
    model: PreTrainedModel,
    cache: DynamicCache,
    token_ids: Sequence[int],
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Feed token_ids after the cached positions; returns logits [len(token_ids), vocab] (float32).

    position_ids / attention_mask: None for a plain causal continuation, or a tree's positions
    [1, n] and additive 4-D mask [1, 1, n, past + n] (specpipe.verification).
    """
    device = model.device
    past_len = cache_len(cache)
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    if position_ids is None:
        position_ids = torch.arange(past_len, past_len + ids.shape[1], device=device)[None]
    out = model(
        input_ids=ids,
        past_key_values=cache,
        position_ids=position_ids.to(device),
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        use_cache=True,
    )
    return out.logits[0].float()

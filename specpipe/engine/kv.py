"""A session's KV cache as one preallocated slot that grows by doubling (docs/batching.md): the
verifier's per session, the model drafter's per branch.

A batched forward writes each session's new keys/values straight into its slot and attends over the
slot's valid prefix, so no round copies a whole cache (a DynamicCache concatenates every layer every
round). Growth copies once per doubling: amortised O(1) per token. Rollback is index bookkeeping:
`length` moves back, and a tree's accepted path is compacted down in place (keep_tree_path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specpipe.core.trees import common_prefix

MIN_CAPACITY = 64  # positions allocated for a new session (grows by doubling)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): forward times are measured to
    here, and the logits are read right after anyway."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SlotKV:
    """keys / values: [num_layers, num_kv_heads, capacity, head_dim]; positions [0, length) are valid.
    Every tensor is an inference tensor (made and changed in inference mode, as the forward is)."""

    @torch.inference_mode()
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, max_capacity: int):
        self.max_capacity = max_capacity  # the context window: growth never goes past it
        shape = (num_layers, num_kv_heads, min(MIN_CAPACITY, max_capacity), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @torch.inference_mode()
    def reserve(self, length: int) -> None:
        """Make room for `length` positions (doubling, capped at max_capacity); keeps the valid prefix."""
        if length <= self.capacity:
            return
        if length > self.max_capacity:
            raise ValueError(f"{length} positions exceed the context window ({self.max_capacity})")
        capacity = min(max(length, 2 * self.capacity), self.max_capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], old.shape[1], capacity, old.shape[3]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys / values: [num_kv_heads, n, head_dim] for positions [start, start + n) (reserved before),
        within the forward's inference mode (entering it again for every layer cost more than the write)."""
        n = keys.shape[1]
        self.keys[layer, :, start : start + n] = keys
        self.values[layer, :, start : start + n] = values

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` positions of one layer: keys, values [num_kv_heads, length, head_dim] (views)."""
        return self.keys[layer, :, :length], self.values[layer, :, :length]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @torch.inference_mode()
    def fork(self, length: int) -> SlotKV:
        """A new slot holding a copy of the first `length` positions; this slot stays as it is. Safe
        while a forward appends to this slot: it writes past `length` only, and a growing slot fills
        its new tensors before it swaps them in."""
        length = min(length, self.length)
        keys, values = self.keys, self.values
        num_layers, num_kv_heads, _, head_dim = keys.shape
        forked = SlotKV(num_layers, num_kv_heads, head_dim, keys.dtype, keys.device, self.max_capacity)
        forked.reserve(length)
        forked.keys[:, :, :length] = keys[:, :, :length]
        forked.values[:, :, :length] = values[:, :, :length]
        forked.length = length
        return forked

    @torch.inference_mode()
    def keep_positions(self, positions: Sequence[int]) -> None:
        """Keep only the given positions, in order: those that move are gathered down in place."""
        start = common_prefix(positions, range(len(positions)))
        if start < len(positions):
            index = torch.tensor(list(positions[start:]), dtype=torch.long, device=self.keys.device)
            for tensor in (self.keys, self.values):
                tensor[:, :, start : len(positions)] = tensor.index_select(2, index)
        self.length = len(positions)

    def keep_tree_path(self, prefix_len: int, nodes: Sequence[int]) -> None:
        """Keep the first prefix_len positions and, of the tree fed after them, the given nodes only
        (the same rollback as specpipe.engine.runner.keep_tree_path, on a slot)."""
        if list(nodes) == list(range(len(nodes))):  # a chain prefix: cropping is enough
            self.crop(prefix_len + len(nodes))
        else:
            self.keep_positions([*range(prefix_len), *(prefix_len + i for i in nodes)])


def new_slot(model: PreTrainedModel, max_context: int) -> SlotKV:
    """An empty slot for a transformers causal LM's layers, holding up to max_context positions."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return SlotKV(config.num_hidden_layers, config.num_key_value_heads, head_dim, model.dtype, model.device,
                  max_context)

"""Forward passes over a per-session KV cache, shared by the verifier and the model drafter.

Three forward modes, one set of cache operations (Runner.forward, crop, fork, keep_tree_path):
- `eager` (`--compile off`): transformers as loaded, over a DynamicCache that grows by concatenation;
- `packed` (`--compile on` on CPU): every fp32 linear layer runs specpipe.native's small-M GEMM,
  built for this CPU, over pre-packed weights; the cache is the same DynamicCache;
- `graphs` (`--compile on` on CUDA): a StaticKV slot preallocated per session, fed through a
  torch.compile'd forward (CUDA graphs) whose shapes are bucketed (1, 2, 4, 8, 16, 32 tokens), so
  compilation happens once per bucket at warm-up. Rollback is index bookkeeping: the slot's length
  moves back; positions past it are masked out and overwritten by the next forward.

Rollback is explicit: a cache is cropped to a token prefix (longest common prefix sync) or
compacted to the positions of an accepted tree path; nothing else changes the cache.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache

from specpipe.kv import SlotKV
from specpipe.trees import common_prefix
from specpipe.types import ModelInfo
from specpipe.verification import additive_mask, tree_allowed, tree_attention_mask, tree_position_ids

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32)  # forward sizes a compiled runner compiles, one graph each
STATIC_MAX_CONTEXT = 2048      # default slot length of a compiled runner (tokens)


class StaticKV:
    """One session slot: a preallocated StaticCache (room for `capacity` tokens plus the largest
    bucket's padding) and the number of valid positions in it."""

    def __init__(self, config, capacity: int, dtype: torch.dtype, device: torch.device):
        self.config, self.capacity, self.dtype, self.device = config, capacity, dtype, device
        self.width = capacity + BUCKETS[-1]  # positions allocated: room for a padded bucket at the end
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Allocate now, every tensor an inference tensor: a lazy first update, or a slot made outside
        # inference mode, would fail the compiled graph's guards and compile it again.
        with torch.inference_mode():
            self.cache = StaticCache(config=config, max_cache_len=self.width)
            self.cache.early_initialization(1, config.num_key_value_heads, head_dim, dtype, device)
        if any(layer.is_sliding for layer in self.cache.layers):
            raise ValueError("a static KV cache needs full-attention layers; this model has sliding-window layers")
        self.length = 0

    @torch.inference_mode()
    def set_length(self, length: int) -> None:
        self.length = length
        for layer in self.cache.layers:  # where the next StaticLayer.update writes
            layer.cumulative_length.fill_(length)


Cache = DynamicCache | StaticKV


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_len(cache: Cache | SlotKV) -> int:
    return cache.length if isinstance(cache, (StaticKV, SlotKV)) else cache.get_seq_length()


def crop(cache: Cache | SlotKV, length: int) -> None:
    """Keep the first `length` positions (transformers 5 crop takes the NEGATIVE count to drop)."""
    if isinstance(cache, SlotKV):  # a batched forward's slot (specpipe.kv)
        cache.crop(length)
        return
    drop = cache_len(cache) - length
    if drop <= 0:
        return
    if isinstance(cache, StaticKV):
        cache.set_length(length)
    else:
        cache.crop(-drop)


def fork(cache: Cache | SlotKV, length: int) -> Cache | SlotKV:
    """A new cache holding the first `length` positions of cache, which stays as it is. Copy-on-write
    for free: the fork's layers start as views of the same tensors, and DynamicLayer.update appends
    by torch.cat (new tensors), never in place. A static slot is copied (its prefix only) into a
    new slot, and so is a batched forward's slot (SlotKV.fork)."""
    if isinstance(cache, SlotKV):
        return cache.fork(length)
    if isinstance(cache, StaticKV):
        return _fork_slot(cache, length)
    forked = copy.copy(cache)
    forked.layers = [copy.copy(layer) for layer in cache.layers]
    crop(forked, length)
    return forked


@torch.inference_mode()
def _fork_slot(cache: StaticKV, length: int) -> StaticKV:
    length = min(length, cache.length)
    forked = StaticKV(cache.config, cache.capacity, cache.dtype, cache.device)
    for source, layer in zip(cache.cache.layers, forked.cache.layers):
        layer.keys[:, :, :length].copy_(source.keys[:, :, :length])
        layer.values[:, :, :length].copy_(source.values[:, :, :length])
    forked.set_length(length)
    return forked


def keep_positions(cache: Cache, positions: Sequence[int]) -> None:
    """Keep only the given cache positions, in order (the accepted path of a tree)."""
    if isinstance(cache, StaticKV):
        _gather_in_slot(cache, positions)
        return
    index = None
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if index is None:
            index = torch.tensor(list(positions), device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


@torch.inference_mode()
def _gather_in_slot(cache: StaticKV, positions: Sequence[int]) -> None:
    """Move the kept positions down within the slot, from the first one that moves: no reallocation."""
    start = common_prefix(positions, range(len(positions)))
    index = torch.tensor(list(positions[start:]), dtype=torch.long, device=cache.device)
    for layer in cache.cache.layers:
        layer.keys[:, :, start : len(positions)] = layer.keys.index_select(-2, index)
        layer.values[:, :, start : len(positions)] = layer.values.index_select(-2, index)
    cache.set_length(len(positions))


def keep_tree_path(cache: Cache, prefix_len: int, nodes: Sequence[int]) -> None:
    """Keep the first prefix_len positions and, of the tree fed after them, the given nodes only."""
    if list(nodes) == list(range(len(nodes))):  # a chain prefix: cropping is enough
        crop(cache, prefix_len + len(nodes))
    else:
        keep_positions(cache, [*range(prefix_len), *(prefix_len + i for i in nodes)])


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


def bucket(n: int, buckets: Sequence[int] = BUCKETS) -> int | None:
    """The smallest bucket that holds n tokens; None if none does."""
    return next((b for b in buckets if b >= n), None)


def static_inputs(past_len: int, n: int, tree_parents: Sequence[int] | None, size: int, width: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids [1, size] and additive mask [1, 1, size, width] for feeding n tokens (a chain, or
    [root] + a tree's nodes) after past_len cached positions into a static slot of width positions,
    padded to size rows. Padding rows see one position, so their softmax stays finite; what they
    write past the slot's length is never read."""
    allowed = torch.zeros(size, width, dtype=torch.bool)
    if tree_parents is None:
        positions = torch.arange(past_len, past_len + n)
        allowed[:n, : past_len + n] = torch.ones(n, past_len + n, dtype=torch.bool).tril(past_len)
    else:
        positions = tree_position_ids(tree_parents, past_len)[0]
        allowed[:n, : past_len + n] = tree_allowed(tree_parents, past_len)
    allowed[n:, 0] = True
    positions = torch.cat([positions, positions[-1:].expand(size - n)])
    return positions[None], additive_mask(allowed, dtype)


MODES = ("eager", "packed", "graphs")
PACKED_WEIGHTS = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Runner:
    """Forward passes of one model in one of MODES. packed changes the model in place (its linear
    layers), so everything that runs the model, transformers generate() included, runs packed."""

    def __init__(self, model: PreTrainedModel, mode: str = "eager", max_context: int = STATIC_MAX_CONTEXT,
                 buckets: Sequence[int] = BUCKETS, static: bool | None = None, weights: str = "fp32"):
        """weights: fp32, or bf16 for a drafter's packed linear layers (packed mode only)."""
        if mode not in MODES:
            raise ValueError(f"unknown forward mode {mode!r}; choose from {', '.join(MODES)}")
        if weights not in PACKED_WEIGHTS or (weights != "fp32" and mode != "packed"):
            raise ValueError(f"weights {weights!r}: packed mode takes {', '.join(PACKED_WEIGHTS)}, other modes fp32")
        self.model = model
        self.mode = mode
        self.static = mode == "graphs" if static is None else static  # static slots without graphs: tests
        self.buckets = tuple(buckets)
        self.max_context = max_context
        self._forward = model.forward
        if mode == "packed":
            from specpipe import native

            native.pack_linears(model, PACKED_WEIGHTS[weights])
        if mode == "graphs":
            if self.buckets[-1] > BUCKETS[-1]:
                raise ValueError(f"buckets go up to {BUCKETS[-1]} tokens")
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(self.buckets))
            options = {"triton.cudagraphs": True} if model.device.type == "cuda" else {"freezing": True}
            self._forward = torch.compile(model.forward, dynamic=False, options=options)

    def new_cache(self) -> Cache:
        if self.static:
            return StaticKV(self.model.config, self.max_context, self.model.dtype, self.model.device)
        return new_cache(self.model)

    @torch.inference_mode()
    def forward(self, cache: Cache, token_ids: Sequence[int], tree_parents: Sequence[int] | None = None) -> torch.Tensor:
        """Feed token_ids after the cached positions; returns logits [len(token_ids), vocab] (float32).
        tree_parents: None for a plain causal continuation, or the parents of token_ids[1:] when
        token_ids is [root] + a tree's nodes (specpipe.verification)."""
        past_len = cache_len(cache)
        if not isinstance(cache, StaticKV):
            if tree_parents is None:
                return forward(self.model, cache, token_ids)
            return forward(self.model, cache, token_ids, tree_position_ids(tree_parents, past_len),
                           tree_attention_mask(tree_parents, past_len, self.model.dtype))
        if past_len + len(token_ids) > cache.capacity:
            raise ValueError(f"{past_len} cached + {len(token_ids)} new tokens exceed the slot ({cache.capacity})")
        size = bucket(len(token_ids), self.buckets)
        if size is None and tree_parents is None:  # longer than the largest bucket: a chain goes in pieces
            step = self.buckets[-1]
            return torch.cat([self.forward(cache, token_ids[i : i + step]) for i in range(0, len(token_ids), step)])
        run = self._forward if size is not None else self.model.forward  # a tree past the largest bucket: eager
        size = size or len(token_ids)
        n = len(token_ids)
        device = self.model.device
        positions, mask = static_inputs(past_len, n, tree_parents, size, cache.width, self.model.dtype)
        ids = torch.tensor([[*token_ids, *[token_ids[-1]] * (size - n)]], dtype=torch.long, device=device)
        cache.set_length(past_len)
        out = run(input_ids=ids, past_key_values=cache.cache, position_ids=positions.to(device),
                  attention_mask=mask.to(device), use_cache=True)
        cache.set_length(past_len + n)
        return out.logits[0, :n].float()

    def warm_up(self, progress: bool = False) -> None:
        """graphs: compile every bucket now (chains and trees of one size share a graph), so no request
        pays for it."""
        if self.mode != "graphs":
            return
        from tqdm import tqdm

        cache = self.new_cache()
        for size in tqdm(self.buckets, desc="compiling forward buckets", disable=not progress):
            start = time.perf_counter()
            crop(cache, 0)
            self.forward(cache, [0] * size)
            log.info("compiled bucket", extra={"bucket": size, "seconds": round(time.perf_counter() - start, 1)})


def served_info(info: ModelInfo, runner: Runner) -> ModelInfo:
    """A model's info as served through runner: static slots bound the context."""
    if not runner.static:
        return info
    return dataclasses.replace(info, max_context=min(info.max_context, runner.max_context))

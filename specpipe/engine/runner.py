"""Forward passes over a per-session KV cache, shared by the verifier and the model drafter.

Three forward modes, one set of cache operations (Runner.forward, crop, fork, keep_tree_path):
- `eager` (`--compile off`): transformers as loaded, over a DynamicCache that grows by concatenation;
- `packed` (`--compile on` on CPU): every fp32 linear layer runs specpipe.engine.native's small-M GEMM,
  built for this CPU, over pre-packed weights; the cache is the same DynamicCache;
- `graphs` (`--compile auto` or `on` on CUDA): a session's cache is a KV slot (specpipe.engine.kv.SlotKV); a forward
  copies the slot's valid prefix into the runner's one working static cache, runs the bucket
  (1, 2, 4, 8, 16, 32 or 64 tokens) that holds its tokens, and copies the new positions back. On
  CUDA each bucket is a CUDA graph captured at warm-up and replayed (seconds at start-up: no
  compiler, as SGLang captures its decode graphs); on the CPU the same buffers run eagerly, which is
  how the tests check the bookkeeping.

Rollback is explicit: a cache is cropped to a token prefix (longest common prefix sync) or
compacted to the positions of an accepted tree path; nothing else changes the cache.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache

from specpipe.core.types import ModelInfo
from specpipe.core.verification import additive_mask, tree_allowed, tree_attention_mask, tree_position_ids
from specpipe.engine.graphs import Graph, new_pool
from specpipe.engine.kv import SlotKV, new_slot, synchronize

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # forward sizes of the graphs mode, one captured graph each
STATIC_MAX_CONTEXT = 2048           # default slot length of the graphs mode (tokens)


class WorkingCache:
    """The graphs mode's one static KV cache: `width` positions of every layer as one tensor
    [layers, kv_heads, width, head_dim] (keys, values), which a transformers StaticCache's layers view,
    so a slot's prefix goes in, and a forward's new positions come out, in one copy each."""

    def __init__(self, config: Any, width: int, dtype: torch.dtype, device: torch.device) -> None:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (config.num_hidden_layers, config.num_key_value_heads, width, head_dim)
        self.width = width
        # Every tensor an inference tensor, made now: a captured graph reads and writes these addresses.
        with torch.inference_mode():
            self.cache = StaticCache(config=config, max_cache_len=width)
            if any(layer.is_sliding for layer in layers_of(self.cache)):
                raise ValueError("a static KV cache needs full-attention layers; this model has sliding-window layers")
            self.cache.early_initialization(1, config.num_key_value_heads, head_dim, dtype, device)
            self.keys = torch.zeros(shape, dtype=dtype, device=device)
            self.values = torch.zeros(shape, dtype=dtype, device=device)
            for i, layer in enumerate(layers_of(self.cache)):
                layer.keys, layer.values = self.keys[i][None], self.values[i][None]  # [1, kv_heads, width, head_dim]
            self.length = torch.zeros((), dtype=torch.long, device=device)  # where the next forward writes

    @torch.inference_mode()
    def load(self, slot: SlotKV) -> None:
        """Take the slot's valid prefix; the next forward writes after it."""
        past = slot.length
        self.keys[:, :, :past].copy_(slot.keys[:, :, :past])
        self.values[:, :, :past].copy_(slot.values[:, :, :past])
        self.length.fill_(past)

    @torch.inference_mode()
    def store(self, slot: SlotKV, n: int) -> None:
        """Append the n positions the last forward wrote after the slot's prefix to the slot."""
        past = slot.length
        slot.reserve(past + n)
        slot.keys[:, :, past : past + n].copy_(self.keys[:, :, past : past + n])
        slot.values[:, :, past : past + n].copy_(self.values[:, :, past : past + n])
        slot.length = past + n


class BucketForward:
    """One forward shape of the graphs mode: `size` tokens over the working cache, from input buffers
    filled before each run (a specpipe.engine.graphs.Graph: captured on CUDA)."""

    def __init__(self, model: PreTrainedModel, working: WorkingCache, size: int):
        device = model.device
        self.model, self.working, self.size = model, working, size
        self.ids = torch.zeros(1, size, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, size, dtype=torch.long, device=device)
        self.mask = torch.zeros(1, 1, size, working.width, dtype=model.dtype, device=device)
        self.graph = Graph(self._forward, device)

    def _forward(self) -> torch.Tensor:
        for layer in layers_of(self.working.cache):  # inside the graph: each layer writes from the working length
            layer.cumulative_length.copy_(self.working.length)
        return self.model(input_ids=self.ids, past_key_values=self.working.cache, position_ids=self.positions,
                          attention_mask=self.mask, use_cache=True).logits  # [1, size, vocab]

    @torch.inference_mode()
    def run(self, token_ids: Sequence[int], positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Feed n <= size tokens with their positions [1, size] and additive mask [1, 1, size, width]
        (padded by static_inputs); returns the logits [n, vocab] (float32, a tensor of its own)."""
        n = len(token_ids)
        self.ids.copy_(torch.tensor([[*token_ids, *[token_ids[-1]] * (self.size - n)]], dtype=torch.long))
        self.positions.copy_(positions)
        self.mask.copy_(mask)
        return self.graph()[0, :n].to(torch.float32, copy=True)


Cache = DynamicCache | SlotKV


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_len(cache: Cache) -> int:
    return cache.length if isinstance(cache, SlotKV) else cache.get_seq_length()


def crop(cache: Cache, length: int) -> None:
    """Keep the first `length` positions (transformers 5 crop takes the NEGATIVE count to drop)."""
    if isinstance(cache, SlotKV):
        cache.crop(length)
        return
    drop = cache_len(cache) - length
    if drop > 0:
        cache.crop(-drop)


def fork(cache: Cache, length: int) -> Cache:
    """A new cache holding the first `length` positions of cache, which stays as it is. Copy-on-write
    for free: the fork's layers start as views of the same tensors, and DynamicLayer.update appends
    by torch.cat (new tensors), never in place. A slot is copied (its prefix only: SlotKV.fork)."""
    if isinstance(cache, SlotKV):
        return cache.fork(length)
    forked = copy.copy(cache)
    forked.layers = [copy.copy(layer) for layer in cache.layers]
    crop(forked, length)
    return forked


def layers_of(cache: Any) -> list[Any]:
    """A transformers cache's layers (typed there as a union of layer kinds: these are full-attention
    layers, with keys, values and, static, a cumulative length)."""
    return list(cache.layers)


def keep_positions(cache: DynamicCache, positions: Sequence[int]) -> None:
    """Keep only the given cache positions, in order (the accepted path of a tree)."""
    index = None
    for layer in layers_of(cache):
        if not layer.is_initialized:
            continue
        if index is None:
            index = torch.tensor(list(positions), device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


def keep_tree_path(cache: Cache, prefix_len: int, nodes: Sequence[int]) -> None:
    """Keep the first prefix_len positions and, of the tree fed after them, the given nodes only."""
    if isinstance(cache, SlotKV):
        cache.keep_tree_path(prefix_len, nodes)
    elif list(nodes) == list(range(len(nodes))):  # a chain prefix: cropping is enough
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
    [1, n] and additive 4-D mask [1, 1, n, past + n] (specpipe.core.verification).
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
PACKED_WEIGHTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8, "w8a8": torch.uint8,
                  "w4a8": torch.int32}
ROUNDED_ACTIVATIONS = ("w8a8", "w4a8")  # weights whose kernels round activations: their models attend row by row


def packed_on_load(mode: str, weights: str = "fp32") -> str | None:
    """What load_model is told to pack a GGUF model in as it reads it: the weights a Runner of mode
    packs in (packed mode), else None."""
    return weights if mode == "packed" else None


class Runner:
    """Forward passes of one model in one of MODES. packed changes the model in place (its linear
    layers), so everything that runs the model, transformers generate() included, runs packed."""

    def __init__(self, model: PreTrainedModel, mode: str = "eager", max_context: int = STATIC_MAX_CONTEXT,
                 buckets: Sequence[int] = BUCKETS, weights: str = "fp32"):
        """weights: the packed linear layers' fp32, or bf16 or int8 (packed mode only).
        max_context, buckets: the graphs mode's slot length and forward sizes."""
        if mode not in MODES:
            raise ValueError(f"unknown forward mode {mode!r}; choose from {', '.join(MODES)}")
        if weights not in PACKED_WEIGHTS or (weights != "fp32" and mode != "packed"):
            raise ValueError(f"weights {weights!r}: packed mode takes {', '.join(PACKED_WEIGHTS)}, other modes fp32")
        self.model = model
        self.mode = mode
        self.weights = weights
        self.static = mode == "graphs"  # slots of max_context tokens, forwards of bucketed sizes
        self.buckets = tuple(sorted(buckets))
        self.max_context = max_context
        self._working: WorkingCache | None = None
        self._forwards: dict[int, BucketForward] = {}
        if mode == "packed":
            from specpipe.engine import native

            native.pack_linears(model, PACKED_WEIGHTS[weights])
            simd = {"w8a8": native.q8_simd, "w4a8": native.q4_simd}.get(weights)
            if simd is not None and simd() == "portable":
                log.warning(f"{weights.upper()} weights on this CPU: the kernel runs its portable integer loop, "
                            "several times slower than int8 weights (--verifier-weights / --draft-weights int8)")

    def _graph_buffers(self) -> WorkingCache:
        """graphs: the working cache and the bucket forwards, made at the first need (a batched service
        never needs them: specpipe.engine.batched.BatchGraphs)."""
        if self._working is None:
            model = self.model
            self._working = WorkingCache(model.config, self.max_context + self.buckets[-1], model.dtype, model.device)
            self._forwards = {size: BucketForward(model, self._working, size) for size in self.buckets}
        return self._working

    def new_cache(self) -> Cache:
        if self.static:
            return new_slot(self.model, self.max_context)
        return new_cache(self.model)

    @torch.inference_mode()
    def forward(
        self, cache: Cache, token_ids: Sequence[int], tree_parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Feed token_ids after the cached positions; returns logits [len(token_ids), vocab] (float32),
        once the device has computed them. tree_parents: None for a plain causal continuation, or the
        parents of token_ids[1:] when token_ids is [root] + a tree's nodes (specpipe.core.verification)."""
        past_len = cache_len(cache)
        if not self.static:
            assert isinstance(cache, DynamicCache)  # not static: new_cache made one
            if tree_parents is None:
                logits = forward(self.model, cache, token_ids)
            else:
                logits = forward(self.model, cache, token_ids, tree_position_ids(tree_parents, past_len),
                                 tree_attention_mask(tree_parents, past_len, self.model.dtype))
        else:
            assert isinstance(cache, SlotKV)  # static: new_cache made one
            logits = self._static_forward(cache, token_ids, tree_parents)
        synchronize(self.model.device)
        return logits

    def _static_forward(
        self, slot: SlotKV, token_ids: Sequence[int], tree_parents: Sequence[int] | None
    ) -> torch.Tensor:
        """graphs: through the working cache and the smallest bucket that holds the tokens."""
        working = self._graph_buffers()
        past_len, n = slot.length, len(token_ids)
        if past_len + n > self.max_context:
            raise ValueError(f"{past_len} cached + {n} new tokens exceed the slot ({self.max_context})")
        size = bucket(n, self.buckets)
        if size is None and tree_parents is None:  # longer than the largest bucket: a chain goes in pieces
            step = self.buckets[-1]
            return torch.cat([self._static_forward(slot, token_ids[i : i + step], None) for i in range(0, n, step)])
        # a tree past the largest bucket runs eagerly, at its own size, over the same working cache
        run = self._forwards[size] if size is not None else BucketForward(self.model, working, n)
        positions, mask = static_inputs(past_len, n, tree_parents, run.size, working.width, self.model.dtype)
        working.load(slot)
        logits = run.run(token_ids, positions, mask)
        working.store(slot, n)
        return logits

    def warm_up(self, progress: bool = False) -> None:
        """graphs: run every bucket once and, on CUDA, capture it as a CUDA graph (largest first, all in
        one memory pool: they never run at once), so no request pays for it. Chains and trees of one
        size share a graph."""
        if not self.static:
            return
        from tqdm import tqdm

        self._graph_buffers()
        pool = new_pool(self.model.device)
        slot = self.new_cache()
        for size in tqdm(sorted(self.buckets, reverse=True), desc="capturing forward graphs", disable=not progress):
            start = time.perf_counter()
            self._forwards[size].graph.capture(pool)
            crop(slot, 0)
            self.forward(slot, [0] * size)
            log.info(
                "forward bucket ready",
                extra={
                    "bucket": size,
                    "captured": self._forwards[size].graph.graph is not None,
                    "seconds": round(time.perf_counter() - start, 2),
                },
            )


def served_info(info: ModelInfo, runner: Runner) -> ModelInfo:
    """A model's info as served through runner: static slots bound the context."""
    if not runner.static:
        return info
    return dataclasses.replace(info, max_context=min(info.max_context, runner.max_context))

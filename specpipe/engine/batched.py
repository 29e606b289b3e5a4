"""One forward pass over the work of many sessions (docs/batching.md), for the Llama / Qwen2 family;
shared by the verifier and the model drafter.

Every session's tokens (a prefill chunk, [root] + a draft tree, or a drafter's catch-up / next draft token)
are flattened into one ragged batch [num_tokens, hidden]. Embeddings, norms, every linear layer (q/k/v/o
projections, the MLP) and RoPE run on the flat batch: one GEMM for all sessions, where batching pays.
Attention runs per session: its queries against its own slot (past + its new tokens) under its own mask
(causal for a chunk, ancestors for a tree). The final norm and lm_head run only on the rows that need logits.

Batch invariance: a session's rows go through the same per-row operations whatever their batch mates
(the packed GEMM computes every row the same way for every M; attention is per session), so a
session's logits do not depend on who else is in the forward. Attention within a session's own step
is invariant only in a W8A8 model's forward, which attends row by row (native.row_exact_attention):
elsewhere scaled_dot_product_attention's CPU kernel gives a query row bits that depend on the rows
and keys beside it (docs/batching.md), which int8 activations would round into other tokens. MKL's
fp32 GEMM, which runs every nn.Linear in eager mode, does not by itself, and differently by CPU: on a
Xeon rows differed from 6 to 16 rows on, which its strict reproducibility mode (MKL_CBWR, turned on by
specpipe/__init__.py) removes; on an AMD EPYC, strict mode or not, rows differ for M = 1..3 and are
bitwise equal for every M >= 4. So where an nn.Linear runs, a batch of fewer than MIN_GEMM_ROWS rows
is padded to that many (the drafter's steps are one token per session: M = 1 alone). A model whose
linear layers are all packed is not padded (a lone decode step padded to 4 rows made SmolLM2's packed
forward 12% slower).

In the graphs mode (CUDA) the same work runs as captured forwards of padded batches (BatchGraphs,
below; docs/gpu.md). cuBLAS picks its kernels by shape, so there a row's last bits can depend on the
batch's shape: batch invariance is this module's on the CPU, not yet on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from specpipe.core.verification import additive_mask
from specpipe.engine import native
from specpipe.engine.graphs import Graph, new_pool
from specpipe.engine.kv import SlotKV, synchronize
from specpipe.engine.runner import bucket

SUPPORTED_TYPES = ("llama", "qwen2")  # decoder layers of the same shape (Qwen2 adds q/k/v biases)
MIN_GEMM_ROWS = 4                     # fewer rows are padded where MKL runs: see the module docstring


def supports(model: PreTrainedModel) -> str | None:
    """None if the batched forward runs this model exactly; otherwise why not (it falls back to the
    model-generic one-session forward)."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES:
        return f"model type {config.model_type!r} (batched: {', '.join(SUPPORTED_TYPES)})"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    return None


def unbatched_reason(model: PreTrainedModel, batching: bool = True) -> str | None:
    """None if a service runs this model through batched_forward; otherwise why it runs one session
    per forward (specpipe.engine.runner): batching off, or an unsupported model."""
    return "batching off" if not batching else supports(model)


def service_forward(model: PreTrainedModel, mode: str, max_context: int,
                    progress: bool = False) -> Callable[[Sequence[Segment]], list[torch.Tensor | None]]:
    """The batched forward a service's scheduler runs: batched_forward, or in the graphs mode a
    BatchGraphs' (captured now, before the first request)."""
    if mode != "graphs":
        # the model's linear layers are packed (or not) for good by now
        pad, layers = min_rows(model), layer_plans(model)
        return lambda segments: batched_forward(model, segments, pad, layers)
    graphs = BatchGraphs(model, max_context)
    graphs.warm_up(progress)
    return graphs.forward


@dataclass(frozen=True)
class Segment:
    """One session's share of a batched forward: n tokens fed after kv.length cached positions."""

    kv: SlotKV
    token_ids: tuple[int, ...]      # [n]
    positions: torch.Tensor         # [n] absolute positions (past + depth for a tree)
    allowed: torch.Tensor           # [n, n] bool: which of the new tokens each new token may see
    logit_rows: int                 # how many of its last rows need logits (verify: n; drafter: 1; prefill: 0)


def _allowed(segment: Segment, group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """[group * n, past + n]: what each of a segment's queries (a key-value head's group of query
    heads, stacked) may see of its slot, the same in every layer (made once a forward); None for a
    lone token, which sees every position. Additive, 0 and -inf: the mask scaled_dot_product_attention
    would make of the boolean one in each layer."""
    n, past = len(segment.token_ids), segment.kv.length
    if n == 1:
        return None
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device)  # [n, past + n]
    allowed[:, past:] = segment.allowed
    return torch.zeros(group * n, past + n, dtype=dtype, device=device).masked_fill_(
        ~allowed.repeat(group, 1), -torch.inf
    )


def _visible(segment: Segment) -> torch.Tensor:
    """[n, past + n] bool: what each of a segment's queries may see of its slot, for row-exact attention
    (made once a forward)."""
    n, past = len(segment.token_ids), segment.kv.length
    visible = torch.ones(n, past + n, dtype=torch.bool)
    visible[:, past:] = segment.allowed
    return visible


def _attend(scaling: float, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, segments: Sequence[Segment],
            layer: int, offsets: Sequence[int], masks: Sequence[torch.Tensor | None], row_exact: bool = False,
            ) -> torch.Tensor:
    """q: [heads, rows, head_dim]; k_new, v_new: [kv_heads, rows, head_dim] (rows: the segments' tokens,
    then padding); masks: each segment's _allowed (row_exact: its _visible). Returns [rows, heads * head_dim],
    zero on padding rows.
    A key-value head's group of query heads attends as one [group * n] block of queries (grouped-query
    attention without repeating keys and values per query head: a slot deep into a long prompt is
    read once per key-value head). row_exact: each query row over exactly its visible keys instead
    (native.row_exact_attention: the same bits alone, in a draft or in a chunk; a W8A8 model's)."""
    heads, rows, head_dim = q.shape
    group = heads // k_new.shape[0]
    out = q.new_zeros(rows, heads * head_dim) if len(segments) > 1 or len(segments[0].token_ids) < rows else None
    for segment, start, allowed in zip(segments, offsets, masks):
        n, past = len(segment.token_ids), segment.kv.length
        end = start + n
        segment.kv.write(layer, past, k_new[:, start:end], v_new[:, start:end])
        keys, values = segment.kv.view(layer, past + n)  # [kv_heads, past + n, head_dim]
        if row_exact:
            assert allowed is not None  # _visible gives every segment its mask
            o = native.row_exact_attention(q[:, start:end], keys, values, allowed, scaling)
        else:
            queries = q[:, start:end].reshape(-1, group * n, head_dim)            # [kv_heads, group * n, head_dim]
            o = F.scaled_dot_product_attention(queries[None], keys[None], values[None], attn_mask=allowed,
                                               scale=scaling)                # [1, kv_heads, group * n, head_dim]
            o = o[0].reshape(heads, n, head_dim).transpose(0, 1).reshape(n, -1)
        if out is None:  # one segment, no padding: its rows are the output
            return o
        out[start:end] = o
    assert out is not None  # more than one segment, or padding: allocated before the loop
    return out


def min_rows(model: nn.Module) -> int:
    """The rows a forward of model is padded to: MIN_GEMM_ROWS where any nn.Linear (MKL's GEMM) runs,
    1 where every linear layer is packed (see the module docstring). A walk over the modules (about a
    millisecond for a 30-layer model): a service takes it once (service_forward)."""
    return MIN_GEMM_ROWS if any(type(m) is nn.Linear for m in model.modules()) else 1


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [rows, ...] with zero rows appended up to rows."""
    pad = rows - x.shape[0]
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad > 0 else x


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's cos and sin [..., n, head_dim] (the model's rotary_emb) as [..., n, 1,
    head_dim] tables for rotate, the first half of sin negated (made once a forward)."""
    half = cos.shape[-1] // 2
    return cos.unsqueeze(-2), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).unsqueeze(-2)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE of x [..., n, heads, head_dim]: transformers' x * cos + rotate_half(x) * sin in four ops
    for its five, the same bits ((-a) * b is -(a * b), and a sum does not depend on its order)."""
    rotated = x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin)
    return rotated.add_(x * cos)


def rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:  # norm: a Llama / Qwen2 RMSNorm
    """norm(x) for a Llama / Qwen2 RMSNorm: in float32 the same ops without its two dtype casts and
    with two of them in place (the same bits); other dtypes run the module."""
    if x.dtype != torch.float32 or norm.weight.dtype != torch.float32:
        return norm(x)
    return _rms_norm_f32(norm.weight, norm.variance_epsilon, x)


def _rms_norm_f32(weight: torch.Tensor, eps: float, x: torch.Tensor) -> torch.Tensor:
    scale = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()  # [R, 1]
    return (x * scale).mul_(weight)


def _norm(norm: Any) -> Callable[[torch.Tensor], torch.Tensor]:  # norm: a Llama / Qwen2 RMSNorm
    """rms_norm of norm as a function of x, for a model whose activations are its weight's dtype."""
    if norm.weight.dtype != torch.float32:
        return norm
    return functools.partial(_rms_norm_f32, norm.weight, norm.variance_epsilon)


def _linear(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A linear layer as a function of x [R, in]: a packed layer's kernel bound once, else the module."""
    bound = getattr(module, "bound", None)
    return bound() if bound is not None else module


@dataclass(frozen=True)
class LayerPlan:
    """A decoder layer's parts as the batched forward calls them, looked up once: a forward would
    otherwise pay microseconds for every module attribute and nn.Module call, tens of them a layer
    (about a third of a decode step's time for a 135M model on a CPU). The same ops, the same bits."""

    input_norm: Callable[[torch.Tensor], torch.Tensor]
    post_norm: Callable[[torch.Tensor], torch.Tensor]
    qkv: Callable[[torch.Tensor], torch.Tensor] | None  # q, k, v as one GEMM (a PackedGroup), or None
    qkv_columns: tuple[tuple[int, int], ...]            # ... each projection's (first column, width) in its output
    projections: tuple[Callable, Callable, Callable]    # q, k, v one by one (no group)
    o_proj: Callable[[torch.Tensor], torch.Tensor]
    gate_up: Callable[[torch.Tensor], torch.Tensor] | None  # gate and up as one GEMM, or None
    gate_up_columns: tuple[tuple[int, int], ...]
    mlp: nn.Module                                      # the MLP as a module (no group)
    down_proj: Callable[[torch.Tensor], torch.Tensor]
    act_fn: Callable[[torch.Tensor], torch.Tensor]
    head_dim: int
    scaling: float
    row_exact: bool = False  # attention row by row (native.row_exact_attention): a W8A8 model's


def layer_plans(model: PreTrainedModel) -> tuple[LayerPlan, ...]:
    """Every decoder layer's LayerPlan. Made once a model is packed (or not) for good: a service makes
    them once (service_forward), batched_forward without them makes them each call."""
    plans = []
    silu = getattr(model.config, "hidden_act", None) == "silu"  # the activation transformers runs as F.silu
    row_exact = native.row_exact(model)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = getattr(attn, "packed_qkv", None), getattr(mlp, "packed_gate_up", None)
        plans.append(LayerPlan(
            _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm),
            qkv.bound() if qkv is not None else None, qkv.columns if qkv is not None else (),
            (_linear(attn.q_proj), _linear(attn.k_proj), _linear(attn.v_proj)), _linear(attn.o_proj),
            gate_up.bound() if gate_up is not None else None, gate_up.columns if gate_up is not None else (),
            mlp, _linear(mlp.down_proj), F.silu if silu else mlp.act_fn, attn.head_dim, attn.scaling, row_exact))
    return tuple(plans)


def _project(plan: LayerPlan, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's q [heads, R, head_dim] and k [kv_heads, R, head_dim], rotated, and v [kv_heads, R,
    head_dim] of x [R, hidden]: one GEMM where the three projections are packed alike
    (specpipe.engine.native.PackedGroup, the same bits as three), and one rotation of q and k where
    their columns are adjacent in its output."""
    rows, head_dim = x.shape[0], plan.head_dim
    if plan.qkv is None:
        q, k, v = (projection(x) for projection in plan.projections)
        q, k = rotate(q.view(rows, -1, head_dim), cos, signed_sin), rotate(k.view(rows, -1, head_dim), cos, signed_sin)
    else:
        y = plan.qkv(x)  # [R, width]
        (_, q_width), (k_start, k_width), (v_start, v_width) = plan.qkv_columns  # q starts at column 0
        v = y[:, v_start : v_start + v_width]
        if k_start == q_width:  # q | k: one [R, heads + kv_heads, head_dim]
            qk = rotate(y[:, : q_width + k_width].view(rows, -1, head_dim), cos, signed_sin)
            q, k = qk[:, : q_width // head_dim], qk[:, q_width // head_dim :]
        else:
            q = rotate(y[:, :q_width].view(rows, -1, head_dim), cos, signed_sin)
            k = rotate(y[:, k_start : k_start + k_width].view(rows, -1, head_dim), cos, signed_sin)
    return q.transpose(0, 1), k.transpose(0, 1), v.view(rows, -1, head_dim).transpose(0, 1)


def _mlp(plan: LayerPlan, x: torch.Tensor) -> torch.Tensor:
    """The MLP of x, its gate and up projections as one GEMM where they are packed alike (the same bits)."""
    if plan.gate_up is None:
        return plan.mlp(x)
    y = plan.gate_up(x)
    (gate_start, gate_width), (up_start, up_width) = plan.gate_up_columns
    gate, up = y[:, gate_start : gate_start + gate_width], y[:, up_start : up_start + up_width]
    return plan.down_proj(plan.act_fn(gate) * up)


@torch.inference_mode()
def batched_forward(model: PreTrainedModel, segments: Sequence[Segment], pad: int | None = None,
                    layers: Sequence[LayerPlan] | None = None) -> list[torch.Tensor | None]:
    """Feed every segment after its cached positions and append them to its slot (kv.length grows by
    n). Returns, per segment, the logits [logit_rows, vocab] (float32) of its last logit_rows rows,
    or None where it needs none. pad: min_rows(model), layers: layer_plans(model), where the caller
    has them (a service: once)."""
    inner = model.model
    device = model.device
    lengths = [len(s.token_ids) for s in segments]
    offsets = [sum(lengths[:i]) for i in range(len(segments))]
    for segment, n in zip(segments, lengths):
        segment.kv.reserve(segment.kv.length + n)
    ids = torch.tensor([t for s in segments for t in s.token_ids], dtype=torch.long, device=device)  # [T]
    positions = torch.cat([s.positions for s in segments]).to(device)                                # [T]
    pad = min_rows(model) if pad is None else pad
    ids, positions = _pad_rows(ids, pad), _pad_rows(positions, pad)                                  # [R >= T]
    hidden = inner.embed_tokens(ids)                                                                  # [R, hidden]
    cos, signed_sin = rope_tables(*(t[0] for t in inner.rotary_emb(hidden[None], positions[None])))  # [R, 1, head_dim]
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    plans = layers if layers is not None else layer_plans(model)
    row_exact = any(plan.row_exact for plan in plans)  # a W8A8 model: every layer's attention row by row
    masks = [_visible(segment) if row_exact else _allowed(segment, group, hidden.dtype, device) for segment in segments]
    for layer_idx, plan in enumerate(plans):
        q, k, v = _project(plan, plan.input_norm(hidden), cos, signed_sin)
        hidden = hidden + plan.o_proj(_attend(plan.scaling, q, k, v, segments, layer_idx, offsets, masks, row_exact))
        hidden = hidden + _mlp(plan, plan.post_norm(hidden))
    for segment, n in zip(segments, lengths):
        segment.kv.length += n

    rows = [i for s, start, n in zip(segments, offsets, lengths) for i in range(start + n - s.logit_rows, start + n)]
    logits = (
        model.lm_head(_pad_rows(rms_norm(inner.norm, hidden[rows]), pad)).float() if rows else None
    )  # [>= len(rows), vocab]
    synchronize(device)  # the forward's time is measured to its end (CUDA runs asynchronously)
    out, row = [], 0
    for segment in segments:
        out.append(logits[row : row + segment.logit_rows] if logits is not None and segment.logit_rows else None)
        row += segment.logit_rows
    return out


SESSION_BUCKETS = (1, 2, 4, 8, 16, 32)  # graphs mode: sessions per captured forward of whole steps
TOKEN_BUCKETS = (1, 2, 4, 8, 16)        # graphs mode: tokens per session of a whole step (decode, verify)
CHUNK_BUCKETS = (32, 64, 128, 256)      # graphs mode: tokens of a prompt chunk, one session per forward


def is_chunk(segment: Segment, max_step_tokens: int) -> bool:
    """Whether the graphs mode runs a segment as a forward of its own: a prompt chunk (no logits), or a
    step longer than the largest captured step. A short chunk in the batch of whole steps would pad
    every session's step to its length (32 sessions of one token padded to 16: twice the forward)."""
    return not segment.logit_rows or len(segment.token_ids) > max_step_tokens


class BatchGraphs:
    """The batched forward in the graphs mode: captured forwards of fixed shapes (sessions, tokens).
    A batch's whole steps (decode or verify: up to TOKEN_BUCKETS[-1] tokens each) run as one forward
    of the smallest (sessions, tokens) bucket that holds them (in groups of SESSION_BUCKETS[-1]), and
    each prompt chunk (is_chunk) as a forward of its own (1, CHUNK_BUCKETS) bucket, so a chunk never
    turns its batch mates' decode steps into an eager forward or pads them to its length; a chunk past
    the largest bucket runs batched_forward. A session's logits do not depend on its mates
    (docs/batching.md), so splitting a batch changes no token.

    The captured forward is padded, not ragged: input buffers [B, n], and a working cache of B rows of
    `width` positions per layer ([layers, B, kv_heads, width, head_dim]) that each session's slot
    prefix is copied into before the replay and its new positions copied back from after it. Each
    session attends over its row under its own additive mask [n, width] (its prefix, then its step's
    `allowed`); padding rows and sessions see position 0 only, and what they write is never read."""

    def __init__(self, model: PreTrainedModel, max_context: int, sessions: Sequence[int] = SESSION_BUCKETS,
                 tokens: Sequence[int] = TOKEN_BUCKETS, chunks: Sequence[int] = CHUNK_BUCKETS):
        config, device = model.config, model.device
        self.model, self.sessions, self.tokens = model, tuple(sorted(sessions)), tuple(sorted(tokens))
        self.chunks = tuple(c for c in sorted(chunks) if c > self.tokens[-1])
        self.width = max_context + max(self.tokens[-1], *self.chunks)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (config.num_hidden_layers, self.sessions[-1], config.num_key_value_heads, self.width, head_dim)
        with torch.inference_mode():  # fixed addresses: the graphs read and write these
            self.keys = torch.zeros(shape, dtype=model.dtype, device=device)
            self.values = torch.zeros(shape, dtype=model.dtype, device=device)
            self.lengths = torch.zeros(self.sessions[-1], dtype=torch.long, device=device)  # where each row writes
        shapes = [(b, n) for b in self.sessions for n in self.tokens] + [(1, c) for c in self.chunks]
        self._graphs = {shape: self._new_graph(*shape) for shape in shapes}

    def _new_graph(self, b: int, n: int) -> tuple[dict[str, torch.Tensor], Graph]:
        device = self.model.device
        with torch.inference_mode():
            inputs = {"ids": torch.zeros(b, n, dtype=torch.long, device=device),
                      "positions": torch.zeros(b, n, dtype=torch.long, device=device),
                      "mask": torch.zeros(b, 1, n, self.width, dtype=self.model.dtype, device=device)}
        return inputs, Graph(lambda: self._padded_forward(**inputs), device)

    def warm_up(self, progress: bool = False) -> None:
        """Capture every shape, largest first, in one memory pool (on CUDA; elsewhere run each once)."""
        from tqdm import tqdm

        pool = new_pool(self.model.device)
        shapes = sorted(self._graphs, key=lambda shape: shape[0] * shape[1], reverse=True)
        for shape in tqdm(shapes, desc="capturing batched forward graphs", disable=not progress):
            _, graph = self._graphs[shape]
            graph.capture(pool)
            graph()

    def _padded_forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, positions [B, n]; mask [B, 1, n, width] (additive). Returns the logits [B, n, vocab]."""
        inner = self.model.model
        b, n = ids.shape
        write = self.lengths[:b, None] + torch.arange(n, device=ids.device)   # [B, n] slot positions
        hidden = inner.embed_tokens(ids)                                      # [B, n, hidden]
        config = self.model.config
        group = config.num_attention_heads // config.num_key_value_heads
        mask = mask.repeat(1, 1, group, 1)  # [B, 1, group * n, width]: a group's queries in one block, as in _attend
        cos, signed_sin = rope_tables(*inner.rotary_emb(hidden, positions))   # [B, n, 1, head_dim]
        for layer_idx, layer in enumerate(inner.layers):
            attn = layer.self_attn
            keys, values = self.keys[layer_idx, :b], self.values[layer_idx, :b]  # [B, kv_heads, width, head_dim]
            kv_heads, head_dim = keys.shape[1], keys.shape[3]
            x = layer.input_layernorm(hidden)
            q = rotate(attn.q_proj(x).view(b, n, -1, head_dim), cos, signed_sin).transpose(
                1, 2
            )  # [B, heads, n, head_dim]
            k = rotate(attn.k_proj(x).view(b, n, -1, head_dim), cos, signed_sin).transpose(
                1, 2
            )  # [B, kv_heads, n, head_dim]
            v = attn.v_proj(x).view(b, n, -1, head_dim).transpose(1, 2)
            index = write[:, None, :, None].expand(b, kv_heads, n, head_dim)
            keys.scatter_(2, index, k)
            values.scatter_(2, index, v)
            o = F.scaled_dot_product_attention(q.reshape(b, kv_heads, group * n, head_dim), keys, values,
                                               attn_mask=mask, scale=attn.scaling)
            o = o.reshape(b, -1, n, head_dim).transpose(1, 2).reshape(b, n, -1)  # [B, n, heads * head_dim]
            hidden = hidden + attn.o_proj(o)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(inner.norm(hidden))                          # [B, n, vocab]

    @torch.inference_mode()
    def forward(self, segments: Sequence[Segment]) -> list[torch.Tensor | None]:
        """batched_forward's contract, over the captured shapes (see the class docstring)."""
        steps = [i for i, s in enumerate(segments) if not is_chunk(s, self.tokens[-1])]
        groups = [steps[i : i + self.sessions[-1]] for i in range(0, len(steps), self.sessions[-1])]
        groups += [[i] for i, s in enumerate(segments) if is_chunk(s, self.tokens[-1])]
        out: list[torch.Tensor | None] = [None] * len(segments)
        for group in groups:
            for i, logits in zip(group, self._run([segments[i] for i in group])):
                out[i] = logits
        synchronize(self.model.device)
        return out

    def _run(self, segments: Sequence[Segment]) -> list[torch.Tensor | None]:
        """One captured forward of the smallest shape that holds the segments (batched_forward if none)."""
        longest = max(len(s.token_ids) for s in segments)
        n = bucket(longest, self.tokens) or (bucket(longest, self.chunks) if len(segments) == 1 else None)
        if n is None:
            return batched_forward(self.model, segments)
        b = bucket(len(segments), self.sessions)
        assert b is not None, f"{len(segments)} sessions: more than the largest captured batch"
        inputs, graph = self._graphs[b, n]
        ids = torch.zeros(b, n, dtype=torch.long)
        positions = torch.zeros(b, n, dtype=torch.long)
        allowed = torch.zeros(b, n, self.width, dtype=torch.bool)
        allowed[:, :, 0] = True  # padding rows and sessions
        for row, segment in enumerate(segments):
            m, past = len(segment.token_ids), segment.kv.length
            ids[row, :m], ids[row, m:] = torch.tensor(segment.token_ids), segment.token_ids[-1]
            positions[row, :m], positions[row, m:] = segment.positions, segment.positions[-1]
            allowed[row, :m, :past] = True
            allowed[row, :m, past : past + m] = segment.allowed
            self.keys[:, row, :, :past].copy_(segment.kv.keys[:, :, :past])
            self.values[:, row, :, :past].copy_(segment.kv.values[:, :, :past])
        self.lengths[: len(segments)].copy_(torch.tensor([s.kv.length for s in segments]))
        inputs["ids"].copy_(ids)
        inputs["positions"].copy_(positions)
        inputs["mask"].copy_(additive_mask(allowed, self.model.dtype)[0, 0, :, None])
        logits = graph()
        out = []
        for row, segment in enumerate(segments):
            m, past = len(segment.token_ids), segment.kv.length
            segment.kv.reserve(past + m)
            segment.kv.keys[:, :, past : past + m].copy_(self.keys[:, row, :, past : past + m])
            segment.kv.values[:, :, past : past + m].copy_(self.values[:, row, :, past : past + m])
            segment.kv.length = past + m
            rows = segment.logit_rows
            out.append(logits[row, m - rows : m].to(torch.float32, copy=True) if rows else None)
        return out

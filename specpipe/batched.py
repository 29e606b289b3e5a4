"""One forward pass over the work of many sessions (docs/batching.md), for the Llama / Qwen2 family;
shared by the verifier and the model drafter.

Every session's tokens (a prefill chunk, [root] + a draft tree, or a drafter's catch-up / next
draft token) are flattened into one ragged batch [num_tokens, hidden]. Embeddings, norms, every linear layer (q/k/v/o projections, the MLP)
and RoPE run on the flat batch: one GEMM for all sessions, where batching pays. Attention runs per
session: its queries against its own slot (past + its new tokens) under its own mask (causal for a
chunk, ancestors for a tree). The final norm and lm_head run only on the rows that need logits.

Batch invariance: a session's rows go through the same per-row operations whatever their batch mates
(the packed GEMM computes every row the same way for every M; attention is per session), so a
session's logits do not depend on who else is in the forward. MKL's fp32 GEMM, which runs every
nn.Linear in eager mode, does not by itself, and differently by CPU: on a Xeon rows differed from 6
to 16 rows on, which its strict reproducibility mode (MKL_CBWR, turned on by specpipe/__init__.py)
removes; on an AMD EPYC, strict mode or not, rows differ for M = 1..3 and are bitwise equal for every
M >= 4. So where an nn.Linear runs, a batch of fewer than MIN_GEMM_ROWS rows is padded to that many
(the drafter's steps are one token per session: M = 1 alone). A model whose linear layers are all
packed is not padded (a lone decode step padded to 4 rows made SmolLM2's packed forward 12% slower).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specpipe.kv import SlotKV

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


def unbatched_reason(model: PreTrainedModel, mode: str, batching: bool = True) -> str | None:
    """None if a service runs this model through batched_forward; otherwise why it runs one session
    per forward (specpipe.runner): batching off, the CUDA graphs mode, or an unsupported model."""
    if not batching:
        return "batching off"
    return "the CUDA graphs mode" if mode == "graphs" else supports(model)


@dataclass(frozen=True)
class Segment:
    """One session's share of a batched forward: n tokens fed after kv.length cached positions."""

    kv: SlotKV
    token_ids: tuple[int, ...]      # [n]
    positions: torch.Tensor         # [n] absolute positions (past + depth for a tree)
    allowed: torch.Tensor           # [n, n] bool: which of the new tokens each new token may see
    logit_rows: int                 # how many of its last rows need logits (verify: n; drafter: 1; prefill: 0)


def new_slot(model: PreTrainedModel, max_context: int) -> SlotKV:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return SlotKV(config.num_hidden_layers, config.num_key_value_heads, head_dim, model.dtype, model.device,
                  max_context)


def _attend(attn, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, segments: Sequence[Segment],
            layer: int, offsets: Sequence[int]) -> torch.Tensor:
    """q: [heads, rows, head_dim]; k_new, v_new: [kv_heads, rows, head_dim] (rows: the segments' tokens,
    then padding). Returns [rows, heads * head_dim], zero on padding rows.
    A key-value head's group of query heads attends as one [group * n] block of queries (grouped-query
    attention without repeating keys and values per query head: a slot deep into a long prompt is
    read once per key-value head)."""
    heads, rows, head_dim = q.shape
    group = heads // k_new.shape[0]
    out = q.new_zeros(rows, heads * head_dim)
    for segment, start in zip(segments, offsets):
        n, past = len(segment.token_ids), segment.kv.length
        end = start + n
        segment.kv.write(layer, past, k_new[:, start:end], v_new[:, start:end])
        keys, values = segment.kv.view(layer, past + n)  # [kv_heads, past + n, head_dim]
        allowed = None  # a lone token sees every position
        if n > 1:
            allowed = torch.ones(n, past + n, dtype=torch.bool, device=q.device)  # [n, past + n]
            allowed[:, past:] = segment.allowed
            allowed = allowed.repeat(group, 1)                                    # [group * n, past + n]
        queries = q[:, start:end].reshape(-1, group * n, head_dim)                # [kv_heads, group * n, head_dim]
        o = F.scaled_dot_product_attention(queries[None], keys[None], values[None], attn_mask=allowed,
                                           scale=attn.scaling)                    # [1, kv_heads, group * n, head_dim]
        out[start:end] = o[0].reshape(heads, n, head_dim).transpose(0, 1).reshape(n, -1)
    return out


def min_rows(model: nn.Module) -> int:
    """The rows a forward of model is padded to: MIN_GEMM_ROWS where any nn.Linear (MKL's GEMM) runs,
    1 where every linear layer is packed (see the module docstring). A walk over the modules: tens of
    microseconds, against milliseconds of forward."""
    return MIN_GEMM_ROWS if any(type(m) is nn.Linear for m in model.modules()) else 1


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [rows, ...] with zero rows appended up to rows."""
    pad = rows - x.shape[0]
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad > 0 else x


@torch.inference_mode()
def batched_forward(model: PreTrainedModel, segments: Sequence[Segment]) -> list[torch.Tensor | None]:
    """Feed every segment after its cached positions and append them to its slot (kv.length grows by
    n). Returns, per segment, the logits [logit_rows, vocab] (float32) of its last logit_rows rows,
    or None where it needs none."""
    inner = model.model
    device = model.device
    lengths = [len(s.token_ids) for s in segments]
    offsets = [sum(lengths[:i]) for i in range(len(segments))]
    for segment, n in zip(segments, lengths):
        segment.kv.reserve(segment.kv.length + n)
    ids = torch.tensor([t for s in segments for t in s.token_ids], dtype=torch.long, device=device)  # [T]
    positions = torch.cat([s.positions for s in segments]).to(device)                                # [T]
    pad = min_rows(model)
    ids, positions = _pad_rows(ids, pad), _pad_rows(positions, pad)                                  # [R >= T]
    hidden = inner.embed_tokens(ids)                                                                  # [R, hidden]
    cos, sin = inner.rotary_emb(hidden[None], positions[None])                                       # [1, R, head_dim]
    for layer_idx, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (x.shape[0], -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(0, 1)[None]   # [1, heads, T, head_dim]
        k = attn.k_proj(x).view(shape).transpose(0, 1)[None]   # [1, kv_heads, T, head_dim]
        v = attn.v_proj(x).view(shape).transpose(0, 1)         # [kv_heads, T, head_dim]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        hidden = hidden + attn.o_proj(_attend(attn, q[0], k[0], v, segments, layer_idx, offsets))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    for segment, n in zip(segments, lengths):
        segment.kv.length += n

    rows = [i for s, start, n in zip(segments, offsets, lengths) for i in range(start + n - s.logit_rows, start + n)]
    logits = model.lm_head(_pad_rows(inner.norm(hidden[rows]), pad)).float() if rows else None  # [>= len(rows), vocab]
    out, row = [], 0
    for segment in segments:
        out.append(logits[row : row + segment.logit_rows] if segment.logit_rows else None)
        row += segment.logit_rows
    return out

"""Packed linear layers: the CPU side of `--compile on`.

Every fp32 nn.Linear of a model is replaced by a PackedLinear whose weight is packed once into
column panels and multiplied by packed_gemm.c, a small-M GEMM built for this CPU the first time it is
needed (specpipe.engine.native.toolchain). Why: BLAS is slow exactly at the 1-32 rows that decoding and
verification feed (packed_gemm.c says more), and torch.compile on CPU lowers fp32 linears to the same
BLAS calls.

Weights are packed in fp32, in bf16 (half the bytes to stream per token, fp32 arithmetic) or in int8
with a scale per output feature (a quarter of the bytes; round(w / scale), scale = max |w| of the
feature's row / 127), multiplied in fp32 ("int8") or, with the activations quantized to int8 too,
in integer dot products ("w8a8": uint8-packed, packed_gemm.c says how), or as 4-bit Q4_K blocks times
int8 activations ("w4a8": int32 words; a GGUF's own Q4_K blocks as they are): a drafter's rounding
changes which tokens it proposes, never which tokens are emitted; a verifier's (--verifier-weights)
makes a model of its own, whose greedy decoding speculation reproduces.

GGUF blocks are also dequantized here (dequantize: gguf's values, bit for bit, at memory speed).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import nn

from specpipe.engine import cores
from specpipe.engine.native import toolchain
from specpipe.engine.native.toolchain import build

Kernel = Callable[..., int]  # a ctypes kernel function: 0, or nonzero when out of memory
BoundLinear = Callable[[torch.Tensor], torch.Tensor]
# packed weight dtype -> kernel suffix; uint8: int8 weights for the W8A8 kernel (integer dot products);
# int32: Q4_K blocks for the W4A8 kernel (words of nibbles, scales and mins: packed_gemm.c)
WEIGHT_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int8: "i8", torch.uint8: "q8", torch.int32: "q4"}
QUANTIZED = (torch.int8, torch.uint8)  # packed from quantize_int8's weights, with their scales


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    lib.specpipe_panel_width.restype = ctypes.c_int
    lib.specpipe_q8_block.restype = ctypes.c_int
    lib.specpipe_row_exact_attention.restype = ctypes.c_int
    lib.specpipe_row_exact_attention.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int]
    lib.specpipe_dequantize.restype = ctypes.c_int
    lib.specpipe_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int]
    for suffix in WEIGHT_DTYPES.values():
        kernel = getattr(lib, f"specpipe_packed_linear_{suffix}")
        kernel.restype = ctypes.c_int
        kernel.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return lib


def panel_width() -> int:
    return library().specpipe_panel_width()


@functools.lru_cache(maxsize=None)
def q8_block() -> int:
    """Input features per activation scale of the W8A8 kernel (its K is padded to a multiple)."""
    return library().specpipe_q8_block()


SIMD = ("portable", "avx2", "avx512-vnni")  # where an integer kernel's dot products run


def q8_simd() -> str:
    """Where the W8A8 kernel's integer dot products run here: AVX-512 VNNI, AVX2, or a portable integer
    loop (the same sums, several times slower than the int8-weights kernel)."""
    return SIMD[library().specpipe_q8_simd()]


@functools.lru_cache(maxsize=None)
def q4_block() -> int:
    """Input features per super-block of the W4A8 kernel: Q4_K's (its K is padded to a multiple)."""
    return library().specpipe_q4_block()


def q4_simd() -> str:
    """Where the W4A8 kernel's integer dot products run here: AVX-512 VNNI, AVX2, or a portable integer
    loop (the same sums: the same bits on each)."""
    return SIMD[library().specpipe_q4_simd()]


Q4_K_BYTES = 144  # a Q4_K block: d, dmin (fp16), 12 bytes of 6-bit scales and mins, 128 of nibbles
Q4_WORDS = 38  # int32 words a packed column's super-block: 32 of nibbles, 2 of scales, 2 of mins, d, dmin


def quantize_q4k(weight: torch.Tensor) -> np.ndarray:
    """[N, K] -> Q4_K blocks as a GGUF file holds them (uint8 [N, ceil(K / 256) * 144], K zero-padded):
    per sub-block of 32 the range from min(0, w) to max(w) in 15 steps, the steps and mins on 6-bit
    scales of the super-block's fp16 d and dmin (for models that do not come as Q4_K: a tiny model,
    a fp32 checkpoint)."""
    n, k = weight.shape
    sb = q4_block()
    kp = -(-k // sb) * sb
    w = np.zeros((n, kp), np.float32)
    w[:, :k] = weight.float().numpy()
    sub = w.reshape(n, kp // sb, 8, 32)
    low = np.minimum(sub.min(axis=-1), 0.0)  # [n, super-blocks, 8]
    step = (sub.max(axis=-1) - low) / 15
    d = (step.max(axis=-1) / 63).astype(np.float16)
    dmin = (-low.min(axis=-1) / 63).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[..., None] > 0, np.rint(step / d.astype(np.float32)[..., None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[..., None] > 0, np.rint(-low / dmin.astype(np.float32)[..., None]), 0).clip(0, 63)
        m = m.astype(np.uint8)
        scale = d.astype(np.float32)[..., None] * sc
        offset = dmin.astype(np.float32)[..., None] * m
        q = np.where(scale[..., None] > 0, np.rint((sub + offset[..., None]) / scale[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(n, kp // sb, 4, 2, 32)  # sub-blocks 2c, 2c + 1: bytes 32c.. of qs
    qs = (q[:, :, :, 0] | q[:, :, :, 1] << 4).reshape(n, kp // sb, 128)
    scales = np.zeros((n, kp // sb, 12), np.uint8)
    scales[..., 0:4] = sc[..., :4] | (sc[..., 4:] >> 4) << 6
    scales[..., 4:8] = m[..., :4] | (m[..., 4:] >> 4) << 6
    scales[..., 8:12] = (sc[..., 4:] & 0xF) | (m[..., 4:] & 0xF) << 4
    halves = np.stack([d, dmin], axis=-1).view(np.uint8).reshape(n, kp // sb, 4)
    return np.concatenate([halves, scales, qs], axis=-1).reshape(n, -1)


def pack_q4k(blocks: np.ndarray) -> torch.Tensor:
    """Q4_K blocks (uint8 [N, super-blocks * 144], a GGUF tensor's rows) -> the W4A8 kernel's int32 words
    [ceil(N / P), super-blocks, Q4_WORDS, P] (packed_gemm.c: nibbles 8 features a word, the scales and
    mins a byte each, d and dmin as float32)."""
    from gguf.quants import Q4_K

    n = blocks.shape[0]
    nsb = blocks.shape[1] // Q4_K_BYTES
    raw = np.ascontiguousarray(blocks).reshape(n * nsb, Q4_K_BYTES)
    d = raw[:, 0:2].view(np.float16).astype(np.float32)
    dmin = raw[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(raw[:, 4:16])
    qs = raw[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=1).transpose(0, 2, 1, 3).reshape(-1, 256)  # feature order
    nibbles = q.reshape(-1, 32, 2, 4)  # word g: features 8g + b (low nibble of byte b) and 8g + 4 + b (high)
    words = (nibbles[:, :, 0] | nibbles[:, :, 1] << 4).reshape(-1, 128).view(np.int32)
    column = np.concatenate([words, np.ascontiguousarray(sc.astype(np.uint8)).view(np.int32),
                             np.ascontiguousarray(m.astype(np.uint8)).view(np.int32), d.view(np.int32),
                             dmin.view(np.int32)], axis=1)  # [n * nsb, Q4_WORDS]
    p = panel_width()
    panels = (n + p - 1) // p
    padded = np.zeros((panels * p, nsb, Q4_WORDS), np.int32)  # padding columns: d = 0, weights 0
    padded[:n] = column.reshape(n, nsb, Q4_WORDS)
    return torch.from_numpy(padded.reshape(panels, p, nsb, Q4_WORDS).transpose(0, 2, 3, 1).copy())


def dequantize(rows: np.ndarray, qtype: int) -> np.ndarray | None:
    """A GGUF tensor's quantized rows (uint8 [rows, bytes of a row], as gguf's reader maps them) -> fp32
    [rows, values of a row], bit for bit as gguf.dequantize gives them (packed_gemm.c); None for a type
    it does not read (it reads Q4_0, Q4_1, Q8_0, Q4_K and Q6_K), or where the kernel cannot be built."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    lib = _library_if_available()
    if rows.ndim != 2 or rows.dtype != np.uint8 or lib is None:
        return None
    values, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    blocks = np.ascontiguousarray(rows)
    out = np.empty((rows.shape[0], rows.shape[1] // size * values), dtype=np.float32)
    if lib.specpipe_dequantize(qtype, blocks.ctypes.data, blocks.size // size, out.ctypes.data, cores.threads()):
        return None
    return out


@functools.lru_cache(maxsize=None)
def _library_if_available() -> ctypes.CDLL | None:
    """The library, or None where it cannot be built (asked once: a W4A8 embedding dequantizes every
    forward's rows)."""
    return library() if toolchain.unavailable() is None else None


def padded_inputs(k: int, dtype: torch.dtype) -> int:
    """K as a packed weight of dtype holds it: rounded up to q8_block() for W8A8, q4_block() for W4A8, else k."""
    block = q8_block() if dtype == torch.uint8 else q4_block() if dtype == torch.int32 else 1
    return -(-k // block) * block


def pack_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N, K] -> [ceil(N / P), K, P] in dtype (float32, bfloat16, or int8 for weights quantize_int8
    gave): column panels of P output features, zero-padded. uint8 (W8A8, from quantize_int8's int8
    weights): w + 128, four input features a column together, K padded to q8_block():
    [ceil(N / P), Kp / 4, P, 4]. int32 (W4A8): a float weight rounded to Q4_K (quantize_q4k), or a
    GGUF's Q4_K blocks (uint8 [N, bytes]) as they are: pack_q4k's words."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"packed weights are float32, bfloat16, int8, uint8 (W8A8) or int32 (W4A8), not {dtype}")
    if dtype == torch.int32:  # Q4_K blocks (a GGUF's own, or quantize_q4k's of a float weight)
        return pack_q4k(weight.numpy() if weight.dtype == torch.uint8 else quantize_q4k(weight))
    n, k = weight.shape
    p, kp = panel_width(), padded_inputs(k, dtype)
    panels = (n + p - 1) // p
    if dtype == torch.uint8:
        padded = torch.full((panels * p, kp), 128, dtype=torch.uint8)
        stored = padded[:n, :k]
        stored.copy_(weight.view(torch.uint8)).bitwise_xor_(128)  # w + 128, with no wider copy of a vocabulary
        return padded.view(panels, p, kp // 4, 4).transpose(1, 2).contiguous()
    padded = torch.zeros(panels * p, k, dtype=dtype)
    padded[:n] = weight
    return padded.view(panels, p, k).transpose(1, 2).contiguous()


def unpack_columns(packed: torch.Tensor, columns: torch.Tensor, k: int) -> torch.Tensor:
    """The packed weight's output columns (features) [len(columns), k] as stored: float, or int8 before
    its scale (pack_weight's inverse, for the embeddings read from a packed table)."""
    if packed.dtype == torch.int32:
        raise ValueError("W4A8 weights are not read back as columns: a vocabulary is packed in W8A8 (head_dtype)")
    p = packed.shape[2]
    if packed.dtype == torch.uint8:
        rows = packed[columns // p, :, columns % p].reshape(len(columns), -1)[:, :k]
        return (rows.to(torch.int16) - 128).to(torch.int8)
    return packed[columns // p, :, columns % p]


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (int8 [N, K], float32 scales [N]): each output feature's row symmetric, its largest
    |w| at 127 (an all-zero or empty row: scale 1)."""
    weight = weight.float()
    scale = weight.abs().amax(dim=1) / 127 if weight.shape[1] else torch.zeros(weight.shape[0])
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale.contiguous()


def _kernel(packed: torch.Tensor, scale: torch.Tensor | None) -> Kernel:
    """The kernel function for these packed weights (int8 ones with their scales)."""
    if (scale is None) != (packed.dtype not in QUANTIZED):
        raise ValueError("int8 (and W8A8) packed weights take their scales, and only they")
    return getattr(library(), f"specpipe_packed_linear_{WEIGHT_DTYPES[packed.dtype]}")


def packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                  scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 -> (x @ W^T) * scale + bias, [M, out_features]; W as pack_weight gave it
    (scale: int8 weights' per-feature scales, else None)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"packed linear layers take float32 CPU inputs, got {x.dtype} on {x.device}")
    return _run(_kernel(packed, scale), packed, out_features, bias, scale, x)


def bound_linear(packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None) -> BoundLinear:
    """packed_linear over one weight as a function of x (float32, on the CPU), its kernel looked up
    once: what a forward that calls a layer every token binds once (specpipe.engine.batched)."""
    return functools.partial(_run, _kernel(packed, scale), packed, out_features, bias, scale)


def _run(kernel: Kernel, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None, scale: torch.Tensor | None,
         x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    m, k = x.shape
    held = packed.shape[1] * {torch.uint8: 4, torch.int32: q4_block()}.get(packed.dtype, 1)
    if padded_inputs(k, packed.dtype) != held:
        raise ValueError(f"input has {k} features, the layer takes {held}")
    y = torch.empty(m, out_features, dtype=torch.float32)
    if kernel(x.data_ptr(), m, k, packed.data_ptr(), out_features, None if scale is None else scale.data_ptr(),
              None if bias is None else bias.data_ptr(), y.data_ptr(), cores.threads()):
        raise MemoryError(f"packed linear layer: no memory for the accumulators of {m} rows")
    return y


def row_exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Attention of q [heads, n, head_dim] over keys and values [kv_heads, L, head_dim] (a slot's
    view: positions may be strided, the features contiguous), row i seeing the positions where
    visible [n, L] is true; [n, heads * head_dim]. Each row over exactly its visible keys in slot order,
    in one fixed order of operations: its bits do not depend on the rows or keys beside it
    (packed_gemm.c), which a W8A8 model needs to decode a token alone and in a draft alike."""
    heads, n, head_dim = q.shape
    kv_heads, length, _ = keys.shape
    if keys.stride() != values.stride() or keys.stride(2) != 1 or q.dtype != torch.float32:
        raise ValueError("row-exact attention takes float32 keys and values of one layout, features contiguous")
    q = q.contiguous()
    sees = visible.to(torch.uint8).contiguous()
    out = torch.empty(n, heads * head_dim, dtype=torch.float32)
    if library().specpipe_row_exact_attention(q.data_ptr(), heads, n, head_dim, keys.data_ptr(), values.data_ptr(),
                                              kv_heads, length, keys.stride(0), keys.stride(1), sees.data_ptr(),
                                              scale, out.data_ptr(), cores.threads()):
        raise MemoryError("row-exact attention: no memory for a row's scores")
    return out


ROUNDS_ACTIVATIONS = (torch.uint8, torch.int32)  # W8A8, W4A8


def row_exact(model: nn.Module) -> bool:
    """Whether model's forward must attend row by row (row_exact_attention): its linear layers round
    their activations (W8A8, W4A8), which would turn attention's last-bit differences into other tokens."""
    return any(type(m) is PackedLinear and m.packed.dtype in ROUNDS_ACTIVATIONS for m in model.modules())


class PackedLinear(nn.Module):
    """An inference-only nn.Linear over a packed weight (the original weight is not kept)."""

    in_features: int
    out_features: int
    packed: torch.Tensor  # buffers, typed here (nn.Module's attribute lookup is untyped)
    bias: torch.Tensor | None
    scale: torch.Tensor | None

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        with torch.no_grad():
            self._pack(linear.weight.detach(), None if linear.bias is None else linear.bias.detach(), dtype, None)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
           scale: torch.Tensor | None = None) -> PackedLinear:
        """A PackedLinear over weight [N, K] and bias [N] with no nn.Linear first (a model read from
        GGUF); int8 weights quantize_int8 gave come with their scales."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._pack(weight, bias, dtype, scale)
        return layer

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
              scale: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        if dtype == torch.int32 and weight.dtype == torch.uint8:  # a GGUF's Q4_K blocks
            self.in_features = weight.shape[1] // Q4_K_BYTES * q4_block()
        if dtype in QUANTIZED and scale is None:
            weight, scale = quantize_int8(weight)
        self.register_buffer("packed", pack_weight(weight, dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = packed_linear(x.reshape(-1, self.in_features), self.packed, self.out_features, self.bias, self.scale)
        return y.view(*x.shape[:-1], self.out_features)

    def bound(self) -> BoundLinear:
        """This layer as bound_linear: x [M, in_features] -> [M, out_features]."""
        return bound_linear(self.packed, self.out_features, self.bias, self.scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weights={self.packed.dtype}")


class PackedEmbedding(nn.Module):
    """An input embedding read from a packed weight: token v's embedding is the packed weight's column v
    (times its scale in int8). A tied model's reads its packed lm_head, so the model keeps one copy of
    the vocabulary's weights, in the packed dtype, rather than an fp32 one beside it (fp32: the
    embedding's own values; bf16, int8: the lm_head's rounded ones); an untied model packed in bf16 or
    int8 packs its embedding alike (a quarter of the fp32 table in int8), its rows rounded the same way."""

    num_embeddings: int
    embedding_dim: int
    packed: torch.Tensor  # buffers, typed here (nn.Module's attribute lookup is untyped)
    scale: torch.Tensor | None

    def __init__(self, head: PackedLinear) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.register_buffer("packed", head.packed)  # the head's tensor, not a copy
        self.register_buffer("scale", head.scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = unpack_columns(self.packed, flat, self.embedding_dim).float()  # [tokens, embedding_dim]
        if self.scale is not None:
            rows = rows * self.scale[flat, None]
        return rows.view(*ids.shape, self.embedding_dim)


class PackedGroup:
    """Packed linear layers of one input side by side in one weight (a layer's q/k/v projections, an
    MLP's gate and up), run as one GEMM: one kernel call and one pass over the input instead of one
    each. Each layer's own packed weight becomes a view into the group's, so the model's own forward
    still runs them one by one, on the same memory. Every output column is the same FMA chain as
    in its own layer: the group's outputs are the layers' bits."""

    def __init__(self, linears: Sequence[PackedLinear]) -> None:
        self.out_features = [linear.out_features for linear in linears]
        padded = [linear.packed.shape[0] * panel_width() for linear in linears]  # panels pad to P
        self.starts = [sum(padded[:i]) for i in range(len(linears))]  # each layer's first output column
        self.width = sum(padded)
        self.packed = torch.cat([linear.packed for linear in linears])
        self.bias = self._columns(linears, "bias")
        self.scale = self._columns(linears, "scale")
        panel = 0
        for linear in linears:  # the layers' weights: views into the group's (their biases stay their own)
            panels = linear.packed.shape[0]
            linear.packed = self.packed[panel : panel + panels]
            panel += panels

    def _columns(self, linears: Sequence[PackedLinear], name: str) -> torch.Tensor | None:
        """The layers' per-feature vectors (bias, scale) side by side at their columns, zero between."""
        if getattr(linears[0], name) is None:
            return None
        side_by_side = torch.zeros(self.width)
        for linear, start in zip(linears, self.starts):
            side_by_side[start : start + linear.out_features] = getattr(linear, name)
        return side_by_side

    @property
    def columns(self) -> tuple[tuple[int, int], ...]:
        """Each layer's (first column, out_features) in the group's output."""
        return tuple(zip(self.starts, self.out_features))

    def bound(self) -> BoundLinear:
        """The group as bound_linear: x [M, K] -> [M, width], the layers' outputs side by side."""
        return bound_linear(self.packed, self.width, self.bias, self.scale)


def groupable(linears: Sequence[object]) -> TypeGuard[Sequence[PackedLinear]]:
    """Whether linears can run as one PackedGroup: packed, one input size and weight dtype, and all
    with a bias or none."""
    packed = [linear for linear in linears if type(linear) is PackedLinear]
    return (len(packed) == len(linears)
            and len({(linear.in_features, linear.packed.dtype, linear.bias is None) for linear in packed}) == 1)


GROUPS = {
    "self_attn": ("packed_qkv", ("q_proj", "k_proj", "v_proj")),
    "mlp": ("packed_gate_up", ("gate_proj", "up_proj")),
}


def group_projections(model: nn.Module) -> int:
    """Give every decoder layer of a Llama-style model its PackedGroups (attribute packed_qkv of its
    self_attn, packed_gate_up of its mlp), where its linear layers are packed alike; returns how
    many groups were made. specpipe.engine.batched runs them; other forwards see no change."""
    made = 0
    for module in model.modules():
        for child_name, (attribute, names) in GROUPS.items():
            child = getattr(module, child_name, None)
            linears = [getattr(child, name, None) for name in names]
            if isinstance(child, nn.Module) and not hasattr(child, attribute) and groupable(linears):
                setattr(child, attribute, PackedGroup(linears))
                made += 1
    return made


# packed weights that round: an untied embedding is packed in them too
NARROW = (torch.bfloat16, torch.int8, torch.uint8, torch.int32)


def head_dtype(dtype: torch.dtype) -> torch.dtype:
    """How the vocabulary's weights (the lm_head, an untied input embedding) are packed where the layers
    are packed in dtype: as they are, but W4A8's in W8A8 (as a Q4_K_M file keeps its output in Q6_K),
    whose columns PackedEmbedding reads."""
    return torch.uint8 if dtype == torch.int32 else dtype


def _embeddings(model: nn.Module) -> tuple[Any, Any]:
    """A transformers model's (input embedding, lm_head); None where model has none."""
    none = lambda: None  # noqa: E731
    return getattr(model, "get_input_embeddings", none)(), getattr(model, "get_output_embeddings", none)()


def _tied_embedding(model: nn.Module) -> bool:
    """Whether model's lm_head shares its weight with the input embedding (tie_word_embeddings)."""
    inputs, outputs = _embeddings(model)
    return (type(inputs) is nn.Embedding and type(outputs) is nn.Linear
            and outputs.weight.untyped_storage().data_ptr() == inputs.weight.untyped_storage().data_ptr())


def pack_linears(model: nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Replace every fp32 CPU nn.Linear in model by a PackedLinear with weights in dtype, one at a
    time (so peak memory grows by one layer), and group the projections that share an input
    (group_projections); returns how many linear layers were replaced. A tied model's input
    embedding then reads the packed lm_head, an untied one packed in bf16 or int8 its own packed
    table (PackedEmbedding), and the fp32 weight is freed."""
    library()  # build (or find) the kernel first: a missing compiler fails before anything changes
    already = {m.packed.dtype for m in model.modules() if type(m) is PackedLinear} - {dtype, head_dtype(dtype)}
    if already:  # a model read from GGUF comes packed
        raise ValueError(f"the model's linear layers are packed in {sorted(map(str, already))} already, not {dtype}")
    tied = _tied_embedding(model)
    replaced = 0
    _, head = _embeddings(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child, head_dtype(dtype) if child is head else dtype))
                replaced += 1
    inputs, head = _embeddings(model)
    if tied and type(head) is PackedLinear:
        getattr(model, "set_input_embeddings")(PackedEmbedding(head))
    elif type(inputs) is nn.Embedding and dtype in NARROW:
        packed = PackedLinear.of(inputs.weight.detach(), None, head_dtype(dtype))
        getattr(model, "set_input_embeddings")(PackedEmbedding(packed))
    group_projections(model)
    return replaced

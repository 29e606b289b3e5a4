"""A model read straight from its GGUF file, one tensor at a time, its linear layers packed as they are
read (specpipe.engine.native): no fp32 copy of the model is ever whole in memory, and no converted
copy is written to disk.

Each GGUF tensor is dequantized (in chunks of rows; Q4_0, Q4_1, Q8_0, Q4_K and Q6_K by the native
library, other types by gguf.dequantize) to the fp32 values that transformers' own GGUF loading
gives, then packed in the weights asked for: fp32 as they are, bf16 rounded, int8 requantized per
output feature (native.quantize_int8, row by row, so chunking changes nothing). Norms and biases
stay fp32. A tied model's input embedding reads the packed lm_head, an untied one in bf16 or int8
its own packed table (native.PackedEmbedding, as native.pack_linears does). Tensor names come from
gguf's own name map and the Llama q/k row order from transformers' tensor processor, so the model is
the one `from_pretrained` builds from the same file (tests/test_gguf_load.py: the same logits, bit for bit).

Parsing a GGUF's metadata (the vocabulary, the merges) takes gguf's reader seconds to tens of seconds,
so the file is parsed once, when it is prepared: specpipe.models.packaged.tensor_table() records where
each tensor lies, and a load maps the file and reads the tensors from there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from specpipe.engine import native
from specpipe.models.packaged import TABLE

CHUNK_ROWS = 4096  # rows dequantized at once: the fp32 transient of the largest tensor (the vocabulary)


class Tensor(NamedTuple):
    name: str
    tensor_type: int  # a gguf.GGMLQuantizationType
    data: np.ndarray  # as gguf's reader gives it: [rows, bytes of a row] for quantized types


def _tensors(gguf: Path, table: dict) -> Iterator[Tensor]:
    for entry in table["tensors"]:
        data = np.memmap(gguf, dtype=np.dtype(entry["dtype"]), mode="r", offset=entry["offset"],
                         shape=tuple(entry["shape"]))
        yield Tensor(entry["name"], entry["type"], data)


def _dequantized(rows: np.ndarray, tensor_type: int) -> np.ndarray:
    """GGUF rows (or a vector) of a tensor type as fp32: the native library's for the types it reads (the
    same values, tens of times sooner than numpy's), gguf's for the others."""
    from gguf import GGMLQuantizationType, dequantize

    fast = native.dequantize(rows, tensor_type)
    return fast if fast is not None else np.asarray(dequantize(rows, GGMLQuantizationType(tensor_type)), np.float32)


def _row_chunks(tensor: Tensor) -> Iterator[np.ndarray]:
    """A GGUF tensor's rows as fp32, CHUNK_ROWS at a time ([rows, cols] each; a vector: one chunk)."""
    data = tensor.data
    if data.ndim < 2:
        yield _dequantized(data, tensor.tensor_type)
        return
    for start in range(0, data.shape[0], CHUNK_ROWS):
        yield _dequantized(data[start : start + CHUNK_ROWS], tensor.tensor_type)
        _give_back_free_memory()  # the chunk's transients, before the next chunk's (a vocabulary has 38)


def _linear_weight(tensor: Tensor, dtype: torch.dtype, reorder: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's weight [N, K] from its GGUF tensor: (int8 and its scales [N] for the int8 and W8A8
    packings, or fp32 and None).
    reorder: the tensor processor's row permutation (Llama's q and k), applied after the per-row
    quantization, which it commutes with."""
    if dtype not in native.QUANTIZED:
        weight = np.concatenate(list(_row_chunks(tensor)))
        return torch.from_numpy(np.ascontiguousarray(reorder(weight))), None
    quantized, scales = zip(*(native.quantize_int8(torch.from_numpy(chunk)) for chunk in _row_chunks(tensor)))
    weight, scale = torch.cat(quantized).numpy(), torch.cat(scales).numpy()[:, None]
    return (torch.from_numpy(np.ascontiguousarray(reorder(weight))),
            torch.from_numpy(np.ascontiguousarray(reorder(scale))[:, 0]))


def _packed_linear(tensor: Tensor, dtype: torch.dtype, reorder: Any, bias: Any) -> native.PackedLinear:
    """A linear layer from its GGUF tensor, packed in dtype. W4A8 (int32) multiplies a Q4_K tensor's own
    blocks (their rows in the model's order) and a tensor of other 4-bit blocks (Q4_0, Q4_1) rounded to
    Q4_K; a wider tensor (a Q4_K_M file's Q6_K layers, Q8_0) is packed in W8A8, so that no layer is
    rounded coarser than the file holds it."""
    from gguf import GGMLQuantizationType as Type

    if dtype == torch.int32 and tensor.tensor_type == Type.Q4_K:
        blocks = np.array(reorder(np.asarray(tensor.data)), order="C")  # a copy: the file's map is read-only
        return native.PackedLinear.of(torch.from_numpy(blocks), bias, dtype)
    if dtype == torch.int32 and tensor.tensor_type not in (Type.Q4_0, Type.Q4_1):
        dtype = torch.uint8
    weight, scale = _linear_weight(tensor, dtype, reorder)
    return native.PackedLinear.of(weight, bias, dtype, scale)


class GGUFEmbedding(nn.Module):
    """An input embedding that keeps its GGUF tensor's own blocks and dequantizes the rows it looks up, as
    gguf dequantizes them: a W4A8 model's untied embedding, in the file's bytes (a Q4_K vocabulary in
    0.56 bytes a value, not an int8 table beside it) and with the file's exact values."""

    blocks: torch.Tensor  # a buffer, typed here (nn.Module's attribute lookup is untyped)

    def __init__(self, tensor: Tensor) -> None:
        super().__init__()
        self.tensor_type = tensor.tensor_type
        self.register_buffer("blocks", torch.from_numpy(np.array(tensor.data, order="C")))  # the map is read-only
        self.num_embeddings = self.blocks.shape[0]
        self.embedding_dim = _dequantized(self.blocks[:1].numpy(), self.tensor_type).shape[1]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = _dequantized(self.blocks[ids.reshape(-1)].numpy(), self.tensor_type)
        return torch.from_numpy(rows).view(*ids.shape, self.embedding_dim)


def _hf_names(model: PreTrainedModel, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name (the model's only: layers past num_layers drop)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(key for key, value in MODEL_ARCH_NAMES.items() if value == architecture)
    name_map = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names: dict[str, str] = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is not None:
            names.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return names


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _give_back_free_memory() -> None:
    """Return the pages of a tensor's (or a chunk's) transients to the system. A layer's dequantized rows
    and their temporaries are tens of MB, which glibc serves from its heap, between the packed layers
    that stay: without this, resident memory after a load is about twice what the model holds, and a
    vocabulary's chunks pile up to 1.7 GB while it is read."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attribute = name.rpartition(".")
    module = model.get_submodule(module_name)
    if isinstance(module, native.PackedLinear):  # its bias, read after its weight: a buffer of the layer
        setattr(module, attribute, value)
    else:
        module._parameters[attribute] = nn.Parameter(value, requires_grad=False)


def load_gguf_model(gguf: Path, folder: Path, weights: str | None, num_layers: int | None = None) -> PreTrainedModel:
    """The model of folder's config.json and generation_config.json with the GGUF file's weights (its
    tensor table beside it, TABLE), its linear layers packed in weights (fp32, bf16 or int8:
    specpipe.engine.runner.PACKED_WEIGHTS), or None: fp32 nn.Linear layers (eager); num_layers keeps
    the first layers only (a drafter made of the verifier's first layers)."""
    from specpipe.engine.runner import PACKED_WEIGHTS

    dtype = PACKED_WEIGHTS[weights] if weights is not None else None
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:num_layers]
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _read(model, gguf, dtype)
    if dtype is None:
        if config.tie_word_embeddings:
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
    else:
        if config.tie_word_embeddings:
            model.set_input_embeddings(native.PackedEmbedding(model.get_output_embeddings()))
        native.group_projections(model)  # the layers' packed weights, copied side by side, are freed
        _give_back_free_memory()
    _rebuild_buffers(model, config)
    model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model.eval()


def _read(model: PreTrainedModel, gguf: Path, dtype: torch.dtype | None) -> None:
    """Read the GGUF's tensors into model (on the meta device): each parameter set in fp32, except, where
    dtype is given, the linear layers, each replaced by a PackedLinear as its weight is read (so no more
    than one layer's unpacked weight is ever in memory)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    table = json.loads((gguf.parent / TABLE).read_text())
    processor = TENSOR_PROCESSORS.get(table["architecture"], TensorProcessor)(config=model.config.to_dict())
    names = _hf_names(model, table["architecture"])
    linears = {name for name, module in model.named_modules() if type(module) is nn.Linear}
    head = next(name for name, module in model.named_modules() if module is model.get_output_embeddings())
    embedding = next(name for name, module in model.named_modules() if module is model.get_input_embeddings())
    # packed, a tied model's vocabulary is read once, as the lm_head
    tied = {"token_embd.weight": head} if model.config.tie_word_embeddings and dtype is not None else {}
    for tensor in _tensors(gguf, table):
        name = names.get(tensor.name)
        if name is None:  # a layer past num_layers
            continue
        module_name = tied.get(tensor.name, name.rpartition(".")[0])
        reorder = lambda rows, n=tensor.name: processor.process(weights=rows, name=n).weights  # noqa: E731
        if dtype is not None and module_name in linears and name.endswith(".weight"):
            bias: Any = model.get_submodule(module_name).bias  # on the meta device until its tensor is read
            packed = native.head_dtype(dtype) if module_name == head else dtype
            model.set_submodule(module_name, _packed_linear(tensor, packed, reorder, bias))
        elif dtype == torch.int32 and module_name == embedding:
            model.set_submodule(module_name, GGUFEmbedding(tensor))
        elif dtype in native.NARROW and module_name == embedding:  # as native.pack_linears packs it
            weight, scale = _linear_weight(tensor, native.head_dtype(dtype), reorder)
            model.set_submodule(module_name, native.PackedEmbedding(
                native.PackedLinear.of(weight, None, native.head_dtype(dtype), scale)))
        else:
            values = reorder(np.concatenate(list(_row_chunks(tensor))))
            _set_parameter(model, name, torch.from_numpy(np.ascontiguousarray(values)))
        _give_back_free_memory()


def _rebuild_buffers(model: PreTrainedModel, config: Any) -> None:
    """Buffers computed at construction (RoPE's inverse frequencies) were computed on the meta device:
    construct their modules again on the CPU. Then nothing may be left on the meta device."""
    for name, module in list(model.named_modules()):
        if "rotary" in name and any(buffer.is_meta for buffer in module.buffers(recurse=False)):
            model.set_submodule(name, type(module)(config=config))
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the GGUF file leaves {left[:5]} unset")

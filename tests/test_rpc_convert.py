"""Round trips between the value types and the wire messages (specpipe.serving.convert)."""

from __future__ import annotations

import struct

import pytest

from specpipe.core.errors import InvalidArgument
from specpipe.core.types import (
    EMPTY_DRAFT,
    GREEDY,
    Draft,
    GenerationChunk,
    ModelInfo,
    RoundStats,
    SamplingParams,
    SparseDist,
    SpeculationOptions,
    VerifyResult,
)
from specpipe.serving import convert
from specpipe.v1 import common_pb2, generation_pb2


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def wire(msg):
    """Serialize and parse, as the network does."""
    return type(msg).FromString(msg.SerializeToString())


@pytest.mark.parametrize("params", [
    GREEDY,
    SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=2**64 - 1),
    SamplingParams(temperature=1.3, top_p=1.0, top_k=0, seed=7),
    SamplingParams(temperature=1e-3, top_p=0.95, seed=1),
    SamplingParams(temperature=-1.0, top_p=1.5),  # invalid values pass through: the implementations reject them
])
def test_sampling_round_trip(params):
    assert convert.sampling_from_proto(wire(convert.sampling_to_proto(params))) == params


def test_sampling_wire_defaults():
    assert convert.sampling_from_proto(common_pb2.SamplingParams()) == GREEDY  # unset = greedy, top_p 0 = 1
    assert convert.sampling_from_proto(common_pb2.SamplingParams(temperature=0.5)).top_p == 1.0


@pytest.mark.parametrize("value", [0.7, 0.1, 0.9, 1.0, 0.95, 1e-3, 123.456, f32(0.7), 3.4e38])
def test_f32_decimal_recovers_the_shortest_decimal(value):
    recovered = convert.f32_decimal(f32(value))
    assert f32(recovered) == f32(value)
    assert len(repr(recovered)) <= len(repr(value))


SPARSE_Q = (
    SparseDist((5, 9, 2), (f32(0.5), f32(0.3), f32(0.2))),
    SparseDist((7,), (1.0,)),
    SparseDist((1, 2), (f32(0.6), f32(0.4))),
)


@pytest.mark.parametrize("draft", [
    EMPTY_DRAFT,
    Draft.chain([11, 12, 13]),
    Draft.chain([5, 7, 1], q=SPARSE_Q),                     # sampled chain with sparse q
    Draft((1, 2, 3, 4, 5), (-1, -1, 0, 0, 2)),               # tree, two first-level branches
    Draft((1, 2, 3), (-1, 5, 0)),                            # malformed parents survive the wire (verifier rejects)
])
def test_draft_round_trip(draft):
    assert convert.draft_from_proto(wire(convert.draft_to_proto(draft))) == draft


def test_deterministic_draft_has_no_q_on_the_wire():
    msg = convert.draft_to_proto(Draft.chain([1, 2]))
    assert len(msg.q) == 0
    assert convert.draft_from_proto(msg).q is None


def test_sparse_q_probs_stay_exact_float32():
    dist = SparseDist((3,), (f32(0.123456789),))
    back = convert.sparse_from_proto(wire(convert.sparse_to_proto(dist)))
    assert back.probs == dist.probs and back.prob(3) == dist.prob(3)


def test_verify_result_round_trip():
    result = VerifyResult(
        accepted_tokens=(4, 8), accepted_nodes=(0, 2), correction_token=99, entropy=f32(1.25),
        node_argmax=(4, 5, 8, 99, 1), verify_ms=12.5, context_len=42, batch_sessions=3, batch_tokens=17,
    )
    assert convert.verify_result_from_proto(wire(convert.verify_result_to_proto(result))) == result


def test_model_info_round_trip():
    info = ModelInfo("tiny", 257, (256, 0), 2048, "a0df08aa9220f9c4")
    assert convert.model_info_from_proto(wire(convert.model_info_to_proto(info))) == info
    captured = ModelInfo("tiny", 257, (256,), 2048, "a0df08aa9220f9c4", max_step_tokens=16)
    assert convert.model_info_from_proto(wire(convert.model_info_to_proto(captured))) == captured


@pytest.mark.parametrize("chunk", [
    GenerationChunk("r1", (1, 2), "ab", "", RoundStats(drafted=4, accepted=1, draft_ms=3.5, verify_ms=7.25)),
    GenerationChunk("r1", (256,), "", "eos", RoundStats(0, 0, 0.0, 1.0)),
    GenerationChunk("r1", (), "x", "stop", None),
    GenerationChunk("r1", (3,), "c", "length", RoundStats(2, 2, 1.0, 2.0)),
])
def test_chunk_round_trip(chunk):
    assert convert.chunk_from_proto(wire(convert.chunk_to_proto(chunk))) == chunk


def test_finish_reasons_map_to_the_enum():
    assert convert.FINISH_TO_PROTO == {
        "": generation_pb2.FINISH_REASON_UNSPECIFIED,
        "eos": generation_pb2.FINISH_REASON_EOS,
        "stop": generation_pb2.FINISH_REASON_STOP,
        "length": generation_pb2.FINISH_REASON_LENGTH,
    }
    with pytest.raises(ValueError):
        convert.chunk_to_proto(GenerationChunk("r", (), "", "tired"))


DEFAULTS = SpeculationOptions(drafter="model", draft_len=5, width=2, adaptive="off")


@pytest.mark.parametrize("source", [
    convert.GenerateInput(prompt="def f():"),
    convert.GenerateInput(messages=(("system", "be brief"), ("user", "hi"))),
    convert.GenerateInput(token_ids=(1, 2, 3)),
])
def test_generate_request_round_trip(source):
    sampling = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=3)
    speculation = SpeculationOptions(drafter="none", draft_len=3, width=1)
    msg = wire(convert.generate_request_to_proto(source, 17, "req-1", ("\n\n",), sampling, speculation))
    back, request = convert.generate_request_from_proto(msg, DEFAULTS)
    assert back == source
    assert back.encode_kwargs() == {source.kind: getattr(source, source.kind)}
    assert (request.max_new_tokens, request.request_id, request.stop) == (17, "req-1", ("\n\n",))
    assert request.sampling == sampling and request.speculation == speculation
    assert convert.with_prompt_ids(request, [9, 9]).prompt_ids == (9, 9)


def test_generate_request_zeros_take_the_server_defaults():
    msg = wire(convert.generate_request_to_proto(convert.GenerateInput(prompt="x"), 8))  # speculation unset
    _, request = convert.generate_request_from_proto(msg, DEFAULTS)
    assert request.speculation == DEFAULTS
    assert request.sampling == GREEDY and request.request_id == "" and request.stop == ()
    partial = generation_pb2.GenerateRequest(
        prompt="x", speculation=generation_pb2.SpeculationOptions(draft_len=2, adaptive="off")
    )
    assert convert.generate_request_from_proto(partial, DEFAULTS)[1].speculation == SpeculationOptions(
        "model", 2, 2, adaptive="off"
    )


def test_generate_request_without_input_is_invalid():
    with pytest.raises(InvalidArgument, match="no input"):
        convert.generate_request_from_proto(generation_pb2.GenerateRequest(max_new_tokens=4), DEFAULTS)


@pytest.mark.parametrize("source", [
    convert.GenerateInput(prompt=""), convert.GenerateInput(messages=()), convert.GenerateInput(token_ids=()),
])
def test_empty_inputs_keep_their_kind(source):
    """An empty prompt / list is still a set oneof, so the server can say "empty" rather than "no input"."""
    msg = wire(convert.generate_request_to_proto(source, 4))
    assert convert.generate_request_from_proto(msg, DEFAULTS)[0] == source

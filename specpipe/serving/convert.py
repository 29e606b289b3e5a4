"""Pure conversions between the wire messages (specpipe.v1) and the value types (specpipe.core.types).

Wire conventions (protos/specpipe/v1): proto3 has no "unset" for scalars, so zeros and empty
strings mean "the default": top_p 0 means 1 (off), an unset SamplingParams is greedy, and zero
SpeculationOptions fields take the server's defaults. Validation is not done here; the in-process
implementations validate, so embedded and distributed callers get the same errors.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, fields, replace
from typing import Sequence, cast

from specpipe.core import types
from specpipe.core.errors import InvalidArgument
from specpipe.v1 import common_pb2, drafter_pb2, generation_pb2, verifier_pb2

FINISH_TO_PROTO = {
    "": generation_pb2.FINISH_REASON_UNSPECIFIED,
    "eos": generation_pb2.FINISH_REASON_EOS,
    "stop": generation_pb2.FINISH_REASON_STOP,
    "length": generation_pb2.FINISH_REASON_LENGTH,
}
FINISH_FROM_PROTO = {v: k for k, v in FINISH_TO_PROTO.items()}


def f32_decimal(value: float) -> float:
    """The shortest decimal that a float32 wire value came from, e.g. 0.699999988 -> 0.7, so a
    temperature typed by a user means the same on both sides of the wire."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value  # nan / inf


# --- common.proto ------------------------------------------------------------------------------

def sampling_to_proto(params: types.SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=params.seed
    )


def sampling_from_proto(msg: common_pb2.SamplingParams) -> types.SamplingParams:
    top_p = f32_decimal(msg.top_p)
    return types.SamplingParams(
        temperature=f32_decimal(msg.temperature),
        top_p=1.0 if top_p == 0.0 else top_p,
        top_k=msg.top_k,
        seed=msg.seed,
    )


def sparse_to_proto(dist: types.SparseDist) -> common_pb2.SparseDist:
    return common_pb2.SparseDist(token_ids=dist.token_ids, probs=dist.probs)


def sparse_from_proto(msg: common_pb2.SparseDist) -> types.SparseDist:
    # probs stay the exact float32 values: the drafter's q comes from float32 tensors already.
    return types.SparseDist(tuple(msg.token_ids), tuple(msg.probs))


def draft_to_proto(draft: types.Draft) -> common_pb2.DraftTree:
    q = [sparse_to_proto(d) for d in draft.q] if draft.q is not None else []
    return common_pb2.DraftTree(tokens=draft.tokens, parents=draft.parents, q=q)


def draft_from_proto(msg: common_pb2.DraftTree) -> types.Draft:
    q = tuple(sparse_from_proto(d) for d in msg.q) if len(msg.q) else None  # empty = one-hot (deterministic)
    return types.Draft(tuple(msg.tokens), tuple(msg.parents), q)


# --- verifier.proto ----------------------------------------------------------------------------

def sources_to_proto(sources: Sequence[str]) -> list[common_pb2.DraftSource]:
    # the enum's numbers (DRAFT_SOURCES' order, after UNSPECIFIED), which protobuf takes as its values
    return [cast(common_pb2.DraftSource, types.DRAFT_SOURCES.index(source) + 1) for source in sources]


def sources_from_proto(values: Sequence[int]) -> tuple[str, ...]:
    return tuple(types.DRAFT_SOURCES[value - 1] if 1 <= value <= len(types.DRAFT_SOURCES) else "model"
                 for value in values)


def propose_request_to_proto(request: types.ProposeRequest, method: str = "") -> drafter_pb2.ProposeRequest:
    return drafter_pb2.ProposeRequest(
        session_id=request.session_id, context=request.context, draft_len=request.draft_len, width=request.width,
        sampling=sampling_to_proto(request.sampling), method=method, epoch=request.epoch, tenant=request.tenant,
        stop_confidence=request.stop_confidence,
    )


def propose_request_from_proto(msg: drafter_pb2.ProposeRequest) -> types.ProposeRequest:
    return types.ProposeRequest(msg.session_id, tuple(msg.context), msg.draft_len, msg.width,
                                sampling_from_proto(msg.sampling), msg.epoch, msg.tenant, msg.stop_confidence)


def propose_result_to_proto(result: types.ProposeResult) -> drafter_pb2.ProposeReply:
    draft = result.draft
    return drafter_pb2.ProposeReply(
        draft=draft_to_proto(draft), draft_ms=result.draft_ms, sources=sources_to_proto(draft.sources or ()),
        confidence=draft.confidence or (), runner_up=draft.runner_up or (),
        runner_up_confidence=draft.runner_up_confidence or (),
    )


def propose_result_from_proto(msg: drafter_pb2.ProposeReply) -> types.ProposeResult:
    """Empty columns on the wire are absent ones (None)."""
    def column(values, convert=tuple):
        return convert(values) if len(values) else None

    draft = replace(draft_from_proto(msg.draft), sources=column(msg.sources, sources_from_proto),
                    confidence=column(msg.confidence), runner_up=column(msg.runner_up),
                    runner_up_confidence=column(msg.runner_up_confidence))
    return types.ProposeResult(draft, msg.draft_ms)


def model_info_to_proto(info: types.ModelInfo) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model_name=info.model_name,
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_token_ids,
        max_context=info.max_context,
        vocab_fingerprint=info.vocab_fingerprint,
        methods=info.methods,
        max_step_tokens=info.max_step_tokens,
    )


def model_info_from_proto(msg: common_pb2.ModelInfo) -> types.ModelInfo:
    return types.ModelInfo(
        model_name=msg.model_name,
        vocab_size=msg.vocab_size,
        eos_token_ids=tuple(msg.eos_token_ids),
        max_context=msg.max_context,
        vocab_fingerprint=msg.vocab_fingerprint,
        methods=tuple(msg.methods),
        max_step_tokens=msg.max_step_tokens,
    )


def verify_result_to_proto(result: types.VerifyResult) -> verifier_pb2.VerifyReply:
    return verifier_pb2.VerifyReply(
        accepted_tokens=result.accepted_tokens,
        accepted_nodes=result.accepted_nodes,
        correction_token=result.correction_token,
        entropy=result.entropy,
        node_argmax=result.node_argmax,
        verify_ms=result.verify_ms,
        context_len=result.context_len,
        batch_sessions=result.batch_sessions,
        batch_tokens=result.batch_tokens,
    )


def verify_result_from_proto(msg: verifier_pb2.VerifyReply) -> types.VerifyResult:
    return types.VerifyResult(
        accepted_tokens=tuple(msg.accepted_tokens),
        accepted_nodes=tuple(msg.accepted_nodes),
        correction_token=msg.correction_token,
        entropy=msg.entropy,  # float32 on the wire
        node_argmax=tuple(msg.node_argmax),
        verify_ms=msg.verify_ms,
        context_len=msg.context_len,
        batch_sessions=max(1, msg.batch_sessions),  # 0: a verifier that does not report it
        batch_tokens=msg.batch_tokens,
    )


# --- generation.proto --------------------------------------------------------------------------

_ROUND_FIELDS = tuple(f.name for f in fields(types.RoundStats))  # every chunk carries one: no asdict() a round


def round_to_proto(stats: types.RoundStats) -> generation_pb2.RoundStats:
    return generation_pb2.RoundStats(**{name: getattr(stats, name) for name in _ROUND_FIELDS})


def round_from_proto(msg: generation_pb2.RoundStats) -> types.RoundStats:
    return types.RoundStats(**{name: getattr(msg, name) for name in _ROUND_FIELDS})


def chunk_to_proto(chunk: types.GenerationChunk) -> generation_pb2.GenerateChunk:
    if chunk.finish_reason not in FINISH_TO_PROTO:
        raise ValueError(f"unknown finish reason {chunk.finish_reason!r}")
    return generation_pb2.GenerateChunk(
        request_id=chunk.request_id,
        token_ids=chunk.token_ids,
        text=chunk.text,
        finish_reason=FINISH_TO_PROTO[chunk.finish_reason],
        round=round_to_proto(chunk.round) if chunk.round is not None else None,
        seed=chunk.seed,
    )


def chunk_from_proto(msg: generation_pb2.GenerateChunk) -> types.GenerationChunk:
    return types.GenerationChunk(
        request_id=msg.request_id,
        token_ids=tuple(msg.token_ids),
        text=msg.text,
        finish_reason=FINISH_FROM_PROTO.get(msg.finish_reason, ""),
        round=round_from_proto(msg.round) if msg.HasField("round") else None,
        seed=msg.seed,
    )


def speculation_to_proto(options: types.SpeculationOptions) -> generation_pb2.SpeculationOptions:
    return generation_pb2.SpeculationOptions(**asdict(options))


def speculation_from_proto(
    msg: generation_pb2.SpeculationOptions, defaults: types.SpeculationOptions
) -> types.SpeculationOptions:
    """Zero / empty fields take the server's defaults."""
    return types.SpeculationOptions(**{f.name: getattr(msg, f.name) or getattr(defaults, f.name)
                                       for f in fields(types.SpeculationOptions)})


@dataclass(frozen=True)
class GenerateInput:
    """The `input` oneof of a GenerateRequest; exactly one of the three is set."""

    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    token_ids: tuple[int, ...] | None = None

    @property
    def kind(self) -> str:
        return "prompt" if self.prompt is not None else "messages" if self.messages is not None else "token_ids"

    def encode_kwargs(self) -> dict:
        """Keyword arguments of Generator.encode."""
        return {self.kind: getattr(self, self.kind)}


def generate_request_to_proto(
    source: GenerateInput,
    max_new_tokens: int,
    request_id: str = "",
    stop: Sequence[str] = (),
    sampling: types.SamplingParams = types.GREEDY,
    speculation: types.SpeculationOptions | None = None,  # None = the server's defaults
) -> generation_pb2.GenerateRequest:
    msg = generation_pb2.GenerateRequest(
        request_id=request_id,
        max_new_tokens=max_new_tokens,
        stop=list(stop),
        sampling=sampling_to_proto(sampling),
        speculation=speculation_to_proto(speculation) if speculation is not None else None,
    )
    if source.prompt is not None:
        msg.prompt = source.prompt
    elif source.messages is not None:
        msg.messages.SetInParent()  # an empty list is still this input (rejected by the server as empty)
        msg.messages.messages.extend(generation_pb2.ChatMessage(role=r, content=c) for r, c in source.messages)
    elif source.token_ids is not None:
        msg.token_ids.SetInParent()
        msg.token_ids.ids.extend(source.token_ids)
    return msg


def generate_request_from_proto(
    msg: generation_pb2.GenerateRequest, defaults: types.SpeculationOptions
) -> tuple[GenerateInput, types.GenerationRequest]:
    """(the input to encode, the request with placeholder prompt_ids: replace() them after encoding)."""
    kind = msg.WhichOneof("input")
    if kind is None:
        raise InvalidArgument("GenerateRequest has no input: set one of prompt, messages or token_ids")
    if kind == "prompt":
        source = GenerateInput(prompt=msg.prompt)
    elif kind == "messages":
        source = GenerateInput(messages=tuple((m.role, m.content) for m in msg.messages.messages))
    else:
        source = GenerateInput(token_ids=tuple(msg.token_ids.ids))
    request = types.GenerationRequest(
        prompt_ids=(),
        max_new_tokens=msg.max_new_tokens,
        request_id=msg.request_id,
        stop=tuple(msg.stop),
        sampling=sampling_from_proto(msg.sampling),  # unset message = all zeros = greedy
        speculation=speculation_from_proto(msg.speculation, defaults),
    )
    return source, request


def with_prompt_ids(request: types.GenerationRequest, prompt_ids: Sequence[int]) -> types.GenerationRequest:
    return replace(request, prompt_ids=tuple(prompt_ids))

from specpipe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SpeculationOptions(_message.Message):
    __slots__ = ("drafter", "draft_len", "width", "schedule", "predictor", "hypotheses", "adaptive")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LEN_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    draft_len: int
    width: int
    schedule: str
    predictor: str
    hypotheses: int
    adaptive: str
    def __init__(self, drafter: _Optional[str] = ..., draft_len: _Optional[int] = ..., width: _Optional[int] = ..., schedule: _Optional[str] = ..., predictor: _Optional[str] = ..., hypotheses: _Optional[int] = ..., adaptive: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "messages", "token_ids", "max_new_tokens", "stop", "sampling", "speculation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    messages: ChatMessages
    token_ids: TokenIds
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: _common_pb2.SamplingParams
    speculation: SpeculationOptions
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationOptions, _Mapping]] = ...) -> None: ...

class RoundStats(_message.Message):
    __slots__ = ("drafted", "accepted", "draft_ms", "verify_ms", "hypotheses", "hit", "wasted", "hidden_ms", "idle_ms", "prefill_ms", "wait_ms", "control_ms", "call_ms", "emit_ms", "record_ms", "rest_ms")
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    HIT_FIELD_NUMBER: _ClassVar[int]
    WASTED_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_MS_FIELD_NUMBER: _ClassVar[int]
    CALL_MS_FIELD_NUMBER: _ClassVar[int]
    EMIT_MS_FIELD_NUMBER: _ClassVar[int]
    RECORD_MS_FIELD_NUMBER: _ClassVar[int]
    REST_MS_FIELD_NUMBER: _ClassVar[int]
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    hypotheses: int
    hit: bool
    wasted: int
    hidden_ms: float
    idle_ms: float
    prefill_ms: float
    wait_ms: float
    control_ms: float
    call_ms: float
    emit_ms: float
    record_ms: float
    rest_ms: float
    def __init__(self, drafted: _Optional[int] = ..., accepted: _Optional[int] = ..., draft_ms: _Optional[float] = ..., verify_ms: _Optional[float] = ..., hypotheses: _Optional[int] = ..., hit: _Optional[bool] = ..., wasted: _Optional[int] = ..., hidden_ms: _Optional[float] = ..., idle_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., wait_ms: _Optional[float] = ..., control_ms: _Optional[float] = ..., call_ms: _Optional[float] = ..., emit_ms: _Optional[float] = ..., record_ms: _Optional[float] = ..., rest_ms: _Optional[float] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "finish_reason", "round", "seed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: FinishReason
    round: RoundStats
    seed: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., round: _Optional[_Union[RoundStats, _Mapping]] = ..., seed: _Optional[int] = ...) -> None: ...

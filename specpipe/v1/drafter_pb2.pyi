from specpipe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DrafterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "context", "draft_len", "width", "sampling", "method", "epoch", "tenant", "stop_confidence")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LEN_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STOP_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    context: _containers.RepeatedScalarFieldContainer[int]
    draft_len: int
    width: int
    sampling: _common_pb2.SamplingParams
    method: str
    epoch: int
    tenant: str
    stop_confidence: float
    def __init__(self, session_id: _Optional[str] = ..., context: _Optional[_Iterable[int]] = ..., draft_len: _Optional[int] = ..., width: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., method: _Optional[str] = ..., epoch: _Optional[int] = ..., tenant: _Optional[str] = ..., stop_confidence: _Optional[float] = ...) -> None: ...

class ProposeReply(_message.Message):
    __slots__ = ("draft", "draft_ms", "sources", "confidence", "runner_up", "runner_up_confidence")
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UP_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UP_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    draft: _common_pb2.DraftTree
    draft_ms: float
    sources: _containers.RepeatedScalarFieldContainer[_common_pb2.DraftSource]
    confidence: _containers.RepeatedScalarFieldContainer[float]
    runner_up: _containers.RepeatedScalarFieldContainer[int]
    runner_up_confidence: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, draft: _Optional[_Union[_common_pb2.DraftTree, _Mapping]] = ..., draft_ms: _Optional[float] = ..., sources: _Optional[_Iterable[_Union[_common_pb2.DraftSource, str]]] = ..., confidence: _Optional[_Iterable[float]] = ..., runner_up: _Optional[_Iterable[int]] = ..., runner_up_confidence: _Optional[_Iterable[float]] = ...) -> None: ...

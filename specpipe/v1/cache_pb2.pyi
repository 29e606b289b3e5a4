from specpipe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("session_id", "context_suffix", "k", "width", "tenant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    context_suffix: _containers.RepeatedScalarFieldContainer[int]
    k: int
    width: int
    tenant: str
    def __init__(self, session_id: _Optional[str] = ..., context_suffix: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., width: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("draft", "levels", "sources", "confidence")
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    draft: _common_pb2.DraftTree
    levels: _containers.RepeatedScalarFieldContainer[int]
    sources: _containers.RepeatedScalarFieldContainer[_common_pb2.DraftSource]
    confidence: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, draft: _Optional[_Union[_common_pb2.DraftTree, _Mapping]] = ..., levels: _Optional[_Iterable[int]] = ..., sources: _Optional[_Iterable[_Union[_common_pb2.DraftSource, str]]] = ..., confidence: _Optional[_Iterable[float]] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class RecordBranchesRequest(_message.Message):
    __slots__ = ("session_id", "branches")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    def __init__(self, session_id: _Optional[str] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ...) -> None: ...

class UpdateGlobalRequest(_message.Message):
    __slots__ = ("tokens", "tenant")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    tenant: str
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., tenant: _Optional[str] = ...) -> None: ...

class UpdateReply(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    def __init__(self, recorded: _Optional[int] = ...) -> None: ...

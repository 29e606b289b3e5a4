from specpipe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifierInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("session_id", "prompt_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillReply(_message.Message):
    __slots__ = ("context_len", "prefill_ms")
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    context_len: int
    prefill_ms: float
    def __init__(self, context_len: _Optional[int] = ..., prefill_ms: _Optional[float] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "context_len", "draft", "sampling")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    context_len: int
    draft: _common_pb2.DraftTree
    sampling: _common_pb2.SamplingParams
    def __init__(self, session_id: _Optional[str] = ..., context_len: _Optional[int] = ..., draft: _Optional[_Union[_common_pb2.DraftTree, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class VerifyReply(_message.Message):
    __slots__ = ("accepted_tokens", "accepted_nodes", "correction_token", "entropy", "node_argmax", "verify_ms", "context_len", "batch_sessions", "batch_tokens")
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_NODES_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    NODE_ARGMAX_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    accepted_tokens: _containers.RepeatedScalarFieldContainer[int]
    accepted_nodes: _containers.RepeatedScalarFieldContainer[int]
    correction_token: int
    entropy: float
    node_argmax: _containers.RepeatedScalarFieldContainer[int]
    verify_ms: float
    context_len: int
    batch_sessions: int
    batch_tokens: int
    def __init__(self, accepted_tokens: _Optional[_Iterable[int]] = ..., accepted_nodes: _Optional[_Iterable[int]] = ..., correction_token: _Optional[int] = ..., entropy: _Optional[float] = ..., node_argmax: _Optional[_Iterable[int]] = ..., verify_ms: _Optional[float] = ..., context_len: _Optional[int] = ..., batch_sessions: _Optional[int] = ..., batch_tokens: _Optional[int] = ...) -> None: ...

class VerifyBatch(_message.Message):
    __slots__ = ("rounds",)
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    rounds: _containers.RepeatedCompositeFieldContainer[TaggedVerify]
    def __init__(self, rounds: _Optional[_Iterable[_Union[TaggedVerify, _Mapping]]] = ...) -> None: ...

class TaggedVerify(_message.Message):
    __slots__ = ("tag", "request")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    tag: int
    request: VerifyRequest
    def __init__(self, tag: _Optional[int] = ..., request: _Optional[_Union[VerifyRequest, _Mapping]] = ...) -> None: ...

class VerifyBatchReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[TaggedVerifyReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[TaggedVerifyReply, _Mapping]]] = ...) -> None: ...

class TaggedVerifyReply(_message.Message):
    __slots__ = ("tag", "reply", "code", "message")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    reply: VerifyReply
    code: int
    message: str
    def __init__(self, tag: _Optional[int] = ..., reply: _Optional[_Union[VerifyReply, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("open_sessions", "max_sessions", "queued")
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    open_sessions: int
    max_sessions: int
    queued: int
    def __init__(self, open_sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...

"""Fuzzing helpers: hypothesis strategies for any request message, built from its proto descriptor
(so every field of every RPC is covered, new fields included), and a way to call a servicer method
in this process the way grpc does, returning the status it ends with."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import strategies as st

INT32 = st.one_of(st.integers(-3, 40), st.sampled_from([255, 256, 257, 4096, 10_000, 1_000_000, 2**31 - 1, -2**31]),
                  st.integers(-2**31, 2**31 - 1))
UINT64 = st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1))
FLOAT = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]), st.floats(width=32))
WORDS = ["", "model", "ngram", "hybrid", "none", "sequential", "branch", "calibrated", "paper", "on", "off", "s0",
         "user", "assistant", "x" * 300]
TEXT = st.one_of(st.sampled_from(WORDS), st.text(max_size=24))
SCALARS = {
    F.TYPE_INT32: INT32, F.TYPE_INT64: INT32, F.TYPE_UINT32: st.integers(0, 2**32 - 1), F.TYPE_UINT64: UINT64,
    F.TYPE_FLOAT: FLOAT, F.TYPE_DOUBLE: FLOAT, F.TYPE_BOOL: st.booleans(), F.TYPE_STRING: TEXT,
    F.TYPE_BYTES: st.binary(max_size=16), F.TYPE_ENUM: st.integers(-1, 6),
}
BIG_LIST_SIZES = (600, 3000, 10_000)  # beyond the caps and the context window


def scalar_lists(element: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly short lists; sometimes a long one (to hit the caps)."""
    big = st.tuples(st.sampled_from(BIG_LIST_SIZES), element).map(lambda size_value: [size_value[1]] * size_value[0])
    return st.one_of(st.lists(element, max_size=12), big)


def messages(cls, depth: int = 0, overrides: dict | None = None) -> st.SearchStrategy:
    """Any message of cls: each field set or left unset, at most one member of a oneof."""
    overrides = overrides or {}
    descriptor = cls.DESCRIPTOR
    if descriptor.full_name in overrides:
        return st.one_of(overrides[descriptor.full_name], _generic(cls, depth, overrides))
    return _generic(cls, depth, overrides)


def _generic(cls, depth: int, overrides: dict) -> st.SearchStrategy:
    descriptor = cls.DESCRIPTOR
    optional = {f.name: _field(f, depth, overrides) for f in descriptor.fields if f.containing_oneof is None}
    oneofs = [st.one_of(st.just({}), *[_field(f, depth, overrides).map(lambda v, n=f.name: {n: v})
                                       for f in oneof.fields]) for oneof in descriptor.oneofs]
    fields = st.fixed_dictionaries({}, optional=optional)
    return st.tuples(fields, *oneofs).map(lambda parts: cls(**{k: v for part in parts for k, v in part.items()}))


def _field(field, depth: int, overrides: dict) -> st.SearchStrategy:
    if field.type == F.TYPE_MESSAGE:
        if depth >= 3:
            return st.just([] if _repeated(field) else field.message_type._concrete_class())
        element = messages(field.message_type._concrete_class, depth + 1, overrides)
        return st.lists(element, max_size=4) if _repeated(field) else element
    element = SCALARS[field.type]
    return scalar_lists(element) if _repeated(field) else element


def _repeated(field) -> bool:
    return field.is_repeated


class Aborted(Exception):
    pass


class Context:
    """The part of grpc.ServicerContext a servicer uses, for calling it in this process."""

    def __init__(self, metadata=()):
        self._metadata = tuple(metadata)
        self._code = None
        self.details = ""

    def abort(self, code: grpc.StatusCode, details: str):
        self._code, self.details = code, details
        raise Aborted(details)

    def code(self):
        return self._code

    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> float:
        return 60.0

    def invocation_metadata(self):
        return self._metadata


def call(method, request, metadata=(), replies: list | None = None) -> tuple[grpc.StatusCode, str]:
    """The status a servicer method ends with (a stream is read to its end, its messages kept in replies)."""
    context = Context(metadata)
    try:
        reply = method(request, context)
        if hasattr(reply, "__next__"):
            for message in reply:
                if replies is not None:
                    replies.append(message)
    except Aborted:
        return context.code(), context.details
    return grpc.StatusCode.OK, ""


ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE}


# --- HTTP bodies no schema describes -----------------------------------------------------------------

SURROGATES = st.sampled_from(["\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d\\ude00", "\\u0000", "\\u202e"])
HTTP_FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_k", "seed", "stop", "user",
               "cache_salt", "stream", "n", "logit_bias", "width", "role", "content", "\\ud800"]


def _json_text(escape: str, text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + escape + '"'


def http_bodies() -> st.SearchStrategy[bytes]:
    """Raw request bodies: JSON-like documents whose strings may hold escaped lone surrogates, nested up
    to far past any parser's limit, with NaN / huge numbers / invalid UTF-8 among them."""
    strings = st.builds(_json_text, SURROGATES, st.text(max_size=8))
    numbers = st.sampled_from(["0", "-1", "1e999", "NaN", "Infinity", "2147483648", "18446744073709551616", "0.5"])
    scalars = st.one_of(strings, numbers, st.sampled_from(['"tiny"', "true", "null", '""']))

    def nest(value: str, depth: int) -> str:
        return "[" * depth + value + "]" * depth

    def document(fields, values, depth, tail) -> bytes:
        members = ", ".join(f'"{name}": {value}' for name, value in zip(fields, values))
        return nest("{" + members + "}", depth).encode() + tail

    return st.builds(document, st.lists(st.sampled_from(HTTP_FIELDS), min_size=1, max_size=6),
                     st.lists(scalars, min_size=6, max_size=6), st.sampled_from([0, 0, 0, 1, 199, 200, 5000]),
                     st.sampled_from([b"", b"", b"\xff", b"\xed\xa0\x80", b"}"]))

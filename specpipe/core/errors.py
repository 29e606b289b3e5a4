"""Errors with a gRPC status. Raised by in-process implementations, carried over the wire by the
rpc layer and raised again by the clients, so embedded and distributed callers see the same thing."""

from __future__ import annotations


class SpecpipeError(Exception):
    code = "INTERNAL"  # name of a grpc.StatusCode

    def __init__(self, message: str = "", code: str | None = None, field: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.field = field  # the request field at fault, where known (a GenerationRequest field's dotted name)


class InvalidArgument(SpecpipeError):
    code = "INVALID_ARGUMENT"


class FailedPrecondition(SpecpipeError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(SpecpipeError):
    code = "RESOURCE_EXHAUSTED"


class Aborted(SpecpipeError):
    """A stale message (an older epoch) or a session released while in use."""

    code = "ABORTED"


class Unavailable(SpecpipeError):
    code = "UNAVAILABLE"


class DeadlineExceeded(SpecpipeError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(SpecpipeError):
    """The caller went away (it cancelled, or its deadline passed): the work done for it stopped."""

    code = "CANCELLED"


class Unauthenticated(SpecpipeError):
    """No or a wrong bearer token on the public API (specpipe.serving.security)."""

    code = "UNAUTHENTICATED"


BY_CODE = {cls.code: cls for cls in (InvalidArgument, FailedPrecondition, ResourceExhausted, Aborted, Unavailable,
                                     DeadlineExceeded, Cancelled, Unauthenticated)}


def from_code(code: str, message: str) -> SpecpipeError:
    """The exception for a status; codes without a class of their own keep their name in .code."""
    cls = BY_CODE.get(code)
    return cls(message) if cls is not None else SpecpipeError(message, code=code)

"""Distributed traces (docs/observability.md): one trace per generation, a span per round and child
spans for its hops (draft, verify, the verifier's queue and forward, the store, detokenizing), across
every service. OpenTelemetry does the work (specpipe.runtime.otel, the `otel` extra); this module is
what the rest of the code calls.

Off by default, and then at no cost: ACTIVE stays False, OpenTelemetry is never imported, and every
caller tests ACTIVE (or a generation's trace, None when untraced) before it builds anything, so no
span object is ever made. On (configure(), `--tracing on`), the context travels as a W3C traceparent:
in gRPC metadata (the gRPC instrumentation, client_interceptors / server_interceptors), inside each
round on the verifier's shared stream of rounds (TaggedVerify.traceparent), and in from an HTTP
client's `traceparent` header. A span is only ever made under a recording one: a sampled generation
(--trace-ratio, or the client's traceparent) gets the whole tree, any other call none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from specpipe.config.services import TracingConfig

TRACEPARENT = "traceparent"  # the W3C header (and gRPC metadata key) of a caller's trace context
ACTIVE = False  # tracing is on in this process (configure); False: nothing below is ever called
_otel: Any = None  # specpipe.runtime.otel once configured: OpenTelemetry itself is imported only then
NULL = contextlib.nullcontext()  # what a span scope is where nothing is traced (one object, shared)
Span = Any  # an OpenTelemetry span (opentelemetry.trace.Span)
Attributes = Mapping[str, Any]


def configure(config: TracingConfig, service: str) -> None:
    """Turn tracing on in this process as config says (off: nothing at all). service: the role whose
    spans these are (the resource's service.name is specpipe-<service> unless OTEL_SERVICE_NAME says)."""
    global ACTIVE, _otel
    if not config.enabled:
        ACTIVE = False
        return
    try:
        from specpipe.runtime import otel
    except ImportError as err:
        from specpipe.core.errors import FailedPrecondition

        raise FailedPrecondition(f"--tracing on needs OpenTelemetry: pip install 'specpipe[otel]' ({err})") from None
    otel.configure(config, service)
    _otel, ACTIVE = otel, True


def shutdown() -> None:
    """Export the spans still buffered (a process about to exit)."""
    if _otel is not None:
        _otel.shutdown()


def current() -> Span | None:
    """The calling context's span where it records (a traced request), else None."""
    return _otel.current() if ACTIVE else None


def start(name: str, parent: Any = None, attributes: Attributes | None = None, start_ns: int | None = None,
          kind: str = "internal") -> Span:
    """A span (not made current): a child of parent (a span or a context; None: the current context).
    kind: internal, server or client. End it with span.end()."""
    return _otel.start(name, parent, attributes, start_ns, kind)


def scope(parent: Any) -> contextlib.AbstractContextManager[Any]:
    """parent (a span, not ended after the body, or a context: remote()'s) current in the body; None:
    nothing changes."""
    return _otel.scope(parent) if parent is not None else NULL


def span(name: str, attributes: Attributes | None = None, kind: str = "internal"
         ) -> contextlib.AbstractContextManager[Span | None]:
    """A child of the current span for the body, current in it and ended after it; where nothing is
    traced (tracing off, or no recording span here) no span: the body gets None."""
    if not ACTIVE:
        return NULL
    parent = _otel.current()
    return _otel.child(parent, name, attributes, kind) if parent is not None else NULL


@contextlib.contextmanager
def child_of(parent: Span | None, name: str, attributes: Attributes | None = None) -> Iterator[Span | None]:
    """A child of parent (None: nothing traced) for the body, current in it and ended after it."""
    if parent is None:
        yield None
        return
    with _otel.child(parent, name, attributes, "internal") as made:
        yield made


def traceparent(span: Span | None = None) -> str:
    """The W3C traceparent of span (None: the current span), "" where nothing is traced."""
    if not ACTIVE:
        return ""
    return _otel.traceparent(span if span is not None else _otel.current())


def remote(traceparent: str) -> Any:
    """The context a W3C traceparent names (a parent for start()); None for "" or tracing off."""
    return _otel.remote(traceparent) if ACTIVE and traceparent else None


def trace_id(span: Span | None) -> str:
    """span's trace id in hex ("" for None)."""
    return _otel.trace_id(span) if span is not None else ""


def exemplar(span: Span | None) -> dict[str, str] | None:
    """A histogram observation's exemplar: the trace of span (None: no exemplar)."""
    return {"trace_id": _otel.trace_id(span)} if span is not None else None


def error_status(error: BaseException) -> Any:
    """A span status that says error failed it."""
    return _otel.error_status(error)


def log_fields() -> dict[str, str]:
    """trace_id and span_id of the current span, for a log line inside a traced request ({} elsewhere)."""
    return _otel.log_fields() if ACTIVE else {}


def traced_channel(channel: Any) -> Any:
    """A gRPC channel whose calls carry their traceparent (the gRPC instrumentation's interceptor)."""
    return _otel.traced_channel(channel) if ACTIVE else channel


def server_interceptors() -> tuple[Any, ...]:
    """What a gRPC server adds: a span per call, a child of the caller's traceparent."""
    return _otel.server_interceptors() if ACTIVE else ()

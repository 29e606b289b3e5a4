"""OpenTelemetry behind specpipe.runtime.tracing (imported only when tracing is on; the `otel` extra).

- Sampling: a root span is sampled only where a generation enters (ENTRY_SPANS), at --trace-ratio; every
  other span follows its parent (ParentBased). A health probe or a call outside a traced generation
  starts no trace of its own, and a client's traceparent (sampled or not) decides for its request.
- Exporters: those OTEL_TRACES_EXPORTER names (otlp, with OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL's grpc or
  http/protobuf, console, none; found by the entry points the exporter packages register, as the SDK's own
  auto-configuration finds them), or otlp where it is unset and --trace-file is not given; --trace-file
  adds a file of JSON lines. The OTLP exporters read their endpoint, headers and TLS from the OTEL_*
  variables themselves.
- Propagation: W3C trace context (TraceContextTextMapPropagator); gRPC calls through the gRPC
  instrumentation's interceptors, on the calls of a generation (TRACED_METHODS), never on the stream of
  rounds (each round carries its own traceparent) nor on probes.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
from opentelemetry.instrumentation.grpc import client_interceptor, server_interceptor
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode, format_span_id, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from specpipe.config.services import TracingConfig

ENTRY_SPANS = frozenset({"generation"})  # where a trace may begin: a generation (orchestrator.spans)
# Calls without a span of the instrumentation's: the stream of rounds (each round has its own), routing
# probes, and Generate, whose generation span is its server span (a child of the caller's traceparent,
# which the servicer reads from the metadata as the HTTP API reads its header).
UNTRACED_METHODS = frozenset({"VerifyStream", "Load", "Info", "Generate"})
KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
EXPORTERS_GROUP = "opentelemetry_traces_exporter"  # the entry points the SDK and exporter packages register

_propagator = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


class EntrySampler(Sampler):
    """Roots: a generation's entry at the ratio, anything else dropped (children follow their parent)."""

    def __init__(self, ratio: float):
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str, kind: SpanKind | None = None,
                      attributes: Any = None, links: Sequence[Any] | None = None, trace_state: Any = None,
                      ) -> SamplingResult:
        if name not in ENTRY_SPANS:
            return SamplingResult(Decision.DROP)
        return self._ratio.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"EntrySampler{{{self._ratio.get_description()}}}"


class JsonLinesExporter(SpanExporter):
    """Each span as one line of JSON (ReadableSpan.to_json), appended to a file: one write per batch
    with O_APPEND, so the processes of `specpipe up` can share one file."""

    def __init__(self, path: str):
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._fd is None:
            return SpanExportResult.FAILURE
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        os.write(self._fd, lines.encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def exporter_names(environ: Mapping[str, str], trace_file: str | None) -> list[str]:
    """The entry-point names of OTEL_TRACES_EXPORTER's exporters (otlp by the OTLP protocol variables);
    unset: otlp, or none besides the file where --trace-file is given."""
    given = environ.get(OTEL_TRACES_EXPORTER)
    names = [n.strip() for n in given.split(",") if n.strip()] if given else ([] if trace_file else ["otlp"])
    protocol = environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) or environ.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "grpc"
    otlp = "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"
    return [otlp if name == "otlp" else name for name in names if name != "none"]


def _exporters(config: TracingConfig) -> list[SpanExporter]:
    found = {e.name: e for e in entry_points(group=EXPORTERS_GROUP)}
    exporters: list[SpanExporter] = []
    for name in exporter_names(os.environ, config.trace_file):
        if name not in found:
            raise ValueError(f"OTEL_TRACES_EXPORTER: no trace exporter {name!r}; installed: {', '.join(sorted(found))}")
        exporters.append(found[name].load()())
    if config.trace_file:
        exporters.append(JsonLinesExporter(config.trace_file))
    return exporters


def resource(service: str) -> Resource:
    """specpipe-<service> unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name the service."""
    named = "service.name" in OTELResourceDetector().detect().attributes
    own = {} if named else {"service.name": f"specpipe-{service}"}
    return Resource.create({**own, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"})


def configure(config: TracingConfig, service: str) -> None:
    global _provider, _tracer
    shutdown()
    provider = TracerProvider(sampler=ParentBased(root=EntrySampler(config.trace_ratio)), resource=resource(service))
    for exporter in _exporters(config):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("specpipe")
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # the global one can be set once
        trace.set_tracer_provider(provider)


def shutdown() -> None:
    if _provider is not None:
        _provider.shutdown()  # flushes what the processors hold


def current() -> trace.Span | None:
    span = trace.get_current_span()
    return span if span.is_recording() else None


def _context(parent: Any) -> Context | None:
    if parent is None or isinstance(parent, Context):
        return parent
    return trace.set_span_in_context(parent)


def start(name: str, parent: Any, attributes: Mapping[str, Any] | None, start_ns: int | None,
          kind: str) -> trace.Span:
    return _tracer.start_span(name, context=_context(parent), kind=KINDS[kind], attributes=attributes,
                              start_time=start_ns)


@contextlib.contextmanager
def scope(parent: trace.Span | Context) -> Iterator[None]:
    if isinstance(parent, Context):
        token = otel_context.attach(parent)
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    with trace.use_span(parent, end_on_exit=False):
        yield


@contextlib.contextmanager
def child(parent: trace.Span, name: str, attributes: Mapping[str, Any] | None, kind: str) -> Iterator[trace.Span]:
    with _tracer.start_as_current_span(name, context=_context(parent), kind=KINDS[kind],
                                       attributes=attributes) as made:
        yield made


def traceparent(span: trace.Span | None) -> str:
    if span is None:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def remote(traceparent: str) -> Context:
    return _propagator.extract({"traceparent": traceparent})


def trace_id(span: trace.Span) -> str:
    return format_trace_id(span.get_span_context().trace_id)


def error_status(error: BaseException) -> Status:
    return Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")


def log_fields() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return {}
    return {"trace_id": format_trace_id(context.trace_id), "span_id": format_span_id(context.span_id)}


def traced_method(details: Any) -> bool:
    """A call of a generation's hops (not UNTRACED_METHODS, health or reflection)."""
    method = getattr(details, "full_method", None) or getattr(details, "method", "") or ""
    service, _, name = method.lstrip("/").partition("/")
    return service.startswith("specpipe.v1.") and name not in UNTRACED_METHODS


def traced_channel(channel: Any) -> Any:
    return intercept_channel(channel, client_interceptor(tracer_provider=_provider, filter_=traced_method))


def server_interceptors() -> tuple[Any, ...]:
    return (server_interceptor(tracer_provider=_provider, filter_=traced_method),)

"""gRPC servicer of the public Generation API: a GenerateRequest and its call's metadata and deadline
become a Call of the one request path (orchestrator/request_path.py), its chunks GenerateChunks. A
client that goes away ends the stream after the current round, and closing the generation releases
its verifier and drafter sessions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from orchestrator.admission import Admission
from orchestrator.generator import Generator
from orchestrator.request_path import Call, RequestPath
from specpipe.core.tenancy import tenant_from_metadata
from specpipe.runtime.lifecycle import client_time_left, current_cancellation
from specpipe.runtime.tracing import TRACEPARENT
from specpipe.serving import convert
from specpipe.serving.server import Service, rpc_method, service_name
from specpipe.v1 import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, generator: Generator, admission: Admission | None = None):
        self._path = RequestPath(generator, admission)

    @rpc_method
    def Generate(self, request: generation_pb2.GenerateRequest, context: Any) -> Iterator[generation_pb2.GenerateChunk]:
        call = self._accept(request, context)  # refused before any work
        for chunk in self._path.run(call, self._path.admit(call)):  # queued, or RESOURCE_EXHAUSTED
            if not context.is_active():  # client cancelled or deadline passed
                return
            yield convert.chunk_to_proto(chunk)

    def _accept(self, request: generation_pb2.GenerateRequest, context: Any) -> Call:
        source, generation = convert.generate_request_from_proto(request, self._path.generator.defaults)
        metadata: Any = getattr(context, "invocation_metadata", tuple)()  # a context without it: none
        generation = replace(generation, tenant=tenant_from_metadata(metadata))
        return self._path.accept(source, generation, client_time_left(context.time_remaining()),
                                 current_cancellation(), traceparent=traceparent_from_metadata(metadata))


def traceparent_from_metadata(metadata: Any) -> str:
    """The W3C traceparent a call's metadata carries ("" without one): a generation's trace's parent."""
    return next((value for key, value in metadata or () if key == TRACEPARENT), "")


def service(generator: Generator, admission: Admission | None = None) -> Service:
    return Service(
        service_name(generation_pb2, "Generation"),
        GenerationServicer(generator, admission),
        generation_pb2_grpc.add_GenerationServicer_to_server,
    )

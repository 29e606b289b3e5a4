"""gRPC servicer of the public Generation API: GenerateRequest -> Generator.encode + generate ->
a stream of GenerateChunk. A client that goes away ends the stream after the current round, and
closing the generation releases its verifier and drafter sessions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from orchestrator.admission import Admission
from orchestrator.generator import Generator
from specpipe.core.tenancy import tenant_from_metadata
from specpipe.core.types import GenerationChunk
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import client_time_left, deadline_scope
from specpipe.runtime.tracing import TRACEPARENT
from specpipe.serving import convert
from specpipe.serving.server import Service, rpc_method, service_name
from specpipe.v1 import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, generator: Generator, admission: Admission | None = None):
        self._generator = generator
        self._admission = admission or Admission()

    @rpc_method
    def Generate(self, request: generation_pb2.GenerateRequest, context: Any) -> Iterator[generation_pb2.GenerateChunk]:
        start = time.perf_counter()  # time to first token counts the wait for a slot
        with self._admission.slot(client_time_left(context.time_remaining())):  # refused or queued before any work
            with deadline_scope(
                client_time_left(context.time_remaining())
            ):  # internal calls end by the client's deadline
                yield from self._generate(request, context, start)

    def _generate(self, request: Any, context: Any, start: float) -> Iterator[Any]:
        source, generation = convert.generate_request_from_proto(request, self._generator.defaults)
        metadata: Any = getattr(context, "invocation_metadata", tuple)()  # Ray Serve's gRPC context has none
        generation = replace(generation, tenant=tenant_from_metadata(metadata))
        prompt_ids = self._generator.encode(**source.encode_kwargs())
        chunks = self._generator.generate(convert.with_prompt_ids(generation, prompt_ids),  # validates now
                                          traceparent_from_metadata(metadata))
        try:
            for chunk in observe_latency(chunks, start):
                if not context.is_active():  # client cancelled or deadline passed
                    return
                yield convert.chunk_to_proto(chunk)
        finally:
            chunks.close()  # type: ignore[attr-defined]  # Generator.generate is a generator, annotated Iterator


def traceparent_from_metadata(metadata: Any) -> str:
    """The W3C traceparent a call's metadata carries ("" without one): a generation's trace's parent."""
    return next((value for key, value in metadata or () if key == TRACEPARENT), "")


def observe_latency(chunks: Iterator[GenerationChunk], start: float) -> Iterator[GenerationChunk]:
    """The chunks, with the time to first token and the inter-token latency observed (both APIs), a
    traced generation's with its trace as their exemplar."""
    last = start
    for i, chunk in enumerate(chunks):
        now = time.perf_counter()
        exemplar = {"trace_id": chunk.trace_id} if chunk.trace_id else None
        if i == 0:
            metrics.TTFT_MS.observe((now - last) * 1e3, exemplar)
        else:  # a chunk of n tokens: n gaps of the round's time / n each
            for _ in chunk.token_ids:
                metrics.INTER_TOKEN_MS.observe((now - last) * 1e3 / len(chunk.token_ids), exemplar)
        last = now
        yield chunk


def service(generator: Generator, admission: Admission | None = None) -> Service:
    return Service(
        service_name(generation_pb2, "Generation"),
        GenerationServicer(generator, admission),
        generation_pb2_grpc.add_GenerationServicer_to_server,
    )

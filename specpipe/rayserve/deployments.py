"""The three Ray Serve deployments, each a thin shell over the in-process class the gRPC services
serve: the verifier (ModelVerifier), the drafter (ModelDrafter, and the n-gram and hybrid drafters
given a store) and the orchestrator (Generator behind the public GenerationServicer). Each is built
from its role's config (specpipe.config.services), by the functions `specpipe serve ROLE` uses.

The orchestrator is the application's ingress: Serve's gRPC proxy calls its Generate with the
GenerateRequest message and streams back the GenerateChunk messages it yields; Check answers the
standard grpc.health.v1 health check, so the same clients and probes work as against `specpipe up`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, NoReturn

from grpc_health.v1 import health_pb2
from ray import serve

from specpipe.config.services import DrafterConfig, OrchestratorConfig, VerifierConfig
from specpipe.core.types import Draft, ModelInfo, ProposeRequest, ProposeResult, SamplingParams, VerifyResult
from specpipe.rayserve.handles import HandleDrafter, HandleVerifier, serve_replicas
from specpipe.runtime import metrics, tracing
from specpipe.runtime.lifecycle import freeze_startup_heap
from specpipe.serving.streams import ThreadStream


@contextlib.contextmanager
def traced_call(name: str, traceparent: str) -> Iterator[None]:
    """A handle call's server span (deployment.method), a child of its caller's traceparent (nothing where
    it has none)."""
    parent = tracing.remote(traceparent)
    if parent is None:
        yield
        return
    span = tracing.start(name, parent, kind="server")
    try:
        with tracing.scope(span):
            yield
    finally:
        span.end()


def _replica_id() -> str:
    """This replica's actor name (SERVE_REPLICA::app#deployment#id)."""
    return serve.get_replica_context().replica_id.to_full_id_str()


@serve.deployment(name="Verifier")
class VerifierDeployment:
    def __init__(self, config: VerifierConfig):
        from specpipe.app.wiring import load_verifier
        from specpipe.engine.cores import set_threads

        set_threads(config.model.threads)
        tracing.configure(config.tracing, "verifier")
        self._verifier = load_verifier(config)
        freeze_startup_heap()

    def info(self) -> ModelInfo:
        return self._verifier.info()

    def prefill(self, session_id: str, prompt_ids: tuple[int, ...], traceparent: str = "") -> tuple[int, str]:
        """The context length, and this replica's id (where the session's KV now lives). traceparent:
        the caller's trace context (HandleVerifier's, where it is traced)."""
        with traced_call("Verifier.prefill", traceparent):
            return self._verifier.prefill(session_id, prompt_ids), _replica_id()

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams,
               traceparent: str = "") -> VerifyResult:
        with traced_call("Verifier.verify", traceparent):
            return self._verifier.verify(session_id, context_len, draft, sampling)

    def release(self, session_id: str) -> bool:
        return self._verifier.release(session_id)


@serve.deployment(name="Drafter")
class DrafterDeployment:
    """One or more draft methods, chosen per call like the Drafter gRPC service's."""

    def __init__(self, config: DrafterConfig):
        from drafter_service.servicer import DraftMethods
        from specpipe.app.wiring import drafter_methods
        from specpipe.engine.cores import set_threads

        set_threads(config.model.threads)
        tracing.configure(config.tracing, "drafter")
        self._methods = DraftMethods(drafter_methods(config))
        freeze_startup_heap()

    def info(self) -> ModelInfo:
        return self._methods.info()

    def propose(self, request: ProposeRequest, method: str = "", traceparent: str = "") -> ProposeResult:
        with traced_call("Drafter.propose", traceparent):
            return self._methods.drafter(method).propose(request)

    def release(self, session_id: str) -> bool:
        return self._methods.release(session_id)


class ServeContext:
    """The grpc.ServicerContext calls the Generation servicer makes, over Serve's RayServegRPCContext.
    abort() sets the status before raising: Serve's proxy then sends that status, not INTERNAL. A
    client that goes away closes the servicer's stream (ThreadStream), so the call is active until then."""

    def __init__(self, grpc_context: Any, timeout_s: float | None) -> None:
        self._context = grpc_context
        self._deadline = time.monotonic() + timeout_s if timeout_s else None

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        return True

    def code(self) -> Any:
        return self._context.code() if self._context is not None else None

    def invocation_metadata(self) -> Any:
        """The client's metadata as Serve's proxy passed it on (its tenant, its traceparent)."""
        return self._context.invocation_metadata() if self._context is not None else ()

    def abort(self, code: Any, details: str) -> NoReturn:
        if self._context is not None:
            self._context.set_code(code)
            self._context.set_details(details)
        raise RpcAborted(f"{code.name}: {details}")


class RpcAborted(Exception):
    """The RPC ended with the status set on its context."""


@serve.deployment(name="Orchestrator")
@serve.ingress()
class OrchestratorDeployment:
    async def __init__(self, verifier: Any, drafter: Any, config: OrchestratorConfig) -> None:  # type: ignore[misc]  # Serve awaits an async constructor
        from orchestrator.admission import Admission
        from orchestrator.openai_api import ApiConfig, create_app
        from orchestrator.request_path import RequestPath
        from orchestrator.servicer import GenerationServicer
        from specpipe.app.wiring import ngram_cache, served_generator
        from specpipe.engine.cores import set_threads

        set_threads(config.model.threads)
        tracing.configure(config.tracing, "orchestrator")
        metrics.TTFT_SLO_MS.set(config.ttft_slo_ms)
        self._timeout_s = config.rpc_timeout_s
        drafter_info = await drafter.info.remote()  # the model infos, once: calls block only in threads
        self._verifier = HandleVerifier(verifier, await verifier.info.remote(), self._timeout_s)
        served = {method: HandleDrafter(drafter, method, drafter_info, self._timeout_s)
                  for method in drafter_info.methods}
        generator = served_generator(config.model.specs()[0], serve_replicas(self._verifier), served,
                                     config.speculation, ngram_cache(config.cache, config.tls), config.limits,
                                     config.learn_global)
        admission = Admission(config.admission)  # one for both APIs
        self._servicer = GenerationServicer(generator, admission)
        self._app = create_app(RequestPath(generator, admission), ApiConfig(
            generator.info.model_name, None, config.limits.max_request_bytes, config.http.request_timeout_s))
        freeze_startup_heap()

    def __serve_build_asgi_app__(self) -> Any:
        """Serve's HTTP proxy: the OpenAI-compatible API (docs/http-api.md)."""
        return self._app

    async def Generate(self, request: Any, grpc_context: Any = None) -> AsyncIterator[Any]:
        """Serve's gRPC proxy: the servicer's blocking stream on a thread of its own (a client that goes
        away ends it after the current round, which releases the generation's sessions)."""
        context = ServeContext(grpc_context, self._timeout_s)
        async for chunk in ThreadStream(self._servicer.Generate(request, context), name="specpipe-generate"):
            yield chunk

    def Check(self, request: Any, grpc_context: Any = None) -> health_pb2.HealthCheckResponse:
        """grpc.health.v1 Check: this replica is constructed, so its peers answered."""
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def placements(self) -> list:
        """Where the recent verifier sessions of this replica lived (HandleVerifier.placements)."""
        return self._verifier.placements()

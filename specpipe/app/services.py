"""One service of each role, as `specpipe serve ROLE` runs it: the role's in-process object behind
its thin gRPC servicer, built from the role's config."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specpipe.app.wiring import drafter_methods, load_verifier, ngram_cache, orchestrator_generator
from specpipe.config.services import CacheConfig, DrafterConfig, OrchestratorConfig, VerifierConfig
from specpipe.serving.server import Service

if TYPE_CHECKING:
    from orchestrator.admission import Admission
    from orchestrator.generator import Generator

    Parts = tuple[Generator, Admission]  # what the gRPC and the HTTP API of one orchestrator share


def verifier_service(config: VerifierConfig) -> Service:
    from verifier_service.servicer import service

    return service(load_verifier(config))


def drafter_service(config: DrafterConfig) -> Service:
    from drafter_service.servicer import service

    return service(drafter_methods(config), config.limits)


def cache_service(config: CacheConfig) -> Service:
    from cache_service.servicer import service

    return service(ngram_cache(config.cache, config.tls), config.limits)


def orchestrator_parts(config: OrchestratorConfig) -> Parts:
    """(the Generator, its Admission): what the gRPC and the HTTP API of one orchestrator share."""
    from orchestrator.admission import Admission
    from specpipe.runtime import metrics

    metrics.TTFT_SLO_MS.set(config.ttft_slo_ms)
    return orchestrator_generator(config), Admission(config.admission)


def orchestrator_service(config: OrchestratorConfig, parts: Parts | None = None) -> Service:
    from orchestrator.servicer import service

    return service(*(parts or orchestrator_parts(config)))


def openai_app(parts: Parts, auth_token: str | None, config: OrchestratorConfig,
               draining: Callable[[], bool] = lambda: False) -> Any:
    """The OpenAI-compatible HTTP API over the same generator and admission (orchestrator.openai_api)."""
    from orchestrator.openai_api import ApiConfig, create_app
    from orchestrator.request_path import RequestPath

    generator, admission = parts
    api = ApiConfig(generator.info.model_name, auth_token, config.limits.max_request_bytes,
                    config.http.request_timeout_s)
    return create_app(RequestPath(generator, admission), api, draining)

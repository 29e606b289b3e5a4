"""One service of each role, as `specpipe serve ROLE` runs it: the role's in-process object behind
its thin gRPC servicer, built from the role's config."""

from __future__ import annotations

from specpipe.app.wiring import drafter_methods, load_verifier, ngram_cache, orchestrator_generator
from specpipe.config.services import CacheConfig, DrafterConfig, OrchestratorConfig, VerifierConfig


def verifier_service(config: VerifierConfig):
    from verifier_service.servicer import service

    return service(load_verifier(config))


def drafter_service(config: DrafterConfig):
    from drafter_service.servicer import service

    return service(drafter_methods(config), config.limits)


def cache_service(config: CacheConfig):
    from cache_service.servicer import service

    return service(ngram_cache(config.cache, config.tls), config.limits)


def orchestrator_service(config: OrchestratorConfig):
    from orchestrator.admission import Admission, AdmissionConfig
    from orchestrator.servicer import service

    return service(orchestrator_generator(config), Admission(AdmissionConfig(config.max_sessions, config.max_queue)))

"""Builds generators and drafters from CLI flags: which implementation each role gets is decided here only."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace

from specpipe.cli import security_args
from specpipe.cli.options import (
    drafter_forward, forward_mode, model_dtype, set_threads, speculation_options, verifier_options,
)
from specpipe.errors import SpecpipeError
from specpipe.limits import DEFAULT_LIMITS
from specpipe.models import load_tokenizer
from specpipe.presets import model_specs

log = logging.getLogger("specpipe.cli")


def ngram_cache(url: str, tls=None):
    """The n-gram store named by --cache: memory (this process), redis://... (shared) or grpc://...
    (tls: of the channel to a cache service)."""
    from cache_service.stores import open_store

    return open_store(url, tls=tls)


def build_drafters(kinds, store, model_drafter, info) -> dict:
    """The drafters of kinds over one n-gram store and one model drafter (either may be None when
    no kind needs it); hybrid = model + n-gram."""
    from drafter_service.hybrid import HybridDrafter
    from drafter_service.ngram_drafter import NgramDrafter

    kinds = set(kinds)
    drafters = {}
    if kinds & {"model", "hybrid"}:
        drafters["model"] = model_drafter
    if kinds & {"ngram", "hybrid"}:
        drafters["ngram"] = NgramDrafter(store, info)
    if "hybrid" in kinds:
        drafters["hybrid"] = HybridDrafter(model_drafter, drafters["ngram"])
    return drafters


def load_verifier(args: argparse.Namespace):
    """The ModelVerifier of the model flags, with the admission and batching flags."""
    from verifier_service.verifier import ModelVerifier

    spec = model_specs(args.preset, args.verifier, args.draft_model)[0]
    return ModelVerifier.load(spec, args.device, model_dtype(args), mode=forward_mode(args), **verifier_options(args),
                              limits=security_args.limits(args), session_ttl_s=security_args.session_ttl_s(args))


def drafter_methods(args: argparse.Namespace) -> dict:
    """What a drafter service serves: the small model alone, or, given an n-gram store (--cache),
    the model, ngram and hybrid draft methods over it."""
    from drafter_service.model_drafter import ModelDrafter

    spec = model_specs(args.preset, args.verifier, args.draft_model)[1]
    model = ModelDrafter.load(spec, args.device, model_dtype(args), **drafter_forward(args),
                              session_ttl_s=security_args.session_ttl_s(args))
    if not args.cache:
        return {"model": model}
    store = ngram_cache(args.cache, security_args.tls(args))
    return build_drafters(("model", "ngram", "hybrid"), store, model, model.info())


def embedded_generator(args: argparse.Namespace, drafter_kinds: tuple[str, ...] | None = None, store=None):
    """Everything in this process: the verifier, the n-gram store (--cache, or store) and the drafters
    that drafter_kinds (default: the one --drafter names) need; the small model is loaded only for the
    model and hybrid drafters."""
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator.generator import Generator
    from verifier_service.verifier import ModelVerifier

    forward = drafter_forward(args)  # a bad combination fails before anything changes, drafter model or not
    set_threads(args.threads)
    kinds = set(drafter_kinds or (args.drafter,))
    verifier_spec, drafter_spec = model_specs(args.preset, args.verifier, args.draft_model)
    uses_model = bool(kinds & {"model", "hybrid"})
    verifier = ModelVerifier.load(verifier_spec, args.device, model_dtype(args), mode=forward_mode(args),
                                  **verifier_options(args))
    uses_store = bool(kinds & {"ngram", "hybrid"})
    if uses_store and store is None:
        store = ngram_cache(args.cache)
    model = ModelDrafter.load(drafter_spec, args.device, model_dtype(args), **forward) if uses_model else None
    drafters = build_drafters(kinds, store, model, verifier.info())
    return Generator(load_tokenizer(verifier_spec), verifier, drafters, speculation_options(args),
                     store if uses_store else None, limits=security_args.limits(args))  # the store is fed only if drafted from


def remote_generator(tokenizer_spec, verifier_addr: str, drafter_addr: str | None, defaults,
                     cache_url: str = "memory", rpc_timeout_s: float | None = 60.0, connect_timeout_s: float = 60.0,
                     hop_delay_ms: float = 0.0, limits=DEFAULT_LIMITS, learn_global: bool = False, tls=None):
    """The orchestrator of a distributed deployment: verifier and drafter replicas behind gRPC clients.
    verifier_addr / drafter_addr: host:port, a comma list, or dns:///name:port re-resolved as replicas
    come and go (specpipe.replicas); each session is pinned to the least-loaded verifier replica and
    moved with its context when that replica is lost (specpipe.failover). Each draft method the
    drafter service serves (ModelInfo.methods) goes through it; the n-gram and hybrid methods it does
    not serve run here, over the n-gram store cache_url, which this orchestrator feeds with every
    confirmed token (a drafter service drafting n-grams must use the same store). Waits up to
    connect_timeout_s for a verifier replica (it may still be loading its model).
    hop_delay_ms: latency added to each direction of every call to the verifier and the drafter."""
    from specpipe.failover import ReplicatedDrafter, ReplicatedVerifier, drafter_probe, first_answer, verifier_probe
    from specpipe.replicas import ReplicaSet
    from specpipe.rpc.clients import DrafterClient, VerifierClient

    verifier_tls = peer_tls(tls, verifier_addr)
    verifiers = ReplicaSet(verifier_addr, lambda a: VerifierClient(a, rpc_timeout_s, hop_delay_ms=hop_delay_ms,
                                                                   tls=verifier_tls), verifier_probe)
    verifiers.wait_ready(connect_timeout_s)
    verifier = ReplicatedVerifier(verifiers)
    store = ngram_cache(cache_url, tls)
    served: dict = {}
    if drafter_addr is not None:
        drafter_tls = peer_tls(tls, drafter_addr)
        drafters = ReplicaSet(drafter_addr, lambda a: DrafterClient(a, rpc_timeout_s, hop_delay_ms=hop_delay_ms,
                                                                    tls=drafter_tls), drafter_probe)
        methods = ("model",)
        try:
            methods = first_answer(drafters, "info").methods or methods
        except SpecpipeError as err:  # not up yet: assume the small model alone
            log.warning("drafter service unreachable at start", extra={"error": str(err)})
        served = {method: ReplicatedDrafter(drafters, method) for method in methods}
    return served_generator(tokenizer_spec, verifier, served, defaults, store, limits, learn_global)


def peer_tls(tls, target: str):
    """The TLS of the channels to target's replicas: those of a DNS name (dns:///name:port) are dialled
    by IP, so their certificates are checked against the name (a headless Service's, in Kubernetes)."""
    from specpipe.replicas import parse_target

    name = parse_target(target)[1]
    return replace(tls, server_name=name.rpartition(":")[0]) if tls is not None and name else tls


def served_generator(tokenizer_spec, verifier, served: dict, defaults, store, limits=DEFAULT_LIMITS,
                     learn_global: bool = False):
    """The orchestrator over a verifier and the draft methods a drafter service serves (method ->
    Drafter): the n-gram and hybrid methods it does not serve run here, over store, which the
    generator feeds with every confirmed token. Also what the Ray Serve orchestrator runs (deploy/ray)."""
    from orchestrator.generator import Generator

    local = build_drafters(("ngram", "hybrid") if "model" in served else ("ngram",), store, served.get("model"),
                           verifier.info())
    return Generator(load_tokenizer(tokenizer_spec), verifier, {**local, **served}, defaults, store, limits=limits,
                     learn_global=learn_global)

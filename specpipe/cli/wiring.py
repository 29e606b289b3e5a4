"""Builds generators from CLI flags: which implementation each role gets is decided here only."""

from __future__ import annotations

import argparse

from specpipe.cli.options import set_threads, speculation_options
from specpipe.errors import InvalidArgument
from specpipe.models import load_tokenizer
from specpipe.presets import model_specs


def ngram_cache(url: str):
    """The n-gram store named by --cache: "memory" (this process) or a Redis URL (shared)."""
    if url == "memory":
        from cache_service.memory import InMemoryNgramCache

        return InMemoryNgramCache()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from cache_service.redis_store import RedisNgramCache

        return RedisNgramCache.from_url(url)
    raise InvalidArgument(f"--cache must be 'memory' or a redis:// / rediss:// URL, got {url!r}")


def embedded_generator(args: argparse.Namespace, drafter_kinds: tuple[str, ...] | None = None):
    """Everything in this process: the verifier, the n-gram store and the drafters that
    drafter_kinds (default: the one --drafter names) need; the small model is loaded only for
    the model and hybrid drafters."""
    from drafter_service.hybrid import HybridDrafter
    from drafter_service.model_drafter import ModelDrafter
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator
    from verifier_service.verifier import ModelVerifier

    set_threads(args.threads)
    kinds = set(drafter_kinds or (args.drafter,))
    verifier_spec, drafter_spec = model_specs(args.preset, args.verifier, args.draft_model)
    verifier = ModelVerifier.load(verifier_spec, args.device)
    cache = ngram_cache(args.cache) if kinds & {"ngram", "hybrid"} else None  # fed only if drafted from
    drafters = {}
    if kinds & {"ngram", "hybrid"}:
        drafters["ngram"] = NgramDrafter(cache, verifier.info())
    if kinds & {"model", "hybrid"}:
        drafters["model"] = ModelDrafter.load(drafter_spec, args.device)
    if "hybrid" in kinds:
        drafters["hybrid"] = HybridDrafter(drafters["model"], drafters["ngram"])
    return Generator(load_tokenizer(verifier_spec), verifier, drafters, speculation_options(args), cache)


def remote_generator(tokenizer_spec, verifier_addr: str, drafter_addr: str | None, defaults,
                     cache_url: str = "memory", rpc_timeout_s: float | None = 60.0, connect_timeout_s: float = 60.0):
    """The orchestrator of a distributed deployment: verifier and model drafter are gRPC clients; the
    n-gram drafter is a client of the n-gram store (shared when cache_url is Redis).
    Waits up to connect_timeout_s for the verifier (it may still be loading its model)."""
    from drafter_service.hybrid import HybridDrafter
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator
    from specpipe.rpc.clients import DrafterClient, VerifierClient

    verifier = VerifierClient(verifier_addr, timeout_s=rpc_timeout_s)
    verifier.wait_ready(connect_timeout_s)
    cache = ngram_cache(cache_url)
    drafters = {"ngram": NgramDrafter(cache, verifier.info())}
    if drafter_addr is not None:
        drafters["model"] = DrafterClient(drafter_addr, timeout_s=rpc_timeout_s)
        drafters["hybrid"] = HybridDrafter(drafters["model"], drafters["ngram"])
    return Generator(load_tokenizer(tokenizer_spec), verifier, drafters, defaults, cache)

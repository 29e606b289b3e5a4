"""Faults, with real servers and a real redis-server: what the client sees, and that no token is lost
or changed (the output equals the verifier's own greedy output). docs/security.md tabulates them."""

from __future__ import annotations

import contextlib
import threading

import pytest

from specpipe.errors import ResourceExhausted
from specpipe.types import GenerationRequest, SpeculationOptions
from tests.golden import reference_greedy
from tests.redis_harness import redis_server

PROMPT = (40, 41, 42, 43, 40, 41)
MAX_NEW = 40


@pytest.fixture(scope="module")
def reference(tiny_verifier):
    return reference_greedy(tiny_verifier.model, PROMPT, MAX_NEW)


def stream_with_faults(chunks, faults: dict) -> list[int]:
    """Read the chunks; after chunk i (from 1), run faults[i]()."""
    tokens: list[int] = []
    for i, chunk in enumerate(chunks, 1):
        tokens += chunk.token_ids
        faults.get(i, lambda: None)()
    return tokens


def test_redis_killed_and_restarted_mid_generation(tiny_tokenizer, tiny_verifier, reference):
    from cache_service.redis_store import RedisNgramCache
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator

    spec = SpeculationOptions(drafter="ngram", draft_len=4, adaptive="off")
    with redis_server() as first, contextlib.ExitStack() as restarted:
        store = RedisNgramCache.from_url(first.url, timeout_s=0.2)
        generator = Generator(tiny_tokenizer, tiny_verifier, {"ngram": NgramDrafter(store, tiny_verifier.info())},
                              spec, store)
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        tokens = stream_with_faults(chunks, {1: first.stop,  # rounds 2-3 draft from the context alone
                                             3: lambda: restarted.enter_context(redis_server(port=first.port))})
        assert tokens == reference
        assert store.update_global([1, 2, 3]) > 0  # the restarted server serves the same client


def test_drafter_killed_mid_generation(reference, tiny_tokenizer, tiny_verifier, tiny_drafter):
    from drafter_service import servicer
    from orchestrator.generator import Generator
    from specpipe.rpc.clients import DrafterClient
    from specpipe.rpc.server import ServerConfig, serve

    spec = SpeculationOptions(drafter="model", draft_len=4, adaptive="off")
    server = serve([servicer.service({"model": tiny_drafter})], ServerConfig(port=0, grace_s=0))
    with DrafterClient(server.address, timeout_s=5.0) as drafter:
        generator = Generator(tiny_tokenizer, tiny_verifier, {"model": drafter}, spec)
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        tokens = stream_with_faults(chunks, {1: lambda: server.stop(grace_s=0)})
    assert tokens == reference  # the rounds after the kill verify without a draft


def test_ten_times_oversubscribed(tiny_tokenizer, tiny_verifier, tiny_drafter):
    """20 concurrent clients against 1 running + 1 queued generation: the rest get RESOURCE_EXHAUSTED
    at once, every admitted one gets the exact output."""
    from orchestrator import servicer
    from orchestrator.admission import Admission, AdmissionConfig
    from orchestrator.generator import Generator
    from specpipe.rpc.clients import GenerationClient
    from specpipe.rpc.server import ServerConfig, serve

    spec = SpeculationOptions(drafter="model", draft_len=4, adaptive="off")
    long, prompt = 300, (100, 101, 102)  # 219 tokens to EOS: all 20 clients arrive while the first still runs
    reference = reference_greedy(tiny_verifier.model, prompt, long)
    generator = Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter}, spec)
    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=1))
    outcomes: list[object] = []
    with serve([servicer.service(generator, admission)], ServerConfig(port=0, grace_s=0, max_workers=32)) as handle:
        def client():
            with GenerationClient(handle.address, timeout_s=60.0) as c:
                try:
                    outcomes.append([t for chunk in c.generate(token_ids=prompt, max_new_tokens=long)
                                     for t in chunk.token_ids])
                except ResourceExhausted as err:
                    outcomes.append(err)

        threads = [threading.Thread(target=client) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    served = [o for o in outcomes if isinstance(o, list)]
    assert len(outcomes) == 20 and 1 <= len(served) <= 3, len(served)  # 1 running + 1 queued (+1 if one ended)
    assert all(o == reference for o in served)
    assert all(isinstance(o, ResourceExhausted) for o in outcomes if not isinstance(o, list))

"""Golden tests for n-gram and hybrid drafting (tiny preset): embedded with the in-memory and the
Redis store, and distributed (verifier and drafter services over gRPC, the drafter service drafting
from Redis, the orchestrator wired by the CLI's remote_generator): speculative greedy output ==
verifier-only greedy generate(). A store that dies mid-generation changes nothing; two drafter
replicas sharing one Redis draft the same from the same context."""

import contextlib

import pytest

from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import RedisNgramCache
from drafter_service.hybrid import HybridDrafter
from drafter_service.ngram_drafter import NgramDrafter
from orchestrator.generator import Generator
from specpipe.config.services import ModelConfig, OrchestratorConfig
from specpipe.core.types import GREEDY, GenerationRequest, ProposeRequest, SpeculationOptions
from specpipe.serving.server import ServerConfig, serve
from tests.golden import GOLDEN_PROMPTS, assert_golden, golden_references, run
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)

MAX_NEW_TOKENS = 48


def generator_with(cache, tokenizer, verifier, model_drafter) -> Generator:
    ngram = NgramDrafter(cache, verifier.info())
    drafters = {"ngram": ngram, "model": model_drafter, "hybrid": HybridDrafter(model_drafter, ngram)}
    return Generator(tokenizer, verifier, drafters, cache=cache)


@contextlib.contextmanager
def distributed_generator(redis_url, verifier, model_drafter):
    """Verifier and drafter services on loopback; the drafter serves model, ngram and hybrid from Redis."""
    from drafter_service import servicer as drafter_servicer
    from specpipe.app.wiring import build_drafters, remote_generator
    from verifier_service import servicer as verifier_servicer

    config = ServerConfig(host="127.0.0.1", port=0, grace_s=1.0)
    drafter_store = RedisNgramCache.from_url(redis_url)
    drafters = build_drafters(("model", "ngram", "hybrid"), drafter_store, model_drafter, model_drafter.info())
    with serve([verifier_servicer.service(verifier)], config) as verifier_server, \
            serve([drafter_servicer.service(drafters)], config) as drafter_server:
        generator = remote_generator(
            OrchestratorConfig(
                verifier_addr=verifier_server.address,
                drafter_addr=drafter_server.address,
                model=ModelConfig(preset="tiny"),
                speculation=SpeculationOptions(drafter="model", draft_len=4, adaptive="off"),
                cache=redis_url,
            )
        )
        assert all(
            type(generator.drafters[kind]).__name__ == "ReplicatedDrafter" for kind in ("model", "ngram", "hybrid")
        )
        yield generator
    drafter_store.close()


STORES = ("memory", "redis", "grpc+redis")


def store_cases(specs: dict[str, SpeculationOptions], distributed: set[str]) -> list:
    """(store, speculation) cases for a test of the generator fixture (parametrized indirectly): every
    spec with the in-memory store; with -m slow, in embedded Redis (grpc+redis drafts from Redis too,
    in the drafter service) and over gRPC + Redis, except the specs in distributed, which stay in the
    default suite."""
    return [pytest.param(store, spec, id=f"{store}-{name}", marks=() if store == "memory" or (
                store == "grpc+redis" and name in distributed) else pytest.mark.slow)
            for store in STORES for name, spec in specs.items()]


@pytest.fixture(scope="module", params=STORES)
def generator(request, tiny_tokenizer, tiny_verifier, tiny_drafter):
    if request.param == "memory":
        yield generator_with(InMemoryNgramCache(), tiny_tokenizer, tiny_verifier, tiny_drafter)
    elif request.param == "redis":
        cache = RedisNgramCache.from_url(request.getfixturevalue("redis_url"))
        yield generator_with(cache, tiny_tokenizer, tiny_verifier, tiny_drafter)
        cache.close()
    else:
        with distributed_generator(request.getfixturevalue("redis_url"), tiny_verifier, tiny_drafter) as generator:
            yield generator


@pytest.fixture(scope="module")
def references(tiny_tokenizer, tiny_verifier):
    return golden_references(tiny_tokenizer, tiny_verifier.model, MAX_NEW_TOKENS)


NGRAM = {
    "ngram chain k=7": SpeculationOptions(drafter="ngram", draft_len=7, adaptive="off"),
    "ngram tree k=5 width=3": SpeculationOptions(drafter="ngram", draft_len=5, width=3, adaptive="off"),
    "hybrid k=4": SpeculationOptions(drafter="hybrid", draft_len=4, adaptive="off"),
    "hybrid tree k=4 width=2": SpeculationOptions(drafter="hybrid", draft_len=4, width=2, adaptive="off"),
}


@pytest.mark.parametrize("generator, speculation", store_cases(NGRAM, {"ngram chain k=7", "hybrid tree k=4 width=2"}),
                         indirect=["generator"])
def test_ngram_and_hybrid_equal_verifier_greedy(generator, references, speculation):
    drafted, accepted = assert_golden(generator, references, MAX_NEW_TOKENS, speculation)
    assert 0 < accepted < drafted  # drafts were made, some accepted, some rejected


@pytest.mark.slow  # 7-9 s per store
def test_hybrid_accepts_at_least_as_much_as_model_per_round(generator, references):
    per_round = {}
    for kind in ("model", "hybrid"):
        tokens = rounds = 0
        for ids, _ in references.values():
            out, chunks = run(
                generator,
                GenerationRequest(ids, MAX_NEW_TOKENS, speculation=SpeculationOptions(kind, 4, adaptive="off")),
            )
            tokens, rounds = tokens + len(out), rounds + len(chunks)
        per_round[kind] = tokens / rounds
    assert per_round["hybrid"] >= per_round["model"]


def test_redis_down_mid_generation_changes_nothing_and_recovers(
    tiny_tokenizer, tiny_verifier, tiny_drafter, references
):
    ids, expected = references[GOLDEN_PROMPTS[1]]  # a prompt whose n-gram drafts get accepted
    with redis_server() as server:
        cache = RedisNgramCache.from_url(server.url, timeout_s=0.2)
        generator = generator_with(cache, tiny_tokenizer, tiny_verifier, tiny_drafter)
        request = GenerationRequest(ids, MAX_NEW_TOKENS, speculation=SpeculationOptions("hybrid", 4, adaptive="off"))
        tokens = []
        for i, chunk in enumerate(generator.generate(request)):
            tokens.extend(chunk.token_ids)
            if i == 2:
                server.stop()  # the store dies mid-generation
        assert tokens == expected
        port = server.port
    with redis_server(port=port):  # the store is back on the same address
        ngram_request = GenerationRequest(
            ids, MAX_NEW_TOKENS, speculation=SpeculationOptions("ngram", 7, adaptive="off")
        )
        tokens, chunks = run(generator, ngram_request)
        assert tokens == expected
        assert sum(c.round.accepted for c in chunks) > 0  # drafting from the context, the store back
        cache.close()


def test_two_drafter_replicas_share_one_redis(redis_url, tiny_verifier):  # noqa: F811
    """Replicas alternate on one session: each drafts from the context it is given, and past it from
    the verifier table that the session's rounds put in the shared store."""
    stores = [RedisNgramCache.from_url(redis_url) for _ in range(2)]
    replicas = [NgramDrafter(store, tiny_verifier.info()) for store in stores]
    context = [1, 2, 3, 4, 5, 1, 2, 3]
    first = replicas[0].propose(ProposeRequest("shared", context, 4, 1, GREEDY)).draft
    assert first.tokens == (4, 5, 1, 2) and first.sources == ("context",) * 4
    stores[0].record_branches("shared", [[3, 7, 8]])  # what the orchestrator forwards after a round
    context += [7]
    second = replicas[1].propose(ProposeRequest("shared", context, 1, 1, GREEDY)).draft  # (7,) is new to the context
    assert second.tokens == (8,) and second.sources == ("verifier",)
    assert replicas[0].propose(ProposeRequest("shared", context, 1, 1, GREEDY)).draft == second
    for store in stores:
        store.release("shared")
        store.close()

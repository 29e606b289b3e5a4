"""Tenant isolation (specpipe.core.tenancy): one tenant's outputs never draft for another, in the memory
and the Redis store, embedded and over gRPC; finished outputs feed their tenant's learned store by
default and nobody's with learning off."""

from __future__ import annotations

import contextlib

import grpc
import pytest

from specpipe.core.errors import InvalidArgument
from specpipe.core.tenancy import TENANT_METADATA, tenant_from_metadata
from specpipe.core.types import GenerationRequest, ProposeRequest, SpeculationOptions
from tests.redis_harness import redis_url  # noqa: F401  (fixture)

NGRAM = SpeculationOptions(drafter="ngram", draft_len=4, adaptive="off")
PROMPT = (40, 41, 42, 43)


@pytest.mark.parametrize("metadata,tenant", [((), ""), (((TENANT_METADATA, "acme"),), "acme"),
                                              ((("other", "x"), (TENANT_METADATA, "a.b_c-1")), "a.b_c-1")])
def test_tenant_from_metadata(metadata, tenant):
    assert tenant_from_metadata(metadata) == tenant


@pytest.mark.parametrize("metadata", [((TENANT_METADATA, "a/b"),), ((TENANT_METADATA, "x" * 65),),
                                      ((TENANT_METADATA, "{g}"),), ((TENANT_METADATA, "a"), (TENANT_METADATA, "b"))])
def test_bad_tenant_is_invalid_argument(metadata):
    with pytest.raises(InvalidArgument, match="tenant|at most one"):
        tenant_from_metadata(metadata)


@pytest.fixture(params=["memory", "redis"])
def store(request):
    from cache_service.stores import open_store

    if request.param == "redis":
        from cache_service.redis_store import connect

        url = request.getfixturevalue("redis_url")
        connect(url).flushdb()
        return open_store(url)
    return open_store("memory")


def global_drafts(drafter, tenant: str, context) -> int:
    """Draft nodes that came from the store's global table for tenant after context."""
    draft = drafter.propose(ProposeRequest("probe", tuple(context), 4, tenant=tenant)).draft
    return sum(source == "global" for source in draft.node_sources())


def generate(generator, tenant: str, prompt=PROMPT) -> tuple[int, ...]:
    chunks = generator.generate(GenerationRequest(prompt, 24, speculation=NGRAM, tenant=tenant))
    return sum((c.token_ids for c in chunks), ())


def test_one_tenants_outputs_never_draft_for_another(store, tiny_tokenizer, tiny_verifier):
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator

    drafter = NgramDrafter(store, tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, {"ngram": drafter}, NGRAM, store, learn_global=True)
    output = generate(generator, "alpha")
    probe = output[:4]  # a context ending where alpha's output goes on: the global table knows what follows
    assert global_drafts(drafter, "alpha", probe) > 0  # alpha learned from its own output
    assert global_drafts(drafter, "beta", probe) == 0
    assert global_drafts(drafter, "", probe) == 0  # nor the default tenant
    assert generate(generator, "beta") == output  # lossless for beta all the same


def test_finished_outputs_draft_for_their_tenant_by_default_and_for_nobody_with_learning_off(
        store, tiny_tokenizer, tiny_verifier):
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator

    drafter = NgramDrafter(store, tiny_verifier.info())
    output = generate(Generator(tiny_tokenizer, tiny_verifier, {"ngram": drafter}, NGRAM, store), "")
    assert global_drafts(drafter, "", output[:4]) > 0  # learning is on by default, within the tenant
    assert global_drafts(drafter, "other", output[:4]) == 0
    off = Generator(tiny_tokenizer, tiny_verifier, {"ngram": drafter}, NGRAM, store, learn_global=False)
    output = generate(off, "quiet")
    assert global_drafts(drafter, "quiet", output[:4]) == 0
    store.update_global(output, "quiet")  # what `specpipe cache seed` does: an operator's corpus does draft
    assert global_drafts(drafter, "quiet", output[:4]) > 0


def test_tenant_metadata_over_grpc_reaches_the_store(tiny_tokenizer, tiny_verifier):
    from cache_service.memory import InMemoryNgramCache
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator import servicer
    from orchestrator.generator import Generator
    from specpipe.serving.clients import GenerationClient
    from specpipe.serving.server import ServerConfig, serve

    store = InMemoryNgramCache()
    drafter = NgramDrafter(store, tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, {"ngram": drafter}, NGRAM, store, learn_global=True)
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(serve([servicer.service(generator)], ServerConfig(port=0, grace_s=0.5)))
        client = stack.enter_context(GenerationClient(handle.address, timeout_s=30.0))
        output = sum((c.token_ids for c in client.generate(token_ids=PROMPT, max_new_tokens=24, tenant="gamma")), ())
        assert global_drafts(drafter, "gamma", output[:4]) > 0
        assert global_drafts(drafter, "", output[:4]) == 0
        with pytest.raises(InvalidArgument, match="tenant"):
            list(client.generate(token_ids=PROMPT, max_new_tokens=4, tenant="no/slashes"))
        call = client._stub.Generate  # a raw call with two tenant entries
        with pytest.raises(grpc.RpcError) as err:
            list(call(generator_request(), metadata=((TENANT_METADATA, "a"), (TENANT_METADATA, "b")), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def generator_request():
    from specpipe.v1 import generation_pb2

    return generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=PROMPT), max_new_tokens=4)


def test_redis_keys_of_a_tenant(redis_url):  # noqa: F811
    from cache_service.redis_store import RedisNgramCache, connect, global_keys

    connect(redis_url).flushdb()
    cache = RedisNgramCache.from_url(redis_url)
    cache.update_global([1, 2, 3, 4], "acme")
    cache.update_global([1, 2, 3, 4])
    assert sorted(k.decode() for k in connect(redis_url).keys("*")) == sorted(global_keys("") + global_keys("acme"))
    assert global_keys("acme")[0] == "{g:acme}:docs" and global_keys("")[0] == "{g}:docs"

"""Input caps (specpipe.config.limits): the pure checks, and the issue's reproductions refused with
INVALID_ARGUMENT over real gRPC and embedded alike, the servers healthy after."""

from __future__ import annotations

import pytest

from specpipe.config.limits import (
    DEFAULT_LIMITS,
    DRAFT_NODE_BUCKETS,
    Limits,
    check_draft,
    check_generation,
    check_propose,
    draft_nodes_label,
)
from specpipe.core.errors import InvalidArgument, ResourceExhausted
from specpipe.core.types import Draft, GenerationRequest, ProposeRequest, SparseDist, SpeculationOptions
from tests.grpc_harness import assert_serving, shared_tiny_cluster

PROMPT = (10, 20, 30)
SMALL = Limits(max_prompt_tokens=8, max_new_tokens=16, max_draft_len=8, max_width=2, max_hypotheses=3, max_stops=2,
               max_stop_chars=5, max_draft_nodes=6, max_q_entries=3, max_id_chars=10, max_session_id_chars=12)


def spec(**kw) -> SpeculationOptions:
    return SpeculationOptions(**{"adaptive": "off", "draft_len": 4, **kw})


GENERATION_CASES = {
    "at every cap": (GenerationRequest((1,) * 8, 16, "r" * 10, ("a", "bbbbb"), speculation=spec(width=2, hypotheses=3)),
                     None),
    "all hypotheses": (GenerationRequest(PROMPT, 8, speculation=spec(hypotheses=-1)), None),
    "prompt": (GenerationRequest((1,) * 9, 8), "prompt tokens is 9; this server allows at most 8"),
    "max_new_tokens": (GenerationRequest(PROMPT, 17), "max_new_tokens is 17"),
    "draft_len": (GenerationRequest(PROMPT, 8, speculation=spec(draft_len=9)), "draft_len is 9"),
    "width": (GenerationRequest(PROMPT, 8, speculation=spec(width=3)), "width is 3"),
    "hypotheses": (GenerationRequest(PROMPT, 8, speculation=spec(hypotheses=4)), "hypotheses is 4"),
    "stop count": (GenerationRequest(PROMPT, 8, stop=("a", "b", "c")), "number of stop strings is 3"),
    "stop length": (GenerationRequest(PROMPT, 8, stop=("abcdef",)), "longest stop string's length is 6"),
    "request_id": (GenerationRequest(PROMPT, 8, "r" * 11), "request_id length is 11"),
}


DRAFT_CASES = {
    "six nodes": (Draft.chain(range(6)), None),
    "seven nodes": (Draft.chain(range(7)), "draft nodes is 7"),
    "parents longer than tokens": (Draft((1,), tuple(range(-1, 6))), "draft parents is 7"),
    "wide q": (Draft.chain([1], (SparseDist((1, 2, 3, 4), (0.25,) * 4),)), "entries of a draft node's q is 4"),
}


CHECK_CASES = [(check_generation, *case) for case in GENERATION_CASES.values()] + \
    [(check_draft, *case) for case in DRAFT_CASES.values()]


@pytest.mark.parametrize("check,value,message", CHECK_CASES, ids=[*GENERATION_CASES, *DRAFT_CASES])
def test_check(check, value, message):
    """None: within the caps; else the InvalidArgument message."""
    if message is None:
        check(value, SMALL)
        return
    with pytest.raises(InvalidArgument, match=message):
        check(value, SMALL)


def test_check_propose():
    check_propose(ProposeRequest("s", (1,) * 24, 4, 2), SMALL)  # context: a whole prompt and a whole output
    for request, message in ((ProposeRequest("s", (1,) * 25, 4), "context tokens is 25"),
                             (ProposeRequest("s", PROMPT, 9), "draft_len is 9"),
                             (ProposeRequest("s", PROMPT, 4, 3), "width is 3"),
                             (ProposeRequest("s" * 13, PROMPT, 4), "session_id length is 13")):
        with pytest.raises(InvalidArgument, match=message):
            check_propose(request, SMALL)


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_width"):
        Limits(max_width=0)


@pytest.mark.parametrize("nodes,label", [(0, "le_0"), (1, "le_1"), (3, "le_4"), (4, "le_4"), (256, "le_256"),
                                         (257, "gt_256"), (10**6, "gt_256")])
def test_draft_nodes_label_is_from_a_fixed_set(nodes, label):
    assert draft_nodes_label(nodes) == label
    assert len({draft_nodes_label(n) for n in range(2000)}) == len(DRAFT_NODE_BUCKETS) + 1


# The reproductions, each refused before any work: over gRPC and embedded, the same message.
REPRODUCTIONS = {
    "draft_len 1,000,000": ({"speculation": spec(draft_len=1_000_000)}, "draft_len is 1000000"),
    "width 10,000": ({"speculation": spec(width=10_000)}, "width is 10000"),
    "hypotheses 1,000,000": ({"speculation": spec(schedule="branch", hypotheses=1_000_000)}, "hypotheses is 1000000"),
    "10,000 stop strings": ({"stop": tuple(f"s{i}" for i in range(10_000))}, "number of stop strings is 10000"),
    "a 1 MB stop string": ({"stop": ("x" * (1 << 20),)}, "longest stop string's length is 1048576"),
    "max_new_tokens 1,000,000": ({"max_new_tokens": 1_000_000}, "max_new_tokens is 1000000"),
    "a 100,000-token prompt": ({"token_ids": (5,) * 100_000}, "prompt tokens is 100000"),
}


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


@pytest.mark.parametrize("kwargs,message", REPRODUCTIONS.values(), ids=REPRODUCTIONS.keys())
def test_reproduction_is_invalid_argument(cluster, kwargs, message):
    kwargs = {"token_ids": PROMPT, "max_new_tokens": 8, **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        list(cluster.generation_client.generate(**kwargs))
    prompt = kwargs.pop("token_ids")
    request = GenerationRequest(prompt, **kwargs)
    with pytest.raises(InvalidArgument, match=message):
        cluster.generator.generate(request)
    assert_serving(cluster.generation_client)


def test_verifier_and_drafter_refuse_oversized_work(cluster):
    from specpipe.core.types import GREEDY

    cluster.verifier_client.prefill("caps", PROMPT)
    try:
        with pytest.raises(InvalidArgument, match="draft nodes is 10000"):
            cluster.verifier_client.verify("caps", len(PROMPT), Draft.chain([1] * 10_000), GREEDY)
        with pytest.raises(InvalidArgument, match="prompt tokens is 100000"):
            cluster.verifier_client.prefill("caps-2", (1,) * 100_000)
        with pytest.raises(InvalidArgument, match="draft_len is 1000000"):
            cluster.drafter_client.propose(ProposeRequest("caps", PROMPT, 1_000_000))
        with pytest.raises(InvalidArgument, match="width is 10000"):
            cluster.drafter_client.propose(ProposeRequest("caps", PROMPT, 4, 10_000))
        assert len(cluster.verifier_client.verify("caps", len(PROMPT), Draft.chain([1]), GREEDY).emitted) >= 1
    finally:
        cluster.verifier_client.release("caps")
    assert_serving(cluster.verifier_client)
    assert_serving(cluster.drafter_client)


def test_request_beyond_the_message_limit_is_refused_unread():
    from cache_service import servicer
    from cache_service.memory import InMemoryNgramCache
    from specpipe.serving.cache_client import CacheClient
    from specpipe.serving.server import ServerConfig, serve

    config = ServerConfig(port=0, grace_s=0.5, max_request_bytes=64 * 1024)
    with serve([servicer.service(InMemoryNgramCache())], config) as handle, CacheClient(handle.address, 10.0) as client:
        assert client.update_global(list(range(1000))) > 0
        with pytest.raises(ResourceExhausted, match="larger than max"):
            client.update_global(list(range(100_000, 200_000)))  # ~400 KB
        assert_serving(client)


def test_default_caps_fit_the_tiny_context():
    assert DEFAULT_LIMITS.max_request_bytes >= 4 * DEFAULT_LIMITS.max_context_tokens * 2  # a whole context, packed

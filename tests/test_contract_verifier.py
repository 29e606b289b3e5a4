"""Contract of the Verifier role: the in-process ModelVerifier and the gRPC VerifierClient answer the
same calls with the same results and the same errors; a bad request never hurts the server."""

from __future__ import annotations

import itertools

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import GREEDY, Draft, ProposeRequest, SamplingParams, SparseDist
from specpipe.serving.clients import channel
from specpipe.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.grpc_harness import assert_serving, shared_tiny_cluster

PROMPT = (72, 101, 108, 108, 111, 44, 32)  # "Hello, " in the tiny byte vocabulary
VOCAB = 257
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


@pytest.fixture(params=["inproc", "grpc"])
def verifier(request, cluster):
    impl = cluster.verifier if request.param == "inproc" else cluster.verifier_client
    yield impl
    if request.param == "grpc":  # whatever the test sent, the server is still healthy and useful
        assert_serving(cluster.verifier_client, "specpipe.v1.Verifier")
        sid = session()
        assert cluster.verifier_client.prefill(sid, PROMPT) == len(PROMPT)
        assert (
            cluster.verifier_client.verify(sid, len(PROMPT), Draft.chain([1, 2]), GREEDY).context_len >= len(PROMPT) + 1
        )
        assert cluster.verifier_client.release(sid)


def session() -> str:
    return f"verifier-contract-{next(_ids)}"


def comparable(result):
    """Everything but the timing; entropy crosses the wire as float32."""
    return (result.accepted_tokens, result.accepted_nodes, result.correction_token, result.node_argmax,
            result.context_len, round(result.entropy, 4))


# --- same calls, same results -------------------------------------------------------------------

def run_rounds(verifier, drafts, sampling=GREEDY):
    sid = session()
    context_len = verifier.prefill(sid, PROMPT)
    out = [context_len]
    for draft in drafts:
        result = verifier.verify(sid, context_len, draft, sampling)
        context_len = result.context_len
        out.append(comparable(result))
    out.append(verifier.release(sid))
    out.append(verifier.release(sid))  # a second release finds nothing
    return out


def test_info_is_the_same(cluster):
    assert cluster.verifier_client.info() == cluster.verifier.info()
    assert cluster.verifier.info().vocab_size == VOCAB


@pytest.mark.parametrize("drafts", [
    [Draft(), Draft.chain([1]), Draft.chain([32, 32, 32, 32])],
    [Draft((1, 2, 3, 4, 5, 6), (-1, -1, 0, 0, 2, 4)), Draft((9, 8, 7), (-1, 0, 0))],
], ids=["chains", "trees"])
def test_greedy_rounds_are_identical(cluster, drafts):
    assert run_rounds(cluster.verifier_client, drafts) == run_rounds(cluster.verifier, drafts)


def test_sampled_rounds_with_sparse_q_are_identical(cluster):
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=11)
    sid = session()
    cluster.drafter.propose(ProposeRequest(sid, PROMPT, 4, 1, sampling))
    draft = cluster.drafter.propose(ProposeRequest(sid, PROMPT, 4, 1, sampling)).draft
    assert draft.q is not None and len(draft.q) == len(draft)
    drafts = [draft, Draft.chain([5, 6], q=(SparseDist((5, 6), (0.75, 0.25)), SparseDist((6,), (1.0,))))]
    assert run_rounds(cluster.verifier_client, drafts, sampling) == run_rounds(cluster.verifier, drafts, sampling)


# --- bad requests: the right status and a clear message ------------------------------------------

def prefilled(verifier) -> str:
    sid = session()
    verifier.prefill(sid, PROMPT)
    return sid


BAD_PREFILLS = [
    ("empty prompt", lambda v: v.prefill(session(), []), InvalidArgument, "prompt is empty"),
    ("token id >= vocab", lambda v: v.prefill(session(), [1, VOCAB]), InvalidArgument, "outside the vocabulary"),
    ("negative token id", lambda v: v.prefill(session(), [1, -3]), InvalidArgument, "outside the vocabulary"),
    ("token id beyond int32", lambda v: v.prefill(session(), [1, 2**40]), InvalidArgument,
     "outside the vocabulary|cannot be sent"),
    ("prompt beyond the context window", lambda v: v.prefill(session(), [1] * 4096), InvalidArgument, "context window"),
    ("empty session id", lambda v: v.prefill("", PROMPT), InvalidArgument, "session_id"),
]

BAD_VERIFIES = [
    (
        "unknown session",
        lambda v, sid: v.verify("no-such-session", len(PROMPT), Draft.chain([1]), GREEDY),
        FailedPrecondition,
        "unknown session",
    ),
    (
        "released session",
        lambda v, sid: (v.release(sid), v.verify(sid, len(PROMPT), Draft.chain([1]), GREEDY)),
        FailedPrecondition,
        "unknown session",
    ),
    (
        "context_len mismatch",
        lambda v, sid: v.verify(sid, len(PROMPT) + 3, Draft.chain([1]), GREEDY),
        FailedPrecondition,
        "assumes",
    ),
    (
        "malformed parents (forward)",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft((1, 2), (-1, 1)), GREEDY),
        InvalidArgument,
        "malformed draft tree",
    ),
    (
        "malformed parents (< -1)",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft((1, 2), (-1, -2)), GREEDY),
        InvalidArgument,
        "malformed draft tree",
    ),
    (
        "parents length",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft((1, 2), (-1,)), GREEDY),
        InvalidArgument,
        "parents",
    ),
    (
        "draft token >= vocab",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft.chain([1, VOCAB + 5]), GREEDY),
        InvalidArgument,
        "outside the vocabulary",
    ),
    (
        "temperature < 0",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft.chain([1]), SamplingParams(temperature=-0.5)),
        InvalidArgument,
        "temperature",
    ),
    (
        "top_p > 1",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft.chain([1]), SamplingParams(temperature=1.0, top_p=1.5)),
        InvalidArgument,
        "top_p",
    ),
    (
        "top_p < 0",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft.chain([1]), SamplingParams(temperature=1.0, top_p=-0.1)),
        InvalidArgument,
        "top_p",
    ),
    (
        "q count != nodes",
        lambda v, sid: v.verify(
            sid, len(PROMPT), Draft.chain([1, 2], q=(SparseDist((1,), (1.0,)),)), SamplingParams(temperature=1.0)
        ),
        InvalidArgument,
        "q distributions",
    ),
    (
        "sampled tree",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft((1, 2), (-1, -1)), SamplingParams(temperature=1.0)),
        InvalidArgument,
        "chains only",
    ),
    (
        "draft beyond the node cap (and the context window)",
        lambda v, sid: v.verify(sid, len(PROMPT), Draft.chain([1] * 2100), GREEDY),
        InvalidArgument,
        "draft nodes is 2100",
    ),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in BAD_PREFILLS], ids=[c[0] for c in BAD_PREFILLS])
def test_bad_prefill(verifier, call, error, message):
    with pytest.raises(error, match=message):
        call(verifier)


@pytest.mark.parametrize("call, error, message", [c[1:] for c in BAD_VERIFIES], ids=[c[0] for c in BAD_VERIFIES])
def test_bad_verify(verifier, call, error, message):
    sid = prefilled(verifier)
    with pytest.raises(error, match=message):
        call(verifier, sid)
    verifier.release(sid)


def test_a_failed_verify_leaves_the_session_usable(verifier):
    sid = prefilled(verifier)
    with pytest.raises(InvalidArgument):
        verifier.verify(sid, len(PROMPT), Draft((1, 2), (-1, 3)), GREEDY)
    assert verifier.verify(sid, len(PROMPT), Draft.chain([1]), GREEDY).context_len > len(PROMPT)
    assert verifier.release(sid)


def test_status_codes_on_the_wire(cluster):
    """The raw status (what any gRPC client in any language sees), not only the mapped exception."""
    stub = verifier_pb2_grpc.VerifierStub(channel(cluster.verifier_server.address))
    cases = [
        (verifier_pb2.PrefillRequest(session_id="raw", prompt_ids=[]), stub.Prefill, grpc.StatusCode.INVALID_ARGUMENT),
        (verifier_pb2.VerifyRequest(session_id="raw-unknown", context_len=3,
                                    draft=common_pb2.DraftTree(tokens=[1], parents=[-1])),
         stub.Verify, grpc.StatusCode.FAILED_PRECONDITION),
    ]
    for request, method, code in cases:
        with pytest.raises(grpc.RpcError) as caught:
            method(request, timeout=10)
        assert caught.value.code() == code
        assert caught.value.details()


# --- health and reflection -----------------------------------------------------------------------

def test_health_serves_every_name(cluster):
    stub = health_pb2_grpc.HealthStub(channel(cluster.verifier_server.address))
    for name in ("", "specpipe.v1.Verifier"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as caught:
        stub.Check(health_pb2.HealthCheckRequest(service="specpipe.v1.Nope"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def list_services(address: str) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel(address))
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    return {s.name for reply in replies for s in reply.list_services_response.service}


def test_reflection_lists_the_services(cluster):
    expected = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    assert list_services(cluster.verifier_server.address) == expected | {"specpipe.v1.Verifier"}
    assert list_services(cluster.drafter_server.address) == expected | {"specpipe.v1.Drafter"}
    assert list_services(cluster.generation_server.address) == expected | {"specpipe.v1.Generation"}

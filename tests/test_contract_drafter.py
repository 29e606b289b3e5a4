"""Contract of the Drafter role: the in-process ModelDrafter and the gRPC DrafterClient answer the
same calls with the same drafts (sparse q included) and the same errors."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from specpipe.core.errors import InvalidArgument
from specpipe.core.types import GREEDY, ProposeRequest, SamplingParams
from tests.grpc_harness import assert_serving, shared_tiny_cluster

CONTEXT = (72, 101, 108, 108, 111, 44, 32)  # "Hello, " in the tiny byte vocabulary
VOCAB = 257
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=5)
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


@pytest.fixture(params=["inproc", "grpc"])
def drafter(request, cluster):
    yield cluster.drafter if request.param == "inproc" else cluster.drafter_client
    if request.param == "grpc":
        assert_serving(cluster.drafter_client, "specpipe.v1.Drafter")
        sid = session()
        assert len(cluster.drafter_client.propose(ProposeRequest(sid, CONTEXT, 3, 1, GREEDY)).draft) == 3
        assert cluster.drafter_client.release(sid)


def session() -> str:
    return f"drafter-contract-{next(_ids)}"


def test_info_is_the_same(cluster):
    remote = cluster.drafter_client.info()
    assert remote.methods == ("model",)  # the draft methods the service serves
    assert replace(remote, methods=()) == cluster.drafter.info()
    assert cluster.drafter_client.info().vocab_fingerprint == cluster.verifier_client.info().vocab_fingerprint


def run_proposals(drafter, steps):
    """Proposals along a growing context (a rollback is the same call with a shorter context)."""
    sid = session()
    drafts = []
    for context, draft_len, width, sampling in steps:
        drafts.append(drafter.propose(ProposeRequest(sid, context, draft_len, width, sampling)).draft)
    drafts.append(drafter.release(sid))
    drafts.append(drafter.release(sid))
    return drafts


@pytest.mark.parametrize("steps", [
    [(CONTEXT, 4, 1, GREEDY), (CONTEXT + (1, 2), 4, 1, GREEDY), (CONTEXT[:3], 2, 1, GREEDY)],
    [(CONTEXT, 3, 2, GREEDY), (CONTEXT + (9,), 4, 3, GREEDY)],
    [(CONTEXT, 4, 1, SAMPLED), (CONTEXT + (1,), 3, 2, SAMPLED)],  # sampled: a chain with sparse q
    [(CONTEXT, 0, 1, GREEDY), (CONTEXT * 291, 50, 1, GREEDY)],      # nothing to draft / clipped to the window
], ids=["chain+rollback", "tree", "sampled", "edge lengths"])
def test_proposals_are_identical(cluster, steps):
    remote, local = run_proposals(cluster.drafter_client, steps), run_proposals(cluster.drafter, steps)
    assert remote == local
    if steps[0][3] is SAMPLED:
        assert all(d.q is not None and len(d.q) == len(d) for d in local[:-2])


BAD_PROPOSALS = [
    ("empty context", dict(context=()), "context is empty"),
    ("token id >= vocab", dict(context=CONTEXT + (VOCAB,)), "outside the vocabulary"),
    ("empty session id", dict(session_id=""), "session_id"),
    ("negative draft_len", dict(draft_len=-1), "draft_len"),
    ("width 0", dict(width=0), "width"),
    ("temperature < 0", dict(sampling=SamplingParams(temperature=-1.0)), "temperature"),
    ("top_p > 1", dict(sampling=SamplingParams(temperature=1.0, top_p=1.01)), "top_p"),
    ("top_p < 0", dict(sampling=SamplingParams(temperature=1.0, top_p=-0.5)), "top_p"),
    ("top_k < 0", dict(sampling=SamplingParams(temperature=1.0, top_k=-2)), "top_k"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in BAD_PROPOSALS], ids=[c[0] for c in BAD_PROPOSALS])
def test_bad_propose(drafter, change, message):
    call = dict(session_id=session(), context=CONTEXT, draft_len=3, width=1, sampling=GREEDY) | change
    with pytest.raises(InvalidArgument, match=message):
        drafter.propose(ProposeRequest(**call))


def test_release_of_an_unknown_session(drafter):
    assert drafter.release(session()) is False


def test_stale_epoch_is_aborted(drafter):
    from specpipe.core.errors import Aborted

    sid = session()
    drafter.propose(ProposeRequest(sid, CONTEXT, 3, 1, GREEDY, epoch=3))
    with pytest.raises(Aborted, match="stale"):
        drafter.propose(ProposeRequest(sid, CONTEXT + (5,), 3, 1, GREEDY, epoch=2))
    assert len(drafter.propose(ProposeRequest(sid, CONTEXT + (5,), 3, 1, GREEDY, epoch=4)).draft) == 3
    drafter.release(sid)


def test_a_greedy_chain_ends_after_its_first_token_below_stop_confidence(drafter):
    full = drafter.propose(ProposeRequest(session(), CONTEXT, 6, 1, GREEDY)).draft
    levels = sorted(set(full.confidence))
    for stop in (0.0, (levels[0] + levels[-1]) / 2, 1.0):  # 0: every level; 1: the first token alone
        cut = next((i + 1 for i, c in enumerate(full.confidence) if c < stop), len(full))
        short = drafter.propose(ProposeRequest(session(), CONTEXT, 6, 1, GREEDY, stop_confidence=stop)).draft
        assert short.tokens == full.tokens[:cut]
    sampled = [drafter.propose(ProposeRequest(session(), CONTEXT, 6, 1, SAMPLED, stop_confidence=stop)).draft
               for stop in (0.0, 1.0)]  # sampling drafts every level
    assert sampled[0].tokens == sampled[1].tokens and len(sampled[0]) == 6


def test_predictor_hints_cross_the_wire(cluster):
    sid = session()
    local = cluster.drafter.propose(ProposeRequest(sid, CONTEXT, 3, 2, GREEDY))
    remote = cluster.drafter_client.propose(ProposeRequest(sid, CONTEXT, 3, 2, GREEDY))
    remote, local = remote.draft, local.draft
    assert (remote.tokens, remote.parents, remote.runner_up) == (
        local.tokens,
        local.parents,
        local.runner_up,
    )  # the probabilities travel as float32:
    assert remote.confidence == pytest.approx(local.confidence, rel=1e-5) and len(local.confidence) == len(local)
    assert remote.runner_up_confidence == pytest.approx(local.runner_up_confidence, rel=1e-5)
    assert all(0 < c <= 1 for c in local.confidence) and all(r >= 0 for r in local.runner_up[:1])
    cluster.drafter.release(sid)
    cluster.drafter_client.release(sid)

"""Rounds of many sessions over one stream (specpipe.serving.verify_stream), against a real gRPC
verifier: the same verdicts as unary calls, rounds that join the same forward, a round's failure
its own, a dead replica failing the rounds in flight (the failover's cue) and a new stream after it,
and the sessions of a caller that left freed."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from specpipe.config.presets import ModelSpec
from specpipe.core.errors import FailedPrecondition, Unavailable
from specpipe.core.types import GREEDY, Draft
from specpipe.engine.models import model_info, tiny_model
from specpipe.serving.clients import VerifierClient
from specpipe.serving.server import ServerConfig, serve

PROMPTS = [tuple(range(3 + i, 20 + 3 * i)) for i in range(8)]


@contextlib.contextmanager
def verifier_server(verifier=None):
    from verifier_service import servicer
    from verifier_service.verifier import ModelVerifier

    if verifier is None:
        model = tiny_model()
        verifier = ModelVerifier(model, model_info(ModelSpec("tiny"), model))
    with serve([servicer.service(verifier)], ServerConfig(port=0, grace_s=0.5)) as handle:
        yield verifier, handle


def decode(client, session_id: str, prompt, rounds: int, drafts) -> list:
    client.prefill(session_id, prompt)
    context, results = len(prompt), []
    for r in range(rounds):
        result = client.verify(session_id, context, drafts(r), GREEDY)
        context = result.context_len
        results.append((result.accepted_tokens, result.correction_token, result.node_argmax))
    client.release(session_id)
    return results


def test_concurrent_sessions_over_one_stream_get_the_unary_verdicts():
    def drafts(r):  # a chain, a tree and no draft in turn
        return (Draft((5, 6, 7), (-1, 0, 1)), Draft((5, 9, 6), (-1, -1, 0)), Draft())[r % 3]

    with verifier_server() as (verifier, handle):
        unary = VerifierClient(handle.address, timeout_s=30.0, stream=False)
        expected = [decode(unary, f"u{i}", p, 12, drafts) for i, p in enumerate(PROMPTS)]
        streamed = VerifierClient(handle.address, timeout_s=30.0)
        got: dict[int, list] = {}
        threads = [threading.Thread(target=lambda i=i, p=p: got.__setitem__(i, decode(streamed, f"s{i}", p, 12,
                                                                                       drafts)))
                   for i, p in enumerate(PROMPTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[i] for i in range(len(PROMPTS))] == expected
        assert streamed._mux is not None  # the rounds went over the stream
        unary.close()
        streamed.close()


def test_a_rounds_failure_is_its_own_and_a_dead_replica_fails_the_rounds_in_flight():
    with verifier_server() as (verifier, handle):
        client = VerifierClient(handle.address, timeout_s=10.0)
        client.prefill("a", PROMPTS[0])
        with pytest.raises(FailedPrecondition, match="unknown session"):
            client.verify("nobody", 3, Draft(), GREEDY)
        with pytest.raises(FailedPrecondition, match="the request assumes"):
            client.verify("a", 99, Draft(), GREEDY)
        assert client.verify("a", len(PROMPTS[0]), Draft(), GREEDY).context_len == len(PROMPTS[0]) + 1
        address = handle.address
    with pytest.raises(Unavailable):  # the server is gone: the stream breaks, the round fails as UNAVAILABLE
        client.verify("a", len(PROMPTS[0]) + 1, Draft(), GREEDY)
    with verifier_server() as (_, again):  # a verifier back: the next round opens a new stream
        client = VerifierClient(again.address, timeout_s=10.0)
        client.prefill("b", PROMPTS[1])
        assert client.verify("b", len(PROMPTS[1]), Draft(), GREEDY).context_len == len(PROMPTS[1]) + 1
        client.close()
    assert address


def test_the_sessions_of_a_stream_that_ends_mid_round_are_freed():
    """A client that leaves with a round in its verifier's queue: the round still finishes there, its
    session is free for its next round (no round left holding it)."""
    from verifier_service.verifier import ModelVerifier

    model = tiny_model()
    verifier = ModelVerifier(model, model_info(ModelSpec("tiny"), model))
    release = threading.Event()
    release.set()
    forward = verifier._scheduler._forward
    verifier._scheduler._forward = lambda segments: (release.wait(5.0), forward(segments))[1]
    with verifier_server(verifier) as (_, handle):
        client = VerifierClient(handle.address, timeout_s=0.5)
        client.prefill("c", PROMPTS[2])
        release.clear()  # the round's forward waits
        with pytest.raises(Exception):
            client.verify("c", len(PROMPTS[2]), Draft(), GREEDY)  # gives up after 0.5 s
        client.close()  # the stream ends with its round in the queue
        release.set()
        other = VerifierClient(handle.address, timeout_s=10.0)
        deadline = time.monotonic() + 10.0
        while True:  # the round finishes on the verifier, then its session takes the next one
            try:
                assert other.verify("c", len(PROMPTS[2]) + 1, Draft(), GREEDY).context_len == len(PROMPTS[2]) + 2
                break
            except FailedPrecondition as err:
                assert "in flight" in str(err) and time.monotonic() < deadline
                time.sleep(0.05)
        other.close()


def test_a_released_sessions_kv_slot_is_freed_without_the_garbage_collector():
    """Nothing the stream of rounds leaves behind holds a finished round's session: with the cyclic
    garbage collector off, a released session's KV slot is freed as soon as the last reference goes
    (a cycle through a round would keep every slot until the collector's next full pass: the
    verifier's memory grew for minutes under steady load)."""
    import gc
    import weakref

    with verifier_server() as (verifier, handle):
        client = VerifierClient(handle.address, timeout_s=30.0)
        gc.collect()
        gc.disable()
        try:
            client.prefill("s", PROMPTS[0])
            slot = weakref.ref(verifier._sessions["s"].cache)
            context = len(PROMPTS[0])
            for draft in (Draft((5, 6, 7), (-1, 0, 1)), Draft((5, 9, 6), (-1, -1, 0)), Draft()):
                context = client.verify("s", context, draft, GREEDY).context_len
            assert client._mux is not None  # the rounds went over the stream
            client.release("s")
            deadline = time.monotonic() + 5.0
            while slot() is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert slot() is None
        finally:
            gc.enable()
            client.close()

"""Replica routing and failover over real gRPC servers in this process (tiny preset): sessions go
to the least-loaded verifier replica, and a replica stopped or drained mid-generation costs a
re-prefill elsewhere, never a token: the stream equals the verifier's own greedy output. Drain:
health NOT_SERVING, new sessions refused with UNAVAILABLE, running calls finish."""

from __future__ import annotations

import contextlib
import threading

import grpc
import pytest

from specpipe.config.presets import ModelSpec
from specpipe.core.types import GenerationRequest, SpeculationOptions
from specpipe.engine.models import model_info, tiny_model, tiny_tokenizer
from specpipe.runtime import metrics
from specpipe.serving.clients import DrafterClient, GenerationClient, VerifierClient
from specpipe.serving.failover import ReplicatedDrafter, ReplicatedVerifier, drafter_probe, verifier_probe
from specpipe.serving.replicas import ReplicaSet, ReplicaSetConfig
from specpipe.serving.server import ServerConfig, serve
from tests.golden import reference_greedy
from tests.grpc_harness import wait_until

MAX_NEW_TOKENS = 60
SPEC = SpeculationOptions(drafter="model", draft_len=3, width=1, adaptive="off")
FAST = ReplicaSetConfig(refresh_s=0.05)
PROMPT = tuple(b"def fibonacci(n):")


@pytest.fixture(scope="module")
def reference():
    return reference_greedy(tiny_model(), PROMPT, MAX_NEW_TOKENS)


@contextlib.contextmanager
def replicas(verifiers: int, drafters: int, verifier_class=None, timeout_s: float = 10.0):
    """verifiers + drafters servers on free loopback ports, each over its own tiny model object;
    yields (verifier handles, drafter handles, a Generator routing over all of them)."""
    from drafter_service import servicer as drafter_servicer
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator.generator import Generator
    from verifier_service import servicer as verifier_servicer
    from verifier_service.verifier import ModelVerifier

    config = ServerConfig(port=0, grace_s=0.5, drain_timeout_s=5.0)
    with contextlib.ExitStack() as stack:
        v_models = [tiny_model() for _ in range(verifiers)]
        d_models = [tiny_model(2) for _ in range(drafters)]
        v_handles = [stack.enter_context(serve([verifier_servicer.service(
            (verifier_class or ModelVerifier)(m, model_info(ModelSpec("tiny"), m)))], config)) for m in v_models]
        d_handles = [stack.enter_context(serve([drafter_servicer.service(
            {"model": ModelDrafter(m, model_info(ModelSpec("tiny", 2), m))})], config)) for m in d_models]
        v_set = stack.enter_context(ReplicaSet(",".join(h.address for h in v_handles),
                                               lambda a: VerifierClient(a, timeout_s), verifier_probe, FAST))
        d_set = stack.enter_context(ReplicaSet(",".join(h.address for h in d_handles),
                                               lambda a: DrafterClient(a, 10.0), drafter_probe, FAST))
        verifier = ReplicatedVerifier(v_set)
        generator = Generator(tiny_tokenizer(), verifier, {"model": ReplicatedDrafter(d_set, "model")}, SPEC)
        yield v_handles, d_handles, generator


def holder(handles) -> int:
    """Index of the one verifier replica with an open session."""
    loads = [VerifierClient(h.address, 5.0).load().open_sessions for h in handles]
    assert sorted(loads) == [0] * (len(loads) - 1) + [1], loads
    return loads.index(1)


def failovers(reason: str) -> float:
    return metrics.VERIFIER_FAILOVERS.labels(reason=reason)._value.get()


def test_sessions_spread_over_the_least_loaded_replicas():
    with replicas(3, 1) as (v_handles, _, generator):
        verifier = generator.verifier
        for i in range(3):
            verifier.prefill(f"s{i}", PROMPT)
            verifier.replicas.refresh()
        assert [VerifierClient(h.address, 5.0).load().open_sessions for h in v_handles] == [1, 1, 1]
        for i in range(3):
            assert verifier.release(f"s{i}")


def test_a_new_client_reaches_a_replica_restarted_on_the_same_address():
    """A replica stopped, a call to it failed, then a new one on the same port: a client made now
    reaches it at once (grpcio's process-wide subchannel pool would hand the new channel the old
    peer's failed connection, and the call would fail with "Connection refused")."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from specpipe.serving.clients import channel

    def check(chan) -> None:
        health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5.0)

    with serve([], ServerConfig(port=0, grace_s=0)) as old:
        port = old.port
        stale = channel(old.address)
        check(stale)
    with pytest.raises(grpc.RpcError):
        check(stale)
    with serve([], ServerConfig(port=port, grace_s=0)) as new, channel(new.address) as fresh:
        check(fresh)
    stale.close()


@pytest.mark.parametrize("loss", ["stopped", "drained"])
def test_verifier_replica_lost_mid_generation_loses_no_token(reference, loss):
    with replicas(2, 2) as (v_handles, _, generator):
        before = failovers("unavailable") + failovers("draining")
        tokens, chunks = [], generator.generate(GenerationRequest(PROMPT, MAX_NEW_TOKENS, speculation=SPEC))
        tokens.extend(next(chunks).token_ids)
        lost = v_handles[holder(v_handles)]
        if loss == "stopped":
            lost.stop(grace_s=0)  # like a SIGKILL: the next verify finds nobody
        else:
            drainer = threading.Thread(target=lost.drain, args=(5.0,))
            drainer.start()
            assert wait_until(lambda: not generator.verifier.replicas.usable(lost.address))
        rest = [t for chunk in chunks for t in chunk.token_ids]
        assert rest, "the generation ended before the replica was lost"
        assert tokens + rest == reference
        assert failovers("unavailable") + failovers("draining") == before + 1
        if loss == "drained":
            drainer.join()
            assert lost.inflight == 0
            with VerifierClient(lost.address, 5.0) as client:  # no new sessions while draining
                assert client.health("") == "NOT_SERVING"
                with pytest.raises(Exception, match="draining"):
                    client.prefill("new", PROMPT)


def test_a_lost_drafter_costs_drafts_not_tokens(reference):
    with replicas(1, 2) as (_, d_handles, generator):
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW_TOKENS, speculation=SPEC))
        tokens = list(next(chunks).token_ids)
        for handle in d_handles:  # the preferred one first, then all: drafts stop, tokens go on
            handle.stop(grace_s=0)
            tokens += next(chunks).token_ids
        tokens += [t for chunk in chunks for t in chunk.token_ids]
        assert tokens == reference


def test_draining_orchestrator_finishes_its_streams_and_refuses_new_ones(reference):
    from orchestrator import servicer as generation_servicer

    with replicas(1, 1) as (_, _, generator):
        with serve([generation_servicer.service(generator)], ServerConfig(port=0, drain_timeout_s=30)) as server, \
                GenerationClient(server.address, timeout_s=30) as client:
            stream = client.generate(token_ids=PROMPT, max_new_tokens=MAX_NEW_TOKENS, speculation=SPEC)
            tokens = list(next(stream).token_ids)
            drained = []
            drainer = threading.Thread(target=lambda: drained.append(server.drain()))
            drainer.start()
            assert wait_until(lambda: server.draining)
            with pytest.raises(Exception, match="draining") as refused:
                list(client.generate(token_ids=PROMPT, max_new_tokens=4))
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE.name
            tokens += [t for chunk in stream for t in chunk.token_ids]
            drainer.join()
            assert tokens == reference and drained == [True]


def test_a_round_past_its_deadline_reopens_the_session_on_a_lone_replica(reference):
    """The lone verifier answers one round after the caller's deadline (the round ran there, the
    caller saw DEADLINE_EXCEEDED): the session is released there and re-prefilled from the context
    the orchestrator recorded, instead of failing on the session still open (FAILED_PRECONDITION)."""
    import time

    from verifier_service.verifier import ModelVerifier

    class LateOnce(ModelVerifier):
        """Its third round's forward takes 2.5 s (an overloaded verifier), on any transport."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            forward, rounds = self._scheduler._forward, []

            def late_once(segments):
                out = forward(segments)
                if any(s.logit_rows for s in segments):
                    rounds.append(1)
                    if len(rounds) == 3:
                        time.sleep(2.5)
                return out

            self._scheduler._forward = late_once

    with replicas(1, 1, LateOnce, timeout_s=1.0) as (_, _, generator):
        before = failovers("deadline_exceeded")
        tokens = [t for chunk in generator.generate(GenerationRequest(PROMPT, MAX_NEW_TOKENS, speculation=SPEC))
                  for t in chunk.token_ids]
        assert tokens == reference
        assert failovers("deadline_exceeded") == before + 1


def test_replicas_that_are_all_full_refuse_with_resource_exhausted_at_once():
    """Full is not down: the caller backs off (RESOURCE_EXHAUSTED, HTTP 429) without waiting out a reopen."""
    import functools

    from specpipe.core.errors import ResourceExhausted
    from verifier_service.verifier import ModelVerifier

    with replicas(2, 1, verifier_class=functools.partial(ModelVerifier, max_sessions=1)) as (_, _, generator):
        verifier = generator.verifier
        verifier.prefill("a", PROMPT)
        verifier.prefill("b", PROMPT)
        with pytest.raises(ResourceExhausted, match="full"):
            verifier.prefill("c", PROMPT)
        assert verifier.release("a") and verifier.release("b")

"""Session lifecycle (specpipe.runtime.lifecycle): the client's deadline reaches every internal call, idle
sessions are swept in the verifier and the drafter, a cancelled generation releases its sessions,
and a request without a seed gets its own (reported, and reproducible with it)."""

from __future__ import annotations

import pytest

from specpipe.core.errors import DeadlineExceeded, FailedPrecondition
from specpipe.core.types import GREEDY, Draft, GenerationRequest, ProposeRequest, SamplingParams, SpeculationOptions
from specpipe.runtime.lifecycle import (
    ContextPool,
    call_timeout,
    client_time_left,
    deadline_scope,
    freeze_startup_heap,
    idle,
    sweep_period,
)
from tests.grpc_harness import shared_tiny_cluster, wait_until

PROMPT = (10, 20, 30)


def test_idle_sessions():
    assert idle({"a": 0.0, "b": 5.0, "c": 9.5}, now=10.0, ttl_s=1.0) == ["a", "b"]
    assert idle({}, now=10.0, ttl_s=1.0) == []
    assert sweep_period(600) == 30.0 and sweep_period(0.2) == 0.05 and sweep_period(8) == 2.0


def test_the_start_up_heap_leaves_the_collectors_full_passes():
    """What is alive at the freeze is out of every generation the collector walks; what is made after
    is in one, so a cycle made while serving is still collected."""
    import gc

    before = [[]]  # a container: tracked by the collector
    try:
        frozen = freeze_startup_heap()
        after = [[]]
        walked = {id(o) for o in gc.get_objects()}
        assert frozen > 0 and gc.get_freeze_count() > 0  # (frozen objects freed since leave the count)
        assert id(before) not in walked and id(after) in walked
    finally:
        gc.unfreeze()


def test_call_timeout_is_the_shorter_of_its_own_and_the_scope():
    assert call_timeout(60.0, "x") == 60.0 and call_timeout(None, "x") is None  # no scope: its own
    with deadline_scope(5.0):
        assert 0 < call_timeout(60.0, "x") <= 5.0
        assert 0 < call_timeout(None, "x") <= 5.0
        assert call_timeout(1.0, "x") == 1.0
    with deadline_scope(None):
        assert call_timeout(60.0, "x") == 60.0
    with deadline_scope(-1.0), pytest.raises(DeadlineExceeded, match="deadline has passed"):
        call_timeout(60.0, "verify")


def test_a_call_without_a_deadline_has_no_time_limit():
    assert client_time_left(9.223372035059168e18) is None  # what grpc reports for a call without one
    assert client_time_left(None) is None and client_time_left(5.0) == 5.0 and client_time_left(0.0) == 0.0


def test_the_deadline_reaches_the_branch_schedules_threads():
    with ContextPool(max_workers=2) as pool:
        with deadline_scope(5.0):
            inside = pool.submit(call_timeout, 60.0, "x").result()
        outside = pool.submit(call_timeout, 60.0, "x").result()
    assert 0 < inside <= 5.0 and outside == 60.0


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


def test_a_client_with_no_time_left_makes_no_internal_call(cluster):
    with deadline_scope(-1.0):
        for call in (cluster.verifier_client.info, cluster.drafter_client.info,
                     lambda: cluster.verifier_client.prefill("late", PROMPT)):
            with pytest.raises(DeadlineExceeded):
                call()
    with pytest.raises(FailedPrecondition, match="unknown session"):  # the prefill never reached the verifier
        cluster.verifier.verify("late", len(PROMPT), Draft(), GREEDY)


class DeadlineSpy:
    """A stub method that records the deadline each call is given, then makes the real call."""

    def __init__(self, method):
        self.method, self.timeouts = method, []

    def __call__(self, request, timeout=None, **kwargs):
        self.timeouts.append(timeout)
        return self.method(request, timeout=timeout, **kwargs)

    def future(self, request, timeout=None, **kwargs):
        self.timeouts.append(timeout)
        return self.method.future(request, timeout=timeout, **kwargs)


def test_a_prefill_has_the_clients_deadline_only_and_a_round_the_per_call_one(cluster):
    """A prefill's time grows with the prompt and the verifier's load: a per-call deadline shorter
    than it must not fail it (nor mark a busy verifier as down); a verify round keeps its own."""
    from specpipe.serving.clients import VerifierClient

    with VerifierClient(cluster.verifier_server.address, timeout_s=1e-6) as streamed:  # a round on the stream too
        streamed.prefill("streamed", PROMPT)
        with pytest.raises(DeadlineExceeded):
            streamed.verify("streamed", len(PROMPT), Draft(tokens=(5,), parents=(-1,)), GREEDY)
    with VerifierClient(cluster.verifier_server.address, timeout_s=1e-6, stream=False) as hasty:
        hasty._stub.Prefill = prefill = DeadlineSpy(hasty._stub.Prefill)
        hasty._stub.Verify = verify = DeadlineSpy(hasty._stub.Verify)
        try:
            assert hasty.prefill("long-prompt", tuple(1 + i % 250 for i in range(400))) == 400
            try:  # grpc counts deadlines in whole ms, so a round on loopback may still beat 1 us
                hasty.verify("long-prompt", 400, Draft(tokens=(5,), parents=(-1,)), GREEDY)
            except DeadlineExceeded:
                pass
            assert prefill.timeouts == [None] and verify.timeouts == [1e-6]
            with deadline_scope(5.0):  # the client's deadline bounds a prefill
                assert hasty.prefill("scoped", PROMPT) == len(PROMPT)
            assert 0 < prefill.timeouts[-1] <= 5.0
            with deadline_scope(-1.0), pytest.raises(DeadlineExceeded):  # and ends it
                hasty.prefill("late", PROMPT)
            assert len(prefill.timeouts) == 2  # no call was made
        finally:
            for session in ("long-prompt", "scoped"):
                cluster.verifier.release(session)


def test_idle_sessions_are_swept_in_the_verifier_and_the_drafter():
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.config.presets import ModelSpec
    from specpipe.engine.models import model_info, tiny_model
    from verifier_service.verifier import ModelVerifier

    model = tiny_model(1)
    verifier = ModelVerifier(model, model_info(ModelSpec("tiny", 1), model), session_ttl_s=0.2, batching=False)
    drafter = ModelDrafter(model, model_info(ModelSpec("tiny", 1), model), session_ttl_s=0.2)
    verifier.prefill("idle", PROMPT)
    drafter.propose(ProposeRequest("idle", PROMPT, 2))
    assert "idle" in drafter._sessions

    def verifier_forgot() -> bool:
        try:
            verifier.verify("idle", len(PROMPT), Draft(), GREEDY)
        except FailedPrecondition as err:
            return "unknown session" in str(err)
        return False

    assert wait_until(verifier_forgot, timeout_s=10.0)  # no new session arrived: the sweeper did it
    assert wait_until(lambda: "idle" not in drafter._sessions, timeout_s=10.0)


def test_a_cancelled_generation_releases_its_sessions(cluster):
    spec = SpeculationOptions(drafter="model", draft_len=2, adaptive="off")
    chunks = cluster.generation_client.generate(token_ids=PROMPT, max_new_tokens=200, speculation=spec,
                                                request_id="cancelled")
    next(chunks)
    chunks.close()  # the client goes away mid-stream
    assert wait_until(lambda: not any(s.startswith("cancelled") for s in cluster.verifier._sessions), 10.0)
    assert wait_until(lambda: not any(s.startswith("cancelled") for s in cluster.drafter._sessions), 10.0)


SAMPLED = SamplingParams(temperature=1.0)


def sample(generate, seed: int) -> tuple[tuple[int, ...], int]:
    chunks = list(generate(SamplingParams(temperature=1.0, seed=seed)))
    seeds = {c.seed for c in chunks}
    assert len(seeds) == 1  # every chunk reports the one seed
    return sum((c.token_ids for c in chunks), ()), seeds.pop()


@pytest.mark.parametrize("path", ["embedded", "grpc"])
def test_a_request_without_a_seed_gets_its_own(cluster, path):
    spec = SpeculationOptions(drafter="model", draft_len=3, adaptive="off")
    if path == "grpc":
        def generate(sampling):
            return cluster.generation_client.generate(token_ids=PROMPT, max_new_tokens=24, sampling=sampling,
                                                      speculation=spec)
    else:
        def generate(sampling):
            return cluster.generator.generate(GenerationRequest(PROMPT, 24, sampling=sampling, speculation=spec))

    runs = [sample(generate, 0) for _ in range(3)]
    assert all(seed != 0 for _, seed in runs)
    assert len({seed for _, seed in runs}) == 3
    assert len({tokens for tokens, _ in runs}) > 1  # 24 tokens at temperature 1 over 256 ids: distinct samples
    tokens, seed = runs[0]
    assert sample(generate, seed) == (tokens, seed)  # the reported seed reproduces the sample
    assert sample(generate, 42)[1] == 42
    greedy = list(generate(GREEDY))
    assert {c.seed for c in greedy} == {0}


LONG_PROMPT = tuple(range(1, 256)) * 7  # 1785 tokens: about 900 prefill chunks of 2 tokens


def chunky_verifier():
    """A tiny verifier that prefills in 2-token chunks, so a long prompt takes about 900 forwards."""
    from specpipe.config.presets import ModelSpec
    from specpipe.config.services import BatchConfig
    from specpipe.engine.models import model_info, tiny_model
    from verifier_service.verifier import ModelVerifier

    model = tiny_model(1)
    return ModelVerifier(model, model_info(ModelSpec("tiny", 1), model), batch=BatchConfig(prefill_chunk=2))


def prefills_done() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("specpipe_prefill_ms_count") or 0.0


def test_a_prefill_whose_caller_left_stops_between_chunks():
    import threading

    from specpipe.core.errors import Cancelled
    from specpipe.runtime.lifecycle import Cancellation, cancel_scope

    verifier = chunky_verifier()
    cancellation, done = Cancellation(), prefills_done()
    threading.Timer(0.1, cancellation.cancel).start()
    with cancel_scope(cancellation), pytest.raises(Cancelled, match="caller went away"):
        verifier.prefill("left", LONG_PROMPT)
    assert "left" not in verifier._sessions and prefills_done() == done
    assert verifier.serving_load().queued == 0
    verifier.prefill("stayed", LONG_PROMPT[:40])  # the verifier goes on serving
    assert prefills_done() == done + 1


def test_a_generate_cancelled_during_its_prefill_frees_the_verifier_at_once():
    """Client -> orchestrator -> verifier over gRPC: the client cancels while the verifier prefills;
    the orchestrator's Prefill call is cancelled, the verifier drops the remaining chunks and the
    session is gone at once, not when the prefill would have ended or the sweeper came by."""
    import time

    from orchestrator import servicer as generation_servicer
    from orchestrator.generator import Generator
    from specpipe.engine.models import tiny_tokenizer
    from specpipe.serving import convert
    from specpipe.serving.clients import VerifierClient, channel
    from specpipe.serving.server import ServerConfig, serve
    from specpipe.v1 import generation_pb2_grpc
    from verifier_service import servicer as verifier_servicer

    verifier = chunky_verifier()
    config = ServerConfig(port=0, grace_s=0)
    with serve([verifier_servicer.service(verifier)], config) as verifier_server, \
            VerifierClient(verifier_server.address, 60.0) as verifier_client:
        generator = Generator(tiny_tokenizer(), verifier_client, {}, SpeculationOptions(drafter="none"))
        with serve([generation_servicer.service(generator)], config) as server:
            stub = generation_pb2_grpc.GenerationStub(channel(server.address))
            request = convert.generate_request_to_proto(convert.GenerateInput(token_ids=LONG_PROMPT), 4, "left",
                                                        (), GREEDY, None)
            done = prefills_done()
            call = stub.Generate(request, timeout=60)
            assert wait_until(lambda: any(not s.ready for s in list(verifier._sessions.values())), 10.0)
            call.cancel()
            cancelled_at = time.monotonic()
            assert wait_until(lambda: not verifier._sessions and verifier.serving_load().queued == 0, 5.0)
            freed_s = time.monotonic() - cancelled_at
    assert prefills_done() == done  # the prefill never finished: its remaining chunks were dropped
    assert freed_s < 1.0, freed_s  # (the whole prefill takes several seconds)

"""Admission and backpressure over real gRPC servers (tiny preset): beyond --max-sessions /
--max-queue the verifier and the orchestrator answer RESOURCE_EXHAUSTED before any work, and the
health service still answers while every generation slot is taken."""

from __future__ import annotations

import contextlib
import pathlib
import threading

import pytest

from orchestrator.admission import Admission, AdmissionConfig
from orchestrator.generator import Generator
from specpipe.config.presets import ModelSpec
from specpipe.core.errors import DeadlineExceeded, ResourceExhausted
from specpipe.core.types import SpeculationOptions
from specpipe.engine.models import model_info, tiny_model, tiny_tokenizer
from specpipe.serving.clients import GenerationClient, VerifierClient
from specpipe.serving.server import ServerConfig, serve
from tests.grpc_harness import assert_serving, wait_until
from verifier_service.verifier import ModelVerifier

CONFIG = ServerConfig(host="127.0.0.1", port=0, grace_s=1.0)


def test_admission_queues_then_refuses():
    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=1))
    entered = threading.Event()
    with admission.slot():
        def queued():
            with admission.slot(timeout_s=10):
                entered.set()

        waiter = threading.Thread(target=queued)
        waiter.start()
        while admission.waiting == 0:  # the second stream is queued
            threading.Event().wait(0.01)
        with pytest.raises(ResourceExhausted, match=r"1 generations running \(max 1\) and 1 waiting \(max 1\)"), \
                admission.slot():
            pass
        assert not entered.is_set()
    waiter.join()
    assert entered.is_set()  # the queued stream ran once the slot freed


@contextlib.contextmanager
def orchestrator(verifier, admission: Admission, timeout_s: float | None):
    """An orchestrator server over the verifier (no drafter) with these slots, and a client of it."""
    from orchestrator import servicer

    generator = Generator(tiny_tokenizer(), ModelVerifier(verifier.model, verifier.info()), {},
                          SpeculationOptions(drafter="none"))
    with serve([servicer.service(generator, admission)], CONFIG) as server, \
            GenerationClient(server.address, timeout_s=timeout_s) as client:
        yield client


def test_a_stream_without_a_deadline_queues_until_a_slot_frees(verifier):
    """A client that sets no deadline (grpc: about 9.2e18 s left) waits in the queue, then runs."""
    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=1))
    with orchestrator(verifier, admission, timeout_s=None) as client:
        first = client.generate(token_ids=[1, 2, 3], max_new_tokens=1500)
        next(first)  # running: it holds the only slot
        queued: list = []
        waiter = threading.Thread(target=lambda: queued.extend(client.generate(token_ids=[4, 5], max_new_tokens=4)))
        waiter.start()
        assert wait_until(lambda: admission.waiting == 1, timeout_s=10), "the second stream was not queued"
        first.close()
        waiter.join(timeout=60)
        assert sum(len(chunk.token_ids) for chunk in queued) == 4


def test_a_queued_stream_waits_no_longer_than_its_deadline():
    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=4))
    with admission.slot(), pytest.raises(DeadlineExceeded), admission.slot(timeout_s=0.05):
        pass
    with admission.slot():  # both slots were given back
        pass


@pytest.fixture(scope="module")
def verifier():
    model = tiny_model()
    return ModelVerifier(model, model_info(ModelSpec("tiny"), model), max_sessions=1)


def test_verifier_over_max_sessions_is_resource_exhausted_over_grpc(verifier):
    from verifier_service import servicer

    with serve([servicer.service(verifier)], CONFIG) as server, \
            VerifierClient(server.address, timeout_s=10) as client:
        assert client.prefill("one", [1, 2, 3]) == 3
        with pytest.raises(ResourceExhausted, match=r"1 open sessions \(max 1\)"):
            client.prefill("two", list(range(100)))
        assert client.release("one")
        assert client.prefill("two", [4, 5]) == 2
        client.release("two")
        assert_serving(client)


def test_orchestrator_refuses_streams_beyond_its_slots_and_health_answers(verifier):
    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=0))
    with orchestrator(verifier, admission, timeout_s=60) as client:
        long_stream = client.generate(token_ids=[1, 2, 3], max_new_tokens=1500)
        next(long_stream)  # running: it holds the only slot
        with pytest.raises(ResourceExhausted, match="orchestrator is full"):
            list(client.generate(token_ids=[4, 5], max_new_tokens=4))
        assert_serving(client)
        long_stream.close()


# --- one queue for both APIs: threads (gRPC) and the event loop (HTTP) ------------------------------

def test_a_freed_slot_passes_to_the_first_waiter_whichever_api():
    """FIFO across thread and event-loop waiters; the queue depth counts both; full means full for both."""
    import asyncio

    from specpipe.runtime import metrics

    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=2))
    order: list[str] = []
    depth = metrics.QUEUE_DEPTH.labels(role="orchestrator")

    async def scenario():
        first = admission.admit()
        thread_waiter = asyncio.get_running_loop().run_in_executor(None, lambda: admission.admit(timeout_s=10))
        while admission.waiting < 1:
            await asyncio.sleep(0.005)
        loop_waiter = asyncio.ensure_future(admission.admit_async(timeout_s=10))
        while admission.waiting < 2:
            await asyncio.sleep(0.005)
        assert depth._value.get() == 2
        with pytest.raises(ResourceExhausted):  # a third waiter, from either side
            await admission.admit_async()
        with pytest.raises(ResourceExhausted):
            admission.admit()
        first.release()
        second = await thread_waiter  # the thread came first
        order.append("thread")
        assert not loop_waiter.done() and admission.running == 1
        second.release()
        third = await loop_waiter
        order.append("loop")
        third.release()
        third.release()  # idempotent

    asyncio.run(scenario())
    assert order == ["thread", "loop"] and admission.running == 0 and admission.waiting == 0
    assert depth._value.get() == 0


def test_a_waiter_that_leaves_the_queue_frees_its_place():
    """An HTTP client that disconnects while queued (its task cancelled), a gRPC client that cancels:
    neither holds a place nor a slot afterwards."""
    import asyncio

    from specpipe.core.errors import Cancelled
    from specpipe.runtime.lifecycle import Cancellation

    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=1))

    async def scenario():
        held = admission.admit()
        waiter = asyncio.ensure_future(admission.admit_async())
        while admission.waiting < 1:
            await asyncio.sleep(0.005)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert admission.waiting == 0
        cancellation = Cancellation()
        asyncio.get_running_loop().call_later(0.05, cancellation.cancel)
        with pytest.raises(Cancelled):
            await asyncio.to_thread(admission.admit, None, cancellation)
        assert admission.waiting == 0
        held.release()

    asyncio.run(scenario())
    assert admission.running == 0
    with admission.slot():  # the one slot is free
        assert admission.running == 1


def test_up_hands_admission_caps_and_http_bounds_to_its_orchestrator():
    """`specpipe up --max-sessions ... --limit-... --http-...`: the orchestrator it starts is configured so."""
    from specpipe.cli.main import build_parser
    from specpipe.cli.up_cmd import up_config
    from specpipe.config.services import orchestrator_config

    up = build_parser().parse_args(["up", "--preset", "tiny", "--max-sessions", "3", "--max-queue", "0",
                                    "--limit-new-tokens", "99", "--http-header-timeout", "2.5",
                                    "--http-max-connections", "7"])
    flags = up_config(vars(up), pathlib.Path(".")).speculation
    served = build_parser().parse_args(["serve", "orchestrator", "--verifier-addr", "127.0.0.1:1", *flags])
    config = orchestrator_config(vars(served))
    assert (config.admission.max_sessions, config.admission.max_queue) == (3, 0)
    assert config.limits.max_new_tokens == 99
    assert (config.http.header_timeout_s, config.http.max_connections) == (2.5, 7)


def test_up_gives_its_verifiers_room_for_every_orchestrators_sessions():
    """Two orchestrators of 64 sessions each over one verifier of 64 refused the 65th session's prefill: the
    verifiers `up` starts take every orchestrator's sessions, unless --verifier-flags caps them itself."""
    from specpipe.cli.main import build_parser
    from specpipe.cli.up_cmd import up_config
    from specpipe.config.services import verifier_config

    def served(*up_args: str) -> int:
        up = build_parser().parse_args(["up", "--preset", "tiny", *up_args])
        flags = up_config(vars(up), pathlib.Path(".")).verifier_flags
        return verifier_config(vars(build_parser().parse_args(["serve", "verifier", *flags]))).max_sessions

    assert served("--orchestrators", "2", "--max-sessions", "64") == 128
    assert served("--max-sessions", "3") == 3
    assert served("--orchestrators", "3", "--verifier-flags=--max-sessions=10 --gather-grace 0") == 10

"""Faults, with real servers, a real redis-server and a TCP proxy for slow or partitioned links
(tests/link_proxy.py): what the client sees, and that no token is lost or changed (the output equals
the verifier's own greedy output). docs/security.md tabulates them."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from specpipe.core.errors import ResourceExhausted
from specpipe.core.types import GenerationRequest, SpeculationOptions
from tests.golden import reference_greedy
from tests.link_proxy import LinkProxy
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
        assert store.update_global([1, 2, 3, 4, 5]) == 5  # the restarted server serves the same client


def test_drafter_killed_mid_generation(reference, tiny_tokenizer, tiny_verifier, tiny_drafter):
    from drafter_service import servicer
    from orchestrator.generator import Generator
    from specpipe.serving.clients import DrafterClient
    from specpipe.serving.server import ServerConfig, serve

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
    from specpipe.serving.clients import GenerationClient
    from specpipe.serving.server import ServerConfig, serve

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


def verifier_server(port: int = 0):
    """A verifier service on loopback over a fresh ModelVerifier of the tiny preset: a restart on the
    same port forgets every session, as a new process would."""
    from specpipe.config.presets import model_specs
    from specpipe.serving.server import ServerConfig, serve
    from verifier_service import servicer
    from verifier_service.verifier import ModelVerifier

    return serve([servicer.service(ModelVerifier.load(model_specs("tiny")[0]))], ServerConfig(port=port, grace_s=0))


def test_lone_verifier_killed_and_restarted_mid_generation(reference, tiny_tokenizer, tiny_drafter):
    """One verifier, stopped after round 1 and back on its port 0.5 s later with no sessions: the
    session is re-prefilled on it from the orchestrator's context (specpipe.serving.failover) and the stream
    goes on, every token exact."""
    from orchestrator.generator import Generator
    from specpipe.runtime import metrics
    from specpipe.serving.clients import VerifierClient
    from specpipe.serving.failover import ReplicatedVerifier, verifier_probe
    from specpipe.serving.replicas import ReplicaSet, ReplicaSetConfig

    spec = SpeculationOptions(drafter="model", draft_len=4, adaptive="off")
    first = verifier_server()
    restarted: list = []

    def kill_and_restart():
        first.stop(grace_s=0)
        threading.Timer(0.5, lambda: restarted.append(verifier_server(first.port))).start()

    moved = metrics.VERIFIER_FAILOVERS.labels(reason="unavailable")._value.get()
    try:
        with ReplicaSet(first.address, lambda a: VerifierClient(a, 5.0), verifier_probe,
                        ReplicaSetConfig(refresh_s=0.1)) as replicas:
            generator = Generator(tiny_tokenizer, ReplicatedVerifier(replicas), {"model": tiny_drafter}, spec)
            chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
            tokens = stream_with_faults(chunks, {1: kill_and_restart})
    finally:
        for server in [first, *restarted]:
            server.stop(grace_s=0)
    assert tokens == reference
    assert restarted and metrics.VERIFIER_FAILOVERS.labels(reason="unavailable")._value.get() > moved


def test_lone_verifier_gone_for_good_fails_with_unavailable(tiny_tokenizer, reference):
    """Not back within the re-prefill's wait: UNAVAILABLE, after only verified tokens."""
    from orchestrator.generator import Generator
    from specpipe.core.errors import Unavailable
    from specpipe.serving.clients import VerifierClient
    from specpipe.serving.failover import ReplicatedVerifier, verifier_probe
    from specpipe.serving.replicas import ReplicaSet

    spec = SpeculationOptions(drafter="none", adaptive="off")
    server = verifier_server()
    tokens: list[int] = []
    with ReplicaSet(server.address, lambda a: VerifierClient(a, 5.0), verifier_probe) as replicas:
        generator = Generator(tiny_tokenizer, ReplicatedVerifier(replicas, reopen_wait_s=0.5), {}, spec)
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        with pytest.raises(Unavailable, match="no verifier replica"):
            for i, chunk in enumerate(chunks, 1):
                tokens += chunk.token_ids
                if i == 2:
                    server.stop(grace_s=0)
    assert len(tokens) == 2 and tokens == reference[:2]  # what came was exact; then a clear failure


def cache_service(store=None, port: int = 0):
    """`specpipe serve cache` in this process: the cache servicer over an in-memory store."""
    from cache_service import servicer
    from cache_service.memory import InMemoryNgramCache
    from specpipe.serving.server import ServerConfig, serve

    return serve([servicer.service(store or InMemoryNgramCache())], ServerConfig(port=port, grace_s=0))


def test_cache_service_killed_mid_generation(reference, tiny_tokenizer, tiny_verifier, tiny_drafter):
    """The n-gram store is a cache service (grpc://); it dies after round 1: hybrid drafts go on from
    the small model and the context alone."""
    from cache_service.stores import open_store
    from drafter_service.hybrid import HybridDrafter
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator

    spec = SpeculationOptions(drafter="hybrid", draft_len=4, width=2, adaptive="off")
    server = cache_service()
    store = open_store(f"grpc://{server.address}", timeout_s=0.5)
    ngram = NgramDrafter(store, tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, {"hybrid": HybridDrafter(tiny_drafter, ngram)}, spec, store)
    try:
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        tokens = stream_with_faults(chunks, {1: lambda: server.stop(grace_s=0)})
    finally:
        server.stop(grace_s=0)
    assert tokens == reference


def test_slow_links_to_the_drafter_and_the_cache(reference, tiny_tokenizer, tiny_verifier, tiny_drafter):
    """20 ms added to every chunk of bytes, each way, on the links to the drafter service and the
    cache service: slower, the same output."""
    from cache_service.stores import open_store
    from drafter_service import servicer
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator
    from specpipe.serving.clients import DrafterClient
    from specpipe.serving.server import ServerConfig, serve

    with contextlib.ExitStack() as stack:
        drafter_server = stack.enter_context(serve([servicer.service({"model": tiny_drafter})],
                                                   ServerConfig(port=0, grace_s=0)))
        cache_server = stack.enter_context(cache_service())
        drafter_link = stack.enter_context(LinkProxy(drafter_server.port, delay_s=0.02))
        cache_link = stack.enter_context(LinkProxy(cache_server.port, delay_s=0.02))
        drafter = stack.enter_context(DrafterClient(drafter_link.address, timeout_s=5.0))
        store = open_store(f"grpc://{cache_link.address}", timeout_s=5.0)
        drafters = {"model": drafter, "ngram": NgramDrafter(store, tiny_verifier.info())}
        generator = Generator(tiny_tokenizer, tiny_verifier, drafters, SpeculationOptions(), store)
        for kind in ("model", "ngram"):
            spec = SpeculationOptions(drafter=kind, draft_len=4, adaptive="off", schedule="branch")
            tokens = [t for c in generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
                      for t in c.token_ids]
            assert tokens == reference, kind


def test_partitioned_drafter_costs_only_its_timeout(reference, tiny_tokenizer, tiny_verifier, tiny_drafter):
    """The link to the drafter service turns into a blackhole after round 1 (no refusal: bytes just
    vanish). The next draft times out (0.3 s), the replica is marked failed and skipped until a probe
    answers, and the remaining rounds verify without a draft: the same output, not ~40 timeouts."""
    from drafter_service import servicer
    from orchestrator.generator import Generator
    from specpipe.serving.clients import DrafterClient
    from specpipe.serving.failover import ReplicatedDrafter, drafter_probe
    from specpipe.serving.replicas import ReplicaSet, ReplicaSetConfig
    from specpipe.serving.server import ServerConfig, serve

    spec = SpeculationOptions(drafter="model", draft_len=4, adaptive="off")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            serve([servicer.service({"model": tiny_drafter})], ServerConfig(port=0, grace_s=0))
        )
        link = stack.enter_context(LinkProxy(server.port))
        replicas = stack.enter_context(ReplicaSet(link.address, lambda a: DrafterClient(a, 0.3), drafter_probe,
                                                  ReplicaSetConfig(refresh_s=0.1)))
        generator = Generator(tiny_tokenizer, tiny_verifier, {"model": ReplicatedDrafter(replicas, "model")}, spec)
        start = time.monotonic()
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        stats: list = []
        tokens = stream_with_faults((stats.append(c.round) or c for c in chunks), {1: link.partition})
        elapsed = time.monotonic() - start
    assert tokens == reference
    assert sum(s.drafted == 0 for s in stats) >= 10  # the rounds after the partition: no draft
    assert elapsed < 6.0, elapsed  # ~39 rounds with a 0.3 s timeout each would take 12 s more


def test_partitioned_cache_service_costs_one_timeout_per_pause(reference, tiny_tokenizer, tiny_verifier):
    """The link to the cache service turns into a blackhole after round 1: the n-gram drafter's next
    lookup and the orchestrator's next write time out (0.3 s), then each skips the store for a pause
    that doubles (specpipe.runtime.breaker), so 40 tokens cost about one timeout each, not one per round;
    drafts come from the context alone."""
    from cache_service.stores import open_store
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator
    from specpipe.runtime import metrics

    def failures() -> dict[str, float]:
        return {call: metrics.CACHE_FAILURES.labels(call=call)._value.get()
                for call in ("lookup", "record_branches", "release")}

    spec = SpeculationOptions(drafter="ngram", draft_len=4, adaptive="off")
    before = failures()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(cache_service())
        link = stack.enter_context(LinkProxy(server.port))
        store = open_store(f"grpc://{link.address}", timeout_s=0.3)
        store.update_global([1, 2, 3])  # connected before the partition: its calls then time out, not fail fast
        generator = Generator(tiny_tokenizer, tiny_verifier, {"ngram": NgramDrafter(store, tiny_verifier.info())},
                              spec, store)
        start = time.monotonic()
        chunks = generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec))
        tokens = stream_with_faults(chunks, {1: link.partition})
        elapsed = time.monotonic() - start
    assert tokens == reference
    timeouts = {call: n - before[call] for call, n in failures().items()}
    # one timeout, then one probe per pause (0.5 s, 1 s, 2 s, ...), not one per round (~23 of each)
    assert 1 <= timeouts["lookup"] <= 4 and 1 <= timeouts["record_branches"] + timeouts["release"] <= 4, timeouts
    assert elapsed < 5.0, elapsed  # a 0.3 s timeout on each of ~23 lookups and ~23 writes would take 14 s


def test_breaker_pauses_double_and_reset():
    from specpipe.runtime.breaker import Breaker, BreakerConfig, pause_after

    config = BreakerConfig(first_pause_s=0.5, max_pause_s=3.0)
    assert [pause_after(n, config) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    now = [100.0]
    breaker = Breaker(config, clock=lambda: now[0])
    assert breaker.allows()
    breaker.failed()
    assert not breaker.allows()
    now[0] += 0.5
    assert breaker.allows()  # the probe
    breaker.failed()
    now[0] += 0.9
    assert not breaker.allows()  # the second pause is 1 s
    breaker.succeeded()
    assert breaker.allows()


@pytest.mark.slow  # two verifier processes start (imports and the model): 10-40 s on a shared 2-core machine
def test_lone_verifier_process_sigkilled_and_restarted(reference, tiny_tokenizer, tiny_drafter, tmp_path):
    """As above with real processes: `specpipe serve verifier` SIGKILLed after round 1 and started
    again on its port. The session waits (a re-prefill retried for up to 120 s here) and goes on."""
    import subprocess
    import sys

    from orchestrator.generator import Generator
    from specpipe.app.topology import READY_RE
    from specpipe.devtools.local_redis import free_port
    from specpipe.serving.clients import VerifierClient
    from specpipe.serving.failover import ReplicatedVerifier, verifier_probe
    from specpipe.serving.replicas import ReplicaSet, ReplicaSetConfig
    from tests.test_contract_generation import ROOT

    port = free_port()

    def start(name: str) -> subprocess.Popen:
        out = open(tmp_path / f"{name}.out", "wb")  # noqa: SIM115 (the child writes it)
        return subprocess.Popen([sys.executable, "-m", "specpipe.cli.main", "serve", "verifier", "--preset", "tiny",
                                 "--port", str(port), "--log-level", "WARNING", "--verifier-weights", "fp32"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # fp32: the eager reference's model

    def ready(name: str) -> bool:
        return any(READY_RE.match(line) for line in (tmp_path / f"{name}.out").read_text(errors="replace").splitlines())

    processes = [start("first")]
    try:
        deadline = time.monotonic() + 120
        while not ready("first"):
            assert processes[0].poll() is None and time.monotonic() < deadline, "the verifier did not start"
            time.sleep(0.1)

        def kill_and_restart():
            processes[0].kill()
            processes[0].wait()
            processes.append(start("second"))

        spec = SpeculationOptions(drafter="model", draft_len=4, adaptive="off")
        with ReplicaSet(f"127.0.0.1:{port}", lambda a: VerifierClient(a, 10.0), verifier_probe,
                        ReplicaSetConfig(refresh_s=0.2)) as replicas:
            verifier = ReplicatedVerifier(replicas, reopen_wait_s=120.0)
            generator = Generator(tiny_tokenizer, verifier, {"model": tiny_drafter}, spec)
            tokens = stream_with_faults(generator.generate(GenerationRequest(PROMPT, MAX_NEW, speculation=spec)),
                                        {1: kill_and_restart})
        assert tokens == reference and len(processes) == 2
    finally:
        for process in processes:
            process.kill()
            process.wait()

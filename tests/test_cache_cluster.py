"""The n-gram store on a real Redis Cluster (specpipe.devtools.local_cluster: 3 masters, 1 replica each, on
loopback): open_store("redis+cluster://...") gives the in-memory store's results for sessions and
tenants spread over every master; a killed master costs the calls on its slots a bounded time, then
Unavailable, and the client follows the failover to the promoted replica on its own; a generation
whose store loses a master mid-way equals the verifier's own greedy output."""

from __future__ import annotations

import os
import random
import time
from typing import Iterator

import pytest
from redis.cluster import RedisCluster

from cache_service.cluster import RETRIES, connect_cluster
from cache_service.memory import InMemoryNgramCache
from cache_service.stores import open_store
from specpipe.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from specpipe.core.ngram import NgramConfig
from specpipe.core.types import GenerationRequest, SpeculationOptions
from specpipe.devtools import local_cluster
from specpipe.devtools.local_cluster import LocalCluster
from tests.golden import GOLDEN_PROMPTS, reference_greedy, run

TIMEOUT_S = 0.5  # of each store call (socket timeouts): a dead master costs at most (RETRIES + 1) of them
SESSIONS = [f"cluster-{i}" for i in range(24)]
TENANTS = ["", "acme", "globex", "initech", "umbrella", "hooli"]  # "" = the default tenant ({g})
VOCAB = 6  # small: many hits, many LRU evictions


def start_cluster() -> LocalCluster:
    try:
        return local_cluster.start()
    except FailedPrecondition as err:  # no redis-server or redis-cli
        if os.environ.get("CI"):  # .ci/run installs them: in CI a missing server is a failure, not a skip
            raise
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One cluster for the tests that kill nothing."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own, for a test that kills a master."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


def master_of(client: RedisCluster, hash_tag: str) -> int:
    """The port of the master serving the slot of a hash tag ("{s:<id>}", "{g:<tenant>}", "{g}")."""
    return client.get_node_from_key(hash_tag).port


def session_tag(session_id: str) -> str:
    return f"{{s:{session_id}}}"


def tenant_tag(tenant: str) -> str:
    return f"{{g:{tenant}}}" if tenant else "{g}"


def name_on(client: RedisCluster, port: int, prefix: str, tag) -> str:
    """The first of prefix0, prefix1, ... whose hash tag lies on the master at port (of 100,000: a
    master serves a third of the slots, so a miss means the client sees another cluster)."""
    found = next(
        (name for name in (f"{prefix}{i}" for i in range(100_000)) if master_of(client, tag(name)) == port), None
    )
    assert found is not None, f"no hash slot on {port} in the client's view {client.get_nodes()}"
    return found


def both(stores, method: str, *args):
    """The same call on every store; their results must be equal."""
    results = [getattr(store, method)(*args) for store in stores]
    assert all(result == results[0] for result in results), (method, args, results)
    return results[0]


def timed(call, *args) -> tuple[float, Exception | None]:
    """(seconds, the exception raised or None)."""
    start = time.perf_counter()
    try:
        call(*args)
    except Exception as err:
        return time.perf_counter() - start, err
    return time.perf_counter() - start, None


def test_cluster_urls():
    with pytest.raises(InvalidArgument, match="database 0"):
        open_store("redis+cluster://127.0.0.1:1/3")
    with pytest.raises(Unavailable, match="cannot be connected") as raised:  # nothing listens on port 1
        open_store("rediss+cluster://user:secret@127.0.0.1:1", timeout_s=0.2)
    assert "secret" not in str(raised.value)


def test_three_masters_with_a_replica_each(cluster):
    assert len(cluster.masters()) == 3 and len(cluster.replicas()) == 3
    assert sorted(cluster.masters() + cluster.replicas()) == sorted(cluster.nodes)


@pytest.mark.parametrize("config", [NgramConfig(), NgramConfig(use_global=False)], ids=["default", "no-global"])
def test_lookups_equal_the_in_memory_store_over_every_master(cluster, config):
    """Random token streams for 24 sessions of 6 tenants, whose hash tags lie on all 3 masters:
    every lookup, record_branches, update_global and release returns what the in-memory store does."""
    client = connect_cluster(cluster.url, TIMEOUT_S)
    client.flushall()
    stores, rng = [InMemoryNgramCache(config), open_store(cluster.url, config, TIMEOUT_S)], random.Random(7)
    masters = set(cluster.masters())
    assert {master_of(client, session_tag(sid)) for sid in SESSIONS} == masters
    assert {master_of(client, tenant_tag(tenant)) for tenant in TENANTS} == masters
    contexts: dict[str, list[int]] = {sid: [] for sid in SESSIONS}
    for step in range(600):
        i = rng.randrange(len(SESSIONS))
        sid, tenant, action = SESSIONS[i], TENANTS[i % len(TENANTS)], rng.random()
        if action < 0.3:
            contexts[sid].extend(rng.randrange(VOCAB) for _ in range(rng.randint(1, 5)))
        elif action < 0.45:
            branches = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 7))] for _ in range(rng.randint(1, 3))]
            both(stores, "record_branches", sid, branches)
        elif action < 0.55:
            both(stores, "update_global", [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))], tenant)
        elif action < 0.57:
            both(stores, "release", sid)
            contexts[sid] = []
        else:
            both(stores, "lookup", sid, contexts[sid][-8:], rng.randint(0, 8), rng.randint(1, 3), tenant)
    assert all(client.dbsize(target_nodes=node) > 0 for node in client.get_primaries())  # every shard has keys
    for sid in SESSIONS:
        both(stores, "release", sid)
    stores[1].close()
    client.close()


@pytest.mark.slow  # a cluster of its own and a failover: about 5 s
def test_a_killed_master_fails_fast_then_its_replica_serves(fresh_cluster):
    """Before the failover, the calls on the killed master's slots raise Unavailable within (RETRIES + 1)
    timeouts and the other masters' sessions keep working; after it, the same client serves them all,
    though the killed master was the one node its URL named."""
    client = connect_cluster(fresh_cluster.url, TIMEOUT_S)
    doomed = client.get_default_node().port  # the node redis-py asks what it cannot route by itself
    alive = next(port for port in fresh_cluster.masters() if port != doomed)
    url = fresh_cluster.url_of(doomed)  # and the seed: the client must go on from the nodes it learned
    tenant = name_on(client, alive, "tenant", tenant_tag)  # its learned store survives
    stores = [InMemoryNgramCache(), open_store(url, timeout_s=TIMEOUT_S)]
    lost, kept = name_on(client, doomed, "lost", session_tag), name_on(client, alive, "kept", session_tag)
    moved = name_on(client, doomed, "moved", session_tag)  # first used once its slot is on the promoted replica
    both(stores, "update_global", [1, 2, 3, 4, 5], tenant)
    for sid in (lost, kept):  # the steady state: every master has both Lua scripts (SCRIPT LOAD goes to all)
        both(stores, "record_branches", sid, [[7, 8, 9], [8, 9, 6]])
        both(stores, "lookup", sid, [7, 8], 3, 1, tenant)
    cluster_store = stores[1]

    fresh_cluster.sync(doomed)  # the replica has lost's table (else a kill may take the last writes with it)
    fresh_cluster.kill(doomed)
    failing = []
    for _ in range(2):
        elapsed, error = timed(cluster_store.lookup, lost, [7, 8], 3, 1, tenant)
        assert isinstance(error, Unavailable), error
        failing.append(elapsed)
        elapsed, error = timed(cluster_store.record_branches, lost, [[1, 2]])
        assert isinstance(error, Unavailable), error
        failing.append(elapsed)
        both(stores, "lookup", kept, [7, 8], 3, 1, tenant)  # the other shards do not wait for the failover
    assert max(failing) < (RETRIES + 1) * TIMEOUT_S, failing
    fresh_cluster.wait_ok()
    assert doomed not in fresh_cluster.masters()

    assert cluster_store.lookup(lost, [7, 8], 3, 1, tenant).draft.tokens  # the replica had its table
    both(stores, "record_branches", moved, [[4, 5, 6]])
    both(stores, "lookup", moved, [4, 5], 2, 1, tenant)
    both(stores, "lookup", kept, [7, 8], 3, 1, tenant)
    cluster_store.close()
    client.close()


class KillingStore:
    """The cluster store; before its n-th lookup, the master of that lookup's session is killed. It
    remembers the sources of every draft it returned."""

    def __init__(self, store, cluster: LocalCluster, kill_at: int):
        self.store, self.cluster, self.kill_at = store, cluster, kill_at
        self.client = connect_cluster(cluster.url, TIMEOUT_S)
        self.lookups, self.killed, self.sources = 0, None, set()

    def lookup(self, session_id, *args):
        self.lookups += 1
        if self.lookups == self.kill_at:
            self.killed = master_of(self.client, session_tag(session_id))
            self.cluster.kill(self.killed)
        found = self.store.lookup(session_id, *args)
        self.sources.update(found.sources)
        return found

    def __getattr__(self, name):  # record_branches, update_global, release, close
        return getattr(self.store, name)


@pytest.mark.slow  # a cluster of its own, a failover and three generations: about 10 s
def test_generation_survives_a_killed_master_and_then_drafts_from_the_store(fresh_cluster, tiny_tokenizer,
                                                                             tiny_verifier):
    from drafter_service.ngram_drafter import NgramDrafter
    from orchestrator.generator import Generator

    max_new_tokens = 48
    ids = tuple(tiny_tokenizer(GOLDEN_PROMPTS[1])["input_ids"])  # a prompt whose n-gram drafts get accepted
    expected = reference_greedy(tiny_verifier.model, ids, max_new_tokens)
    store = KillingStore(open_store(fresh_cluster.url, timeout_s=TIMEOUT_S), fresh_cluster, kill_at=3)
    speculation = SpeculationOptions(drafter="ngram", draft_len=7, adaptive="off")
    request = GenerationRequest(ids, max_new_tokens, speculation=speculation)

    def generator() -> Generator:  # a new one has closed breakers: no store call skipped after a failure
        drafters = {"ngram": NgramDrafter(store, tiny_verifier.info())}
        return Generator(tiny_tokenizer, tiny_verifier, drafters, speculation, cache=store, learn_global=True)

    tokens, _ = run(generator(), request)
    assert store.killed is not None and tokens == expected  # a master died mid-generation: nothing changed
    fresh_cluster.wait_ok()
    for _ in range(3):  # its client follows the failover on its own, once a call has failed over to the new map
        learner = generator()  # over the same store
        tokens, _ = run(learner, request)  # learns the output in the tenant's store
        assert tokens == expected
        store.sources.clear()
        tokens, chunks = run(learner, request)  # the same request again: drafts from what the store learned
        assert tokens == expected
        if "global" in store.sources:
            break
    assert "global" in store.sources and sum(c.round.accepted for c in chunks) > 0
    store.close()
    store.client.close()

"""Contract of the NgramCache role: the in-memory store, the Redis store and the gRPC client (over a
loopback server serving an in-memory store) give identical lookups (tokens, parents, levels, sources,
confidences) and return values after identical branch records and learned documents, equal to the
pure functions of specpipe.core.ngram and specpipe.core.learned, and the same errors. Then what only
Redis has to prove: the store it keeps is the reference's, one hash tag per session and per tenant,
one round trip per lookup / record_branches / update_global, a Redis Cluster client, and Unavailable
(not a hang) when it is down."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from collections import defaultdict

import pytest
from redis.crc import key_slot

from cache_service import servicer
from cache_service.cluster import connect_cluster
from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import (
    GLOBAL_PARTS,
    RedisNgramCache,
    connect,
    global_keys,
    read_learned_store,
    verifier_key,
)
from specpipe.core import learned
from specpipe.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from specpipe.core.learned import LearnedConfig, LearnedStore
from specpipe.core.ngram import NgramConfig, apply_branches, better, learned_draft, mln_lookup
from specpipe.devtools import local_cluster
from specpipe.serving.cache_client import CacheClient
from specpipe.serving.server import ServerConfig, serve
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)

IMPLS = ["memory", "redis", "grpc"]
_ids = itertools.count()


def stream(tokens: list[int], max_n: int = 5) -> list[list[int]]:
    """Branches that record every token of tokens after its prefixes (as apply_updates would)."""
    return [tokens[max(0, i - (max_n - 1)):i + 1] for i in range(1, len(tokens))]


def session() -> str:
    return f"cache-contract-{next(_ids)}"


class Stores:
    """make(config) -> a fresh store of one implementation (Redis: the database is flushed), and
    advance(seconds): the time TTLs see (a fake clock in process, real time for Redis)."""

    def __init__(self, kind: str, url: str | None, stack: contextlib.ExitStack):
        self.kind, self.url, self._stack, self._now = kind, url, stack, 1000.0

    def __call__(self, config: NgramConfig = NgramConfig()):
        if self.kind == "memory":
            return InMemoryNgramCache(config, clock=lambda: self._now)
        if self.kind == "redis":
            connect(self.url).flushdb()
            return self._stack.enter_context(contextlib.closing(RedisNgramCache.from_url(self.url, config)))
        server = self._stack.enter_context(
            serve(
                [servicer.service(InMemoryNgramCache(config, clock=lambda: self._now))],
                ServerConfig(port=0, max_workers=4, grace_s=0),
            )
        )
        return self._stack.enter_context(CacheClient(server.address, timeout_s=10))

    def advance(self, seconds: float) -> None:
        if self.kind == "redis":
            time.sleep(seconds)
        else:
            self._now += seconds


@pytest.fixture(params=IMPLS)
def make_cache(request):
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with contextlib.ExitStack() as stack:
        yield Stores(request.param, url, stack)


@pytest.fixture
def cache(make_cache):
    return make_cache()


# --- the learned store: random streams against the reference -------------------------------------

VOCAB = 8
CONFIGS = [  # small stores evict often
    LearnedConfig(index_n=3, max_occurrences=16, min_share=0.3, max_tokens=1 << 20),
    LearnedConfig(index_n=2, max_occurrences=3, min_share=0.05, reach=1, max_tokens=120),
    LearnedConfig(index_n=1, max_occurrences=2, min_share=1.0, reach=3, max_tokens=40),
    LearnedConfig(index_n=3, max_occurrences=4, min_share=0.5, max_tokens=60),
]


def documents(rng: random.Random, parts: list[list[int]]) -> list[int]:
    """A document of recurring parts: a repeat, a near-repeat (one token changed, or a tail added),
    a splice of two parts, or (rarely) noise."""
    action = rng.random()
    document = list(rng.choice(parts))
    if action < 0.3:
        return document
    if action < 0.55:
        document[rng.randrange(len(document))] = rng.randrange(VOCAB)
        return document
    if action < 0.75:
        return document + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
    if action < 0.92:
        other = rng.choice(parts)
        return document[:rng.randint(1, len(document))] + other[rng.randint(0, len(other) - 1):]
    return [rng.randrange(VOCAB) for _ in range(rng.randint(0, 12))]


def context(rng: random.Random, parts: list[list[int]]) -> list[int]:
    """A context that ends inside a recurring part (after a noisy or matching lead-in), or noise."""
    if rng.random() < 0.15:
        return [rng.randrange(VOCAB) for _ in range(rng.randint(0, 8))]
    part = rng.choice(parts)
    lead = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))]
    return lead + part[rng.randint(0, len(part) - 1):][:rng.randint(1, 40)]


@pytest.mark.parametrize("seed", range(len(CONFIGS)))
def test_lookups_and_learning_equal_the_reference(make_cache, seed):
    """Three tenants learn documents with repeats and near-repeats (evicting for seeds 1..3), two
    sessions record verifier branches; every update_global returns learned.learn's value and every
    lookup equals better(the verifier table's draft, the tenant's learned draft) of the reference,
    confidences and all. Redis then holds exactly the reference's stores."""
    config = NgramConfig(max_n=4 + seed % 2, max_continuations=2 + seed % 3, learned=CONFIGS[seed])
    cache, rng = make_cache(config), random.Random(seed)
    parts = [[rng.randrange(VOCAB) for _ in range(rng.randint(6, 30))] for _ in range(6)]
    sessions = {session(): {} for _ in range(2)}  # id -> its verifier table
    stores: dict[str, LearnedStore] = defaultdict(LearnedStore)  # tenant -> its reference store
    sources = set()
    for _ in range(150):
        sid, tenant = rng.choice(list(sessions)), rng.choice(["", "team-a", "team-b"])
        action = rng.random()
        if action < 0.1:
            branches = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 6))] for _ in range(rng.randint(0, 3))]
            assert cache.record_branches(sid, branches) == apply_branches(sessions[sid], branches, config)
        elif action < 0.45:
            tokens = documents(rng, parts)
            assert cache.update_global(tokens, tenant) == learned.learn(stores[tenant], tokens, config.learned)
        else:
            suffix, k, width = context(rng, parts), rng.randint(0, 10), rng.randint(1, 3)
            expected = better(mln_lookup([sessions[sid]], suffix, k, width, config.max_n),
                              learned_draft(learned.lookup(stores[tenant], suffix, k, width, config.learned)))
            found = cache.lookup(sid, suffix, k, width, tenant)
            assert found == expected
            sources.update(found.sources)
    assert sources == {"verifier", "global"}
    assert all(store.tokens <= config.learned.max_tokens for store in stores.values())
    if seed:
        assert any(store.next_id - 1 > len(store.documents) for store in stores.values())  # some were evicted
    if make_cache.kind == "redis":
        client = connect(make_cache.url)
        for tenant, store in stores.items():
            assert read_learned_store(client, tenant) == store


LEARNED = NgramConfig(learned=LearnedConfig(index_n=3, max_tokens=20))
A, B, C = list(range(10, 18)), list(range(20, 28)), list(range(30, 38))  # 8 tokens each


def test_a_long_match_drafts_long_with_its_evidence(cache):
    """A 4-token match of a document learned once drafts up to min(k, reach * 4) tokens (the document
    ends first here), each evidence(4, 1.0); a 3-token match at most min(k, 6)."""
    assert cache.update_global([1, 2, 3, 4, 5, 6, 7, 8]) == 8
    result = cache.lookup(session(), [1, 2, 3, 4], 6, 1)
    assert (result.draft.tokens, result.draft.parents) == ((5, 6, 7, 8), (-1, 0, 1, 2))
    assert result.levels == (5,) * 4 and result.sources == ("global",) * 4
    assert result.confidence == (learned.evidence(4, 1.0),) * 4 == (0.8,) * 4
    assert cache.update_global([11, 12, 13] + list(range(20, 30))) == 13
    assert cache.lookup(session(), [12, 13], 8, 1).draft.tokens == ()  # shorter than index_n
    assert cache.lookup(session(), [11, 12, 13], 8, 1).draft.tokens == tuple(range(20, 26))  # reach 2: 6 deep


def test_shares_weights_and_alternatives(cache):
    """After 1 2 3, three documents go on with 4 and one with 9: 4 first (share 3/4), 9 as the width-2
    alternative (1/4); then 5, 8 and 7 split the rest: a share of 1/3 would take the product to 1/4,
    below min_share (0.3), so the draft stops. Learning 1 2 3 4 5 6 again (a repeat: its count is 2)
    makes 5 the heaviest (2/4, a product of 0.4) and the draft goes on to the match's length."""
    sid, documents_ = session(), [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [1, 2, 3, 4, 8, 8], [1, 2, 3, 4, 7, 7]]
    assert [cache.update_global(tokens) for tokens in documents_] == [6] * 4
    result = cache.lookup(sid, [0, 1, 2, 3], 5, 2)
    assert (result.draft.tokens, result.draft.parents, result.levels) == ((4, 9), (-1, -1), (4, 4))
    assert result.confidence == (learned.evidence(3, 3 / 4), learned.evidence(3, 1 / 4))
    assert cache.update_global(documents_[0]) == 0
    result = cache.lookup(sid, [0, 1, 2, 3], 5, 2)
    assert (result.draft.tokens, result.draft.parents) == ((4, 9, 5, 6), (-1, -1, 0, 2))
    assert result.confidence == tuple(learned.evidence(3, share) for share in (4 / 5, 1 / 5, 2 / 4, 1.0))
    assert cache.lookup(sid, [0, 1, 2, 3], 5, 3).draft.tokens == (4, 9, 5, 6)  # no other continuation to add


def test_the_better_source_wins_ties_to_the_verifier_table(cache):
    sid = session()
    cache.update_global([1, 2, 3, 4, 5, 6, 7, 8])
    cache.record_branches(sid, stream([4, 9, 9, 9], 2))  # bigrams: evidence(1, 1) = 0.5 per node
    result = cache.lookup(sid, [1, 2, 3, 4], 3, 1)
    assert (result.draft.tokens, result.sources) == ((5, 6, 7), ("global",) * 3)
    assert cache.lookup(sid, [3, 4], 3, 1).sources == ("verifier",) * 3  # too short a match for the store
    cache.record_branches(sid, stream([1, 2, 3, 4, 9, 9, 9, 9]))  # 5-grams: evidence(4, 1) = 0.8, as the store's
    result = cache.lookup(sid, [1, 2, 3, 4], 3, 1)
    assert (result.draft.tokens, result.sources, result.levels) == ((9, 9, 9), ("verifier",) * 3, (5,) * 3)


def test_least_recently_used_documents_are_evicted(make_cache):
    """max_tokens 20: a third 8-token document evicts one; B, learned after A but never drafted from,
    goes, not A, which drafted since."""
    cache, sid = make_cache(LEARNED), session()
    assert cache.update_global(A) == 8 and cache.update_global(B) == 8
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == tuple(A[4:6])  # A is now the most recently used
    assert cache.update_global(C) == 8
    assert cache.lookup(sid, B[:4], 2, 1).draft.tokens == ()
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == tuple(A[4:6])
    assert cache.lookup(sid, C[:4], 2, 1).draft.tokens == tuple(C[4:6])
    assert cache.update_global(B) == 8  # B is new again: it evicts A, the least recently used now
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == ()
    assert cache.update_global(C) == 0  # a repeat: counts and is used, nothing evicted
    assert cache.lookup(sid, B[:4], 2, 1).draft.tokens == tuple(B[4:6])


def test_documents_too_long_or_too_short_are_not_learned(make_cache):
    cache, sid = make_cache(LEARNED), session()
    assert cache.update_global(A) == 8
    assert cache.update_global(list(range(50, 71))) == 0  # 21 tokens > max_tokens: nothing, nothing evicted
    assert cache.lookup(sid, [50, 51, 52], 2, 1).draft.tokens == ()
    assert cache.update_global([1, 2, 3]) == 0 and cache.update_global([]) == 0  # <= index_n: nothing to index
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == tuple(A[4:6])
    assert cache.update_global(list(range(50, 70))) == 20  # exactly max_tokens: evicts all the others
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == ()
    assert cache.lookup(sid, [50, 51, 52], 2, 1).draft.tokens == (53, 54)


def test_tenants_are_isolated(cache):
    """One tenant's documents never draft for another (specpipe.core.tenancy)."""
    sid = session()
    cache.update_global(A, "team-a")
    assert cache.lookup(sid, A[:4], 2, 1, "team-a").draft.tokens == tuple(A[4:6])
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == ()
    assert cache.lookup(sid, A[:4], 2, 1, "team-b").draft.tokens == ()
    cache.update_global(B)
    assert cache.lookup(sid, B[:4], 2, 1, "team-a").draft.tokens == ()
    assert cache.lookup(sid, B[:4], 2, 1).draft.tokens == tuple(B[4:6])


def test_a_tenants_store_expires_after_its_ttl(make_cache):
    """A tenant's store expires ttl_s after it last learned (margins of >= 0.4 s); any learn refreshes
    it, even one that adds nothing, a lookup does not."""
    cache, sid = make_cache(NgramConfig(learned=LearnedConfig(ttl_s=1.0))), session()
    assert cache.update_global(A) == 8
    make_cache.advance(0.6)
    assert cache.update_global(A[:2]) == 0  # too short to learn, but refreshes the store
    make_cache.advance(0.6)  # 1.2 s after A was learned: alive thanks to the refresh
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == tuple(A[4:6])
    make_cache.advance(0.6)
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == ()
    assert cache.update_global(A) == 8  # a fresh store: A is new, not a repeat


# --- the session's verifier table ----------------------------------------------------------------

def test_sessions_are_isolated(cache):
    a, b = session(), session()
    cache.record_branches(a, stream([1, 2, 3, 4]))
    assert cache.lookup(a, [1, 2], 2, 1).draft.tokens == (3, 4)
    assert cache.lookup(b, [1, 2], 2, 1).draft.tokens == ()


def test_release(cache):
    sid = session()
    assert cache.release(sid) is False
    assert cache.record_branches(sid, []) == 0 and cache.release(sid) is False  # nothing recorded: no session
    assert cache.record_branches(sid, stream([1, 2, 3])) == 3
    assert cache.record_branches(sid, [[5, 6]]) == 1
    assert cache.release(sid) is True
    assert cache.lookup(sid, [1, 2], 2, 1).draft.tokens == () and cache.lookup(sid, [5], 1, 1).draft.tokens == ()
    assert cache.release(sid) is False
    assert cache.record_branches(sid, [[5, 6]]) == 1 and cache.release(sid) is True


def test_record_branches(cache):
    sid = session()
    # With N = 5: 9 after (4,), (3, 4), (2, 3, 4), (1, 2, 3, 4) (the leading 0 is beyond N-1); 7 after (4,).
    assert cache.record_branches(sid, [[0, 1, 2, 3, 4, 9], [4, 7]]) == 5
    result = cache.lookup(sid, [1, 2, 3, 4], 1, 1)
    assert (result.draft.tokens, result.levels, result.sources) == ((9,), (5,), ("verifier",))
    assert result.confidence == (learned.evidence(4, 1.0),)
    result = cache.lookup(sid, [8, 4], 1, 2)  # LRU: the later branch's 7 first
    assert (result.draft.tokens, result.levels, result.sources) == ((7, 9), (2, 2), ("verifier", "verifier"))
    assert result.confidence == (learned.evidence(1, 1.0), learned.evidence(1, 0.5))
    assert cache.lookup(session(), [1, 2, 3, 4], 1, 1).draft.tokens == ()  # the verifier table is per session


def test_draft_len_is_clipped(cache):
    sid = session()
    cache.record_branches(sid, [[7, 7]])
    assert cache.lookup(sid, [7], 1000, 1).draft.tokens == (7,) * NgramConfig().max_draft_len


def test_sessions_expire_after_their_ttl(make_cache):
    """A session's table expires its TTL after its last update, which refreshes it (margins of >= 0.6 s)."""
    cache, sid = make_cache(NgramConfig(session_ttl_s=1.5)), session()
    cache.record_branches(sid, stream([1, 2, 3]))
    cache.record_branches(sid, [[5, 6]])
    make_cache.advance(0.9)
    cache.record_branches(sid, [[2, 3]])  # nothing new, but refreshes the TTL
    make_cache.advance(0.9)  # 1.8 s after the first updates: alive thanks to the refresh
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    assert cache.lookup(sid, [5], 1, 1).draft.tokens == (6,)
    cache.record_branches(sid, [[5, 6]])
    make_cache.advance(0.9)
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    make_cache.advance(1.2)
    assert cache.lookup(sid, [5], 1, 1).draft.tokens == ()
    assert cache.release(sid) is False


BAD_CALLS = [
    ("lookup: empty session id", "lookup", ("", [1], 1, 1), "session_id"),
    ("lookup: negative k", "lookup", ("s", [1], -1, 1), "k must be"),
    ("lookup: width 0", "lookup", ("s", [1], 1, 0), "width"),
    ("lookup: negative token", "lookup", ("s", [1, -2], 1, 1), "token id -2"),
    ("lookup: a bad tenant", "lookup", ("s", [1], 1, 1, "no spaces"), "tenant"),
    ("record_branches: empty session id", "record_branches", ("", [[1, 2]]), "session_id"),
    ("record_branches: no branches, empty session id", "record_branches", ("", []), "session_id"),
    ("record_branches: a 1-token branch", "record_branches", ("s", [[1, 2], [3]]), r"branches\[1\] has 1 token"),
    ("record_branches: an empty branch", "record_branches", ("s", [[]]), r"branches\[0\] has 0 tokens"),
    ("record_branches: negative token", "record_branches", ("s", [[1, -7]]), "token id -7"),
    ("update_global: negative token", "update_global", ([3, -1],), "token id -1"),
    ("update_global: a bad tenant", "update_global", ([1, 2, 3, 4], "a/b"), "tenant"),
    ("release: empty session id", "release", ("",), "session_id"),
]


@pytest.mark.parametrize("method, args, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input(cache, method, args, message):
    with pytest.raises(InvalidArgument, match=message):
        getattr(cache, method)(*args)


# --- Redis only ----------------------------------------------------------------------------------

def test_a_session_and_a_tenant_each_live_under_one_hash_tag(redis_url):  # noqa: F811
    client = connect(redis_url)
    client.flushdb()
    cache = RedisNgramCache.from_url(redis_url)
    for sid in ("alpha", "beta"):
        cache.record_branches(sid, [[1, 2, 7]])
    cache.update_global([1, 2, 3, 4])
    cache.update_global([5, 6, 7, 8], "acme")
    assert sorted(k.decode() for k in client.keys("*")) == sorted(
        global_keys("") + global_keys("acme") + [verifier_key("alpha"), verifier_key("beta")])
    assert global_keys("acme") == [f"{{g:acme}}:{part}" for part in GLOBAL_PARTS]
    assert {key_slot(key.encode()) for key in global_keys("acme")} == {key_slot(b"{g:acme}")}
    assert {key_slot(key.encode()) for key in global_keys("")} == {key_slot(b"{g}")}
    assert key_slot(verifier_key("alpha").encode()) == key_slot(b"{s:alpha}")
    assert read_learned_store(client, "acme").digests == {learned.digest([5, 6, 7, 8]): 1}  # the same sha1
    ttl_ms = round(LearnedConfig().ttl_s * 1000)
    assert all(ttl_ms - 5000 < client.pttl(key) <= ttl_ms for key in global_keys("acme"))
    cache.close()


def _evalsha_calls(client) -> int:
    return client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_one_round_trip_per_lookup_update_and_record_branches(redis_url, monkeypatch):  # noqa: F811
    """A lookup is two EVALSHAs (verifier table, learned store) in one pipelined send; an update_global
    and a record_branches one EVALSHA each."""
    cache, stats = RedisNgramCache.from_url(redis_url), connect(redis_url)
    sid, tokens = session(), [random.Random(3).randrange(4) for _ in range(200)]
    cache.record_branches(sid, stream(tokens))
    cache.update_global(tokens[:100])
    cache.lookup(sid, tokens, 7, 3)  # every script loaded now
    sends = []
    connection_class = cache._redis.connection_pool.connection_class
    send = connection_class.send_packed_command
    monkeypatch.setattr(connection_class, "send_packed_command",
                        lambda self, *args, **kw: sends.append(1) or send(self, *args, **kw))

    def round_trips(call) -> tuple[int, int]:
        """(sends, EVALSHAs) of call (the INFO commandstats around it are not counted)."""
        before = _evalsha_calls(stats)
        del sends[:]
        call()
        count = len(sends)
        return count, _evalsha_calls(stats) - before

    assert round_trips(lambda: cache.lookup(sid, tokens, 7, 3)) == (1, 2)
    assert round_trips(lambda: cache.update_global(tokens[50:150])) == (1, 1)
    branches = [tokens[i:i + 5] + [9] for i in range(0, 40, 4)]
    assert round_trips(lambda: cache.record_branches(sid, branches)) == (1, 1)
    assert round_trips(lambda: cache.record_branches(sid, [])) == (0, 0)  # nothing to record: no round trip
    cache.close()


def test_scripts_are_reloaded_after_a_script_flush(redis_url):  # noqa: F811
    """A Redis that lost its scripts (a restart, a failover) costs one reload, not an error."""
    cache, sid = RedisNgramCache.from_url(redis_url), session()
    cache.update_global(A)
    cache.record_branches(sid, [[1, 2, 3]])
    connect(redis_url).script_flush()
    assert cache.lookup(sid, A[:4], 2, 1).draft.tokens == tuple(A[4:6])
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    cache.close()


def test_a_redis_cluster_client():
    """A RedisNgramCache over redis.cluster.RedisCluster (specpipe.devtools.local_cluster: the sessions and
    tenants below land on different masters) gives the in-memory store's lookups: a lookup's two
    scripts go to their two nodes in one pipeline, and nodes that lost their scripts get them again.
    (tests/test_cache_cluster.py has the rest: failover, every master.)"""
    config = NgramConfig(learned=LearnedConfig(max_tokens=60))
    try:
        server = local_cluster.start()
    except FailedPrecondition as err:  # no redis-server or redis-cli
        if os.environ.get("CI"):
            raise
        pytest.skip(str(err))
    try:
        with contextlib.closing(connect_cluster(server.url, timeout_s=5)) as cluster:
            store, reference, rng = RedisNgramCache(cluster, config), InMemoryNgramCache(config), random.Random(5)
            parts = [[rng.randrange(VOCAB) for _ in range(rng.randint(6, 20))] for _ in range(4)]
            nodes = {cluster.get_node_from_key(key).name for key in ["{g}:x", "{g:a}:x", "{s:s1}:x", "{s:s2}:x"]}
            assert len(nodes) > 1
            for step in range(200):
                sid, tenant = rng.choice(["s1", "s2"]), rng.choice(["", "a"])
                if step == 100:
                    cluster.script_flush()
                if rng.random() < 0.3:
                    tokens = documents(rng, parts)
                    assert store.update_global(tokens, tenant) == reference.update_global(tokens, tenant)
                elif rng.random() < 0.2:
                    branches = stream(context(rng, parts), config.max_n)
                    assert store.record_branches(sid, branches) == reference.record_branches(sid, branches)
                else:
                    suffix = context(rng, parts)
                    assert store.lookup(sid, suffix, 6, 2, tenant) == reference.lookup(sid, suffix, 6, 2, tenant)
    finally:
        server.stop()


def test_redis_down_is_unavailable_not_a_hang():
    with redis_server() as server:
        cache, sid = RedisNgramCache.from_url(server.url, timeout_s=0.5), session()
        cache.record_branches(sid, [[1, 2, 3]])
        assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
        server.stop()
        for call in (lambda: cache.lookup(sid, [1, 2], 7, 1), lambda: cache.record_branches(sid, [[3, 4]]),
                     lambda: cache.update_global([1, 2, 3, 4]), lambda: cache.release(sid)):
            started = time.monotonic()
            with pytest.raises(Unavailable, match="redis at redis://127.0.0.1"):
                call()
            assert time.monotonic() - started < 3.0


def test_cache_service_down_is_unavailable():
    with serve([servicer.service(InMemoryNgramCache())], ServerConfig(port=0, max_workers=2, grace_s=0)) as server:
        client = CacheClient(server.address, timeout_s=2)
        assert client.record_branches("s", [[1, 2]]) == 1
    with client, pytest.raises(Unavailable):
        client.lookup("s", [1], 1, 1)

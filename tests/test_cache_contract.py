"""Contract of the NgramCache role: the in-memory store, the Redis store and the gRPC client (over a
loopback server serving an in-memory store) give identical lookups (tokens, levels and sources) after
identical branch records and global updates, equal to the pure functions of specpipe.core.ngram, and the
same errors. Then what only Redis has to prove: one hash tag per session, one round trip per lookup /
record_branches / update_global, and Unavailable (not a hang) when it is down."""

from __future__ import annotations

import contextlib
import itertools
import random
import time

import pytest
from redis.crc import key_slot

from cache_service import servicer
from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import GLOBAL_KEY, RedisNgramCache, connect, verifier_key
from specpipe.core.errors import InvalidArgument, Unavailable
from specpipe.core.ngram import NgramConfig, apply_branches, apply_updates, mln_lookup
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


@pytest.fixture(params=IMPLS)
def make_cache(request):
    """make(config) -> a fresh store of this implementation (Redis: the database is flushed)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with contextlib.ExitStack() as stack:
        def make(config: NgramConfig = NgramConfig()):
            if request.param == "memory":
                return InMemoryNgramCache(config)
            if request.param == "redis":
                connect(url).flushdb()
                cache = RedisNgramCache.from_url(url, config)
                stack.callback(cache.close)
                return cache
            server = stack.enter_context(serve([servicer.service(InMemoryNgramCache(config))],
                                               ServerConfig(port=0, max_workers=4, grace_s=0)))
            return stack.enter_context(CacheClient(server.address, timeout_s=10))
        yield make


@pytest.fixture
def cache(make_cache):
    return make_cache()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookups_equal_the_pure_functions(make_cache, seed):
    """Random token streams over a small vocabulary (many hits, many LRU evictions), two sessions,
    verifier branches and global updates (a full global table for seeds 1 and 2); every lookup
    equals mln_lookup over the reference tables."""
    config = NgramConfig(max_n=4 + seed % 2, max_continuations=2 + seed, max_global_prefixes=(1 << 20, 12, 4)[seed])
    cache, rng = make_cache(config), random.Random(seed)
    sessions = {session(): ([], {}) for _ in range(2)}  # id -> (context, verifier table)
    global_table: dict = {}
    for _ in range(80):
        sid = rng.choice(list(sessions))
        context, verifier_table = sessions[sid]
        action = rng.random()
        if action < 0.35:
            context.extend(rng.randrange(6) for _ in range(rng.randint(0, 5)))
        elif action < 0.45:
            branches = [[rng.randrange(6) for _ in range(rng.randint(2, 7))] for _ in range(rng.randint(0, 3))]
            assert cache.record_branches(sid, branches) == apply_branches(verifier_table, branches, config)
        elif action < 0.55:
            tokens = [rng.randrange(6) for _ in range(rng.randint(0, 8))]
            expected = apply_updates(global_table, tokens, 0, config, config.max_global_prefixes)
            assert cache.update_global(tokens) == expected
        else:
            k, width = rng.randint(0, 8), rng.randint(1, 3)
            expected = mln_lookup([verifier_table, global_table], context, k, width, config.max_n)
            assert cache.lookup(sid, context, k, width) == expected
    assert len(global_table) <= config.max_global_prefixes
    lookups = [cache.lookup(sid, ctx, 8, 2) for sid, (ctx, _) in sessions.items()]
    assert any(len(result.draft) for result in lookups)


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
    result = cache.lookup(sid, [8, 4], 1, 2)  # LRU: the later branch's 7 first
    assert (result.draft.tokens, result.levels, result.sources) == ((7, 9), (2, 2), ("verifier", "verifier"))
    assert cache.lookup(session(), [1, 2, 3, 4], 1, 1).draft.tokens == ()  # the verifier table is per session


def test_tables_in_priority_order_with_sources(cache):
    sid, other = session(), session()
    cache.update_global([1, 2, 3, 5])
    cache.record_branches(sid, [[3, 4], [4, 8]])
    result = cache.lookup(sid, [1, 2], 3, 1)
    # (1, 2) only in the global table; then the verifier's (3,) beats the global (2, 3); then (4,) in
    # the verifier table only.
    assert result.draft.tokens == (3, 4, 8) and result.levels == (3, 2, 2)
    assert result.sources == ("global", "verifier", "verifier")
    cache.record_branches(other, [[7, 3, 6]])
    result = cache.lookup(other, [2, 3], 1, 1)  # the verifier's bigram beats a global trigram
    assert (result.draft.tokens, result.levels, result.sources) == ((6,), (2,), ("verifier",))


def test_global_table_is_bounded_in_prefixes(make_cache):
    cache, sid = make_cache(NgramConfig(max_n=3, max_global_prefixes=3)), session()
    assert cache.update_global([1, 2, 3]) == 3  # (1,), (2,), (1, 2): full
    assert cache.update_global([1, 5, 4]) == 1  # (1,) -> 5 learns; (5,) and (1, 5) are new: dropped
    result = cache.lookup(sid, [1], 2, 2)
    assert (result.draft.tokens, result.sources) == ((5, 2), ("global",) * 2)  # nothing after (1, 5) or (5,)
    assert cache.lookup(sid, [2], 1, 1).draft.tokens == (3,)
    assert cache.record_branches(sid, stream([5, 4, 6, 7], 3)) == 5  # session tables are not bounded


def test_draft_len_is_clipped(cache):
    sid = session()
    cache.record_branches(sid, [[7, 7]])
    assert cache.lookup(sid, [7], 1000, 1).draft.tokens == (7,) * NgramConfig().max_draft_len


def test_sessions_expire_after_their_ttl(make_cache):
    """A session's table expires its TTL after its last update, which refreshes it (margins of >= 0.6 s)."""
    cache, sid = make_cache(NgramConfig(session_ttl_s=1.5)), session()
    cache.record_branches(sid, stream([1, 2, 3]))
    cache.record_branches(sid, [[5, 6]])
    cache.update_global([1, 2, 4])
    time.sleep(0.9)
    cache.record_branches(sid, [[2, 3]])  # nothing new, but refreshes the TTL
    time.sleep(0.9)  # 1.8 s after the first updates: alive thanks to the refresh
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    assert cache.lookup(sid, [5], 1, 1).draft.tokens == (6,)
    cache.record_branches(sid, [[5, 6]])
    time.sleep(0.9)
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    time.sleep(1.2)
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (4,)  # the global table does not expire
    assert cache.lookup(sid, [5], 1, 1).draft.tokens == ()
    assert cache.release(sid) is False


BAD_CALLS = [
    ("lookup: empty session id", "lookup", ("", [1], 1, 1), "session_id"),
    ("lookup: negative k", "lookup", ("s", [1], -1, 1), "k must be"),
    ("lookup: width 0", "lookup", ("s", [1], 1, 0), "width"),
    ("lookup: negative token", "lookup", ("s", [1, -2], 1, 1), "token id -2"),
    ("record_branches: empty session id", "record_branches", ("", [[1, 2]]), "session_id"),
    ("record_branches: no branches, empty session id", "record_branches", ("", []), "session_id"),
    ("record_branches: a 1-token branch", "record_branches", ("s", [[1, 2], [3]]), r"branches\[1\] has 1 token"),
    ("record_branches: an empty branch", "record_branches", ("s", [[]]), r"branches\[0\] has 0 tokens"),
    ("record_branches: negative token", "record_branches", ("s", [[1, -7]]), "token id -7"),
    ("update_global: negative token", "update_global", ([3, -1],), "token id -1"),
    ("release: empty session id", "release", ("",), "session_id"),
]


@pytest.mark.parametrize("method, args, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input(cache, method, args, message):
    with pytest.raises(InvalidArgument, match=message):
        getattr(cache, method)(*args)


# --- Redis only ----------------------------------------------------------------------------------

def test_a_session_lives_under_one_hash_tag(redis_url):  # noqa: F811
    connect(redis_url).flushdb()
    cache = RedisNgramCache.from_url(redis_url)
    for sid in ("alpha", "beta"):
        cache.record_branches(sid, [[1, 2, 7]])
    cache.update_global([1, 2, 3])
    keys = sorted(k.decode() for k in connect(redis_url).keys("*"))
    assert keys == [GLOBAL_KEY, "{s:alpha}:verifier", "{s:beta}:verifier"]
    assert key_slot(verifier_key("alpha").encode()) == key_slot(b"{s:alpha}")


def _evalsha_calls(client) -> int:
    return client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_one_round_trip_per_lookup_update_and_record_branches(redis_url):  # noqa: F811
    cache, stats = RedisNgramCache.from_url(redis_url), connect(redis_url)
    sid = session()
    tokens = [random.Random(3).randrange(4) for _ in range(200)]
    cache.record_branches(sid, stream(tokens))
    cache.lookup(sid, tokens, 7, 3)  # both scripts loaded now
    sent = []
    execute = cache._redis.execute_command
    cache._redis.execute_command = lambda *args, **kw: sent.append(args[0]) or execute(*args, **kw)
    before = _evalsha_calls(stats)
    result = cache.lookup(sid, tokens, 7, 3)
    assert len(result.draft) >= 7 and sent == ["EVALSHA"] and _evalsha_calls(stats) == before + 1
    assert cache.update_global(tokens[:4]) == 6  # 3 tokens after their 1, 2 and 3 tokens before
    assert sent == ["EVALSHA"] * 2 and _evalsha_calls(stats) == before + 2
    branches = [tokens[i:i + 5] + [9] for i in range(0, 40, 4)]  # 10 branches of 6 tokens, 4 pairs each
    assert cache.record_branches(sid, branches) == 40
    assert sent == ["EVALSHA"] * 3 and _evalsha_calls(stats) == before + 3
    assert cache.record_branches(sid, []) == 0  # nothing to record: no round trip
    assert sent == ["EVALSHA"] * 3


def test_redis_down_is_unavailable_not_a_hang():
    with redis_server() as server:
        cache, sid = RedisNgramCache.from_url(server.url, timeout_s=0.5), session()
        cache.record_branches(sid, [[1, 2, 3]])
        assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
        server.stop()
        for call in (lambda: cache.lookup(sid, [1, 2], 7, 1), lambda: cache.record_branches(sid, [[3, 4]]),
                     lambda: cache.release(sid)):
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

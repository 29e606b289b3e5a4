"""Contract of the NgramCache role: the in-memory store, the Redis store and the gRPC client (over a
loopback server serving an in-memory store) give identical lookups after identical updates, equal to
the pure functions of specpipe.ngram, and the same errors. Then what only Redis has to prove: one
hash tag per session, one round trip per lookup / update, and Unavailable (not a hang) when it is down."""

from __future__ import annotations

import contextlib
import itertools
import random
import time

import pytest
from redis.crc import key_slot

from cache_service import servicer
from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import RedisNgramCache, connect, session_key
from specpipe.errors import InvalidArgument, Unavailable
from specpipe.ngram import NgramConfig, apply_updates, mln_lookup
from specpipe.rpc.cache_client import CacheClient
from specpipe.rpc.server import ServerConfig, serve
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)

IMPLS = ["memory", "redis", "grpc"]
_ids = itertools.count()


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
    """Random token streams over a small vocabulary (many hits, many LRU evictions), two sessions and
    global updates; every lookup equals mln_lookup over the reference tables."""
    config = NgramConfig(max_n=4 + seed % 2, max_continuations=2 + seed)
    cache, rng = make_cache(config), random.Random(seed)
    sessions = {session(): ([], {}) for _ in range(2)}  # id -> (context, reference table)
    global_table: dict = {}
    for _ in range(60):
        sid = rng.choice(list(sessions))
        context, table = sessions[sid]
        action = rng.random()
        if action < 0.4:
            new = [rng.randrange(6) for _ in range(rng.randint(0, 5))]
            tokens = context[len(context) - min(len(context), rng.randint(0, 6)):] + new
            start = len(tokens) - len(new)
            assert cache.update(sid, tokens, start) == apply_updates(table, tokens, start, config)
            context.extend(new)
        elif action < 0.5:
            tokens = [rng.randrange(6) for _ in range(rng.randint(0, 8))]
            assert cache.update_global(tokens) == apply_updates(global_table, tokens, 0, config)
        else:
            k, width = rng.randint(0, 8), rng.randint(1, 3)
            expected = mln_lookup([table, global_table], context, k, width, config.max_n)
            assert cache.lookup(sid, context, k, width) == expected
    assert any(len(cache.lookup(sid, ctx, 8, 2).draft) for sid, (ctx, _) in sessions.items())


def test_sessions_are_isolated(cache):
    a, b = session(), session()
    cache.update(a, [1, 2, 3, 4], 0)
    assert cache.lookup(a, [1, 2], 2, 1).draft.tokens == (3, 4)
    assert cache.lookup(b, [1, 2], 2, 1).draft.tokens == ()


def test_release(cache):
    sid = session()
    assert cache.release(sid) is False
    assert cache.update(sid, [1, 2], 2) == 0 and cache.release(sid) is False  # nothing recorded: no session
    assert cache.update(sid, [1, 2, 3], 0) == 3
    assert cache.release(sid) is True
    assert cache.lookup(sid, [1, 2], 2, 1).draft.tokens == ()
    assert cache.release(sid) is False


def test_global_table_is_the_fallback(cache):
    a, b = session(), session()
    assert cache.update_global([1, 2, 3, 5]) == 6
    assert cache.lookup(b, [1, 2], 2, 1).draft.tokens == (3, 5)
    cache.update(a, [2, 9], 0)
    result = cache.lookup(a, [1, 2], 2, 1)
    assert result.draft.tokens == (9,) and result.levels == (2,)  # the session's bigram beats a global trigram
    assert cache.lookup(b, [1, 2], 1, 1).levels == (3,)


def test_draft_len_is_clipped(cache):
    sid = session()
    cache.update(sid, [7, 7, 7], 0)
    assert cache.lookup(sid, [7], 1000, 1).draft.tokens == (7,) * NgramConfig().max_draft_len


def test_sessions_expire_after_their_ttl(make_cache):
    cache, sid = make_cache(NgramConfig(session_ttl_s=1.5)), session()  # margins of >= 0.6 s either way
    cache.update(sid, [1, 2, 3], 0)
    cache.update_global([1, 2, 4])
    time.sleep(0.9)
    cache.update(sid, [2, 3], 2)  # nothing new, but refreshes the TTL
    time.sleep(0.9)  # 1.8 s after the first update: alive thanks to the refresh
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
    time.sleep(2.1)
    assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (4,)  # the global table does not expire
    assert cache.release(sid) is False


BAD_CALLS = [
    ("lookup: empty session id", "lookup", ("", [1], 1, 1), "session_id"),
    ("lookup: negative k", "lookup", ("s", [1], -1, 1), "k must be"),
    ("lookup: width 0", "lookup", ("s", [1], 1, 0), "width"),
    ("lookup: negative token", "lookup", ("s", [1, -2], 1, 1), "token id -2"),
    ("update: empty session id", "update", ("", [1, 2], 0), "session_id"),
    ("update: negative token", "update", ("s", [1, -5], 0), "token id -5"),
    ("update: start < 0", "update", ("s", [1, 2], -1), "start"),
    ("update: start > len", "update", ("s", [1, 2], 3), "start"),
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
        cache.update(sid, [1, 2, 3, 4, 5, 6], 0)
    cache.update_global([1, 2, 3])
    keys = sorted(k.decode() for k in connect(redis_url).keys("*"))
    assert keys == ["{g}:ngram", "{s:alpha}:ngram", "{s:beta}:ngram"]
    assert key_slot(session_key("alpha").encode()) == key_slot(b"{s:alpha}")


def _evalsha_calls(client) -> int:
    return client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_one_round_trip_per_lookup_and_update(redis_url):  # noqa: F811
    cache, stats = RedisNgramCache.from_url(redis_url), connect(redis_url)
    sid = session()
    tokens = [random.Random(3).randrange(4) for _ in range(200)]
    cache.update(sid, tokens, 0)
    cache.lookup(sid, tokens, 7, 3)  # both scripts loaded now
    sent = []
    execute = cache._redis.execute_command
    cache._redis.execute_command = lambda *args, **kw: sent.append(args[0]) or execute(*args, **kw)
    before = _evalsha_calls(stats)
    result = cache.lookup(sid, tokens, 7, 3)
    assert len(result.draft) >= 7 and sent == ["EVALSHA"] and _evalsha_calls(stats) == before + 1
    assert cache.update(sid, tokens + [1, 2, 3], 200) == 12
    assert sent == ["EVALSHA"] * 2 and _evalsha_calls(stats) == before + 2


def test_redis_down_is_unavailable_not_a_hang():
    with redis_server() as server:
        cache, sid = RedisNgramCache.from_url(server.url, timeout_s=0.5), session()
        cache.update(sid, [1, 2, 3], 0)
        assert cache.lookup(sid, [1, 2], 1, 1).draft.tokens == (3,)
        server.stop()
        for call in (lambda: cache.lookup(sid, [1, 2], 7, 1), lambda: cache.update(sid, [3, 4], 1),
                     lambda: cache.release(sid)):
            started = time.monotonic()
            with pytest.raises(Unavailable, match="redis at redis://127.0.0.1"):
                call()
            assert time.monotonic() - started < 3.0


def test_cache_service_down_is_unavailable():
    with serve([servicer.service(InMemoryNgramCache())], ServerConfig(port=0, max_workers=2, grace_s=0)) as server:
        client = CacheClient(server.address, timeout_s=2)
        assert client.update("s", [1, 2], 0) == 1
    with client, pytest.raises(Unavailable):
        client.lookup("s", [1], 1, 1)

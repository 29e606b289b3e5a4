"""Redis n-gram store: every replica of every service shares one store (docs/design.md, "Drafting"),
with the semantics of specpipe.core.ngram and specpipe.core.learned.

Layout. Every key of one Lua call carries one hash tag, so each call touches one Redis Cluster slot:
- A session's verifier table is the hash `{s:<id>}:verifier`: field = prefix "t1,...,t_{n-1}", value
  = continuations "c1,c2,..." most recent first, at most max_continuations (LRU per prefix,
  Self-Draft). Every record_branches PEXPIREs it (session_ttl_s); a release is one DEL.
- A tenant's learned store lives under the tag `{g}` (the default tenant) or `{g:<tenant>}`, in six
  keys (global_keys; lua/learn.lua has the field layout): `docs` (id -> tokens as little-endian
  int32), `counts` (id -> times learned), `lru` (zset of ids by last use), `digests` (sha1 of the
  packed tokens -> id), `ix` (index_n tokens packed -> (doc, pos) int32 pairs, most recent first, at
  most max_occurrences) and `state` (tokens, last_id, clock). Every learn PEXPIREs all six (ttl_s).

Round trips. A record_branches is ONE EVALSHA of lua/update.lua, an update_global ONE of
lua/learn.lua (index the document, evict least recently used documents beyond max_tokens). A lookup
is ONE pipelined round trip of two EVALSHAs, lua/lookup.lua on the session's slot and
lua/learned_lookup.lua on the tenant's (a Redis Cluster client's pipeline sends each to its node);
the better of the two drafts (ngram.better) is chosen here, as the in-memory store does. Lua replies
carry no floats: the learned lookup returns each node's weight and total, and the confidences are
learned.evidence computed here from the same integers, bit for bit those of the reference. The
session's context is not stored: the n-gram drafter searches the context it is given.

Limits. A tenant's store is bounded in tokens (LearnedConfig.max_tokens); a learned token costs
about 50 bytes of Redis memory in text that recurs and 90 in text that does not (each position a new
index key; redis 7.0, scripts/cache_soak.py): size maxmemory for max_tokens times the active tenants,
with a policy that never evicts single keys of a store (noeviction; a store missing a key degrades,
lookups skip what is gone, but is not repaired). A learn runs in Redis for about 5 µs per token of
the document (and of each document it evicts), during which the shard serves nobody else: a
document of max_tokens = 1M tokens would hold it for seconds, so learn outputs, not whole corpora
(`specpipe cache seed` learns chunks). A lookup touches two slots in one pipeline, never in one
command: no CROSSSLOT on a cluster.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import struct
from collections.abc import Iterator
from typing import Any, Sequence, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import ClusterDownError, NoScriptError, RedisClusterException, TryAgainError
from redis.retry import Retry

from specpipe.core import learned, ngram
from specpipe.core.errors import SpecpipeError, Unavailable
from specpipe.core.learned import MATCH_TOKENS, Document, LearnedDraft, LearnedStore
from specpipe.core.ngram import NgramConfig, NgramDraft
from specpipe.core.tenancy import check_tenant
from specpipe.core.types import Draft

GLOBAL_TAG = "{g}"  # the default tenant's learned store
GLOBAL_PARTS = ("docs", "counts", "lru", "digests", "ix", "state")  # the KEYS of lua/learn.lua and learned_lookup.lua
# What specpipe's Redis user needs and no more: its own keys (sessions {s:..., learned stores {g}:... and
# {g:<tenant>}:...), reads, writes, the Lua scripts and PING, nothing @dangerous (docs/security.md;
# deploy/k8s/base/redis.yaml writes the same rules into its ACL file).
ACL_RULES = "~{s:* ~{g}:* ~{g:* +@read +@write +@scripting +ping -@dangerous"


def global_tag(tenant: str) -> str:
    """The hash tag of a tenant's learned store (specpipe.core.tenancy): one Cluster slot per tenant."""
    return f"{{g:{tenant}}}" if tenant else GLOBAL_TAG


def global_keys(tenant: str) -> list[str]:
    """The keys of a tenant's learned store, in GLOBAL_PARTS order."""
    tag = global_tag(tenant)
    return [f"{tag}:{part}" for part in GLOBAL_PARTS]


def verifier_key(session_id: str) -> str:
    """The session's verifier table. A session's keys carry the hash tag {s:<id>} (one Cluster slot)."""
    return f"{{s:{session_id}}}:verifier"


def packed(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian int32, the learned store's encoding (and learned.digest's input)."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _lua(name: str) -> str:
    return importlib.resources.files("cache_service").joinpath("lua").joinpath(name).read_text()


LOOKUP_LUA = _lua("lookup.lua")
UPDATE_LUA = _lua("update.lua")
LEARN_LUA = _lua("learn.lua")
LEARNED_LOOKUP_LUA = _lua("learned_lookup.lua")


def connect(url: str, timeout_s: float = 1.0) -> redis.Redis:
    """A client from redis://[user:password@]host:port/db or rediss:// (TLS). Socket timeouts and no
    retries: a Redis that is down costs one timeout, then Unavailable (the caller drafts without it)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        # no health_check_interval: its PING would add a round trip before some lookups
    )


@contextlib.contextmanager
def _errors(url: str) -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError, RedisClusterException) as err:
        # a cluster's: a shard down or failing over, no node answering, a slot no master serves
        raise Unavailable(f"redis at {url}: {type(err).__name__}: {err}") from None
    except redis.RedisError as err:
        raise SpecpipeError(f"redis at {url}: {type(err).__name__}: {err}") from None


class RedisNgramCache:
    """specpipe.core.protocols.NgramCache on Redis: any redis-py client (standalone, Sentinel, or
    redis.cluster.RedisCluster)."""

    def __init__(self, client: redis.Redis | RedisCluster, config: NgramConfig = NgramConfig(), url: str = ""):
        self.config = config
        self._redis = client
        self._url = url or repr(client)
        self._lookup = client.register_script(LOOKUP_LUA)
        self._update = client.register_script(UPDATE_LUA)
        self._learn = client.register_script(LEARN_LUA)
        self._learned_lookup = client.register_script(LEARNED_LOOKUP_LUA)

    @classmethod
    def from_url(cls, url: str, config: NgramConfig = NgramConfig(), timeout_s: float = 1.0) -> RedisNgramCache:
        return cls(connect(url, timeout_s), config, redacted(url))

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int,
               tenant: str = "") -> NgramDraft:
        ngram.check_lookup(session_id, context_suffix, k, width)
        check_tenant(tenant)
        k = min(k, self.config.max_draft_len)
        if k == 0:
            return ngram.EMPTY_NGRAM_DRAFT
        suffix = list(context_suffix)
        calls: list[tuple[Any, list[str], list[Any]]] = [(self._lookup, [verifier_key(session_id)],
                  [self.config.max_n, k, width, *suffix[max(0, len(suffix) - (self.config.max_n - 1)):]])]
        if self.config.use_global:
            options = self.config.learned
            calls.append((self._learned_lookup, global_keys(tenant),
                          [packed(suffix[-MATCH_TOKENS:]), options.index_n, k, width, repr(options.min_share),
                           options.reach]))
        with _errors(self._url):
            replies = self._pipelined(calls)
        found = _verifier_draft(*replies[0])
        if not self.config.use_global:
            return found
        return ngram.better(found, ngram.learned_draft(_learned_draft(*replies[1])))

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        ngram.check_session_id(session_id)
        ngram.check_branches(branches)
        if not branches:
            return 0
        # A branch records only its last token after at most max_n-1 tokens: send no more.
        args = [self.config.max_n, self.config.max_continuations, max(1, round(self.config.session_ttl_s * 1000))]
        for branch in branches:
            tail = branch[-self.config.max_n:]
            args += [len(tail) - 1, len(tail), *tail]
        with _errors(self._url):
            return int(self._update(keys=[verifier_key(session_id)], args=args))

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        """learned.learn into the tenant's store (ONE call; its TTL is refreshed even when nothing is added)."""
        ngram.check_tokens(tokens, "tokens")
        check_tenant(tenant)
        options = self.config.learned
        args: list[Any] = [packed(tokens), options.index_n, options.max_occurrences, options.max_tokens,
                max(1, round(options.ttl_s * 1000))]
        with _errors(self._url):
            return int(self._learn(keys=global_keys(tenant), args=args))

    def release(self, session_id: str) -> bool:
        ngram.check_session_id(session_id)
        with _errors(self._url):
            return self._redis.delete(verifier_key(session_id)) > 0

    def close(self) -> None:
        self._redis.close()

    def _pipelined(self, calls: Sequence[tuple[Script, list[str], list]]) -> list:
        """EVALSHA every (script, keys, args) in one pipeline (one round trip; a cluster pipeline sends
        each to its slot's node). Raw EVALSHA: a standalone pipeline with scripts would first ask
        SCRIPT EXISTS (a second round trip) and a cluster pipeline refuses evalsha(). A script the
        server does not know (a restart, a failover, another node) is loaded and the pipeline re-sent."""
        replies = self._send(calls)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            for script, _, _ in calls:
                self._redis.script_load(script.script)  # a cluster client loads it on every primary
            replies = self._send(calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _send(self, calls: Sequence[tuple[Script, list[str], list]]) -> list:
        pipe = self._redis.pipeline(transaction=False)
        for script, keys, args in calls:
            # On a cluster, name the slot's node: otherwise redis-py asks its default node for the
            # command's keys (COMMAND GETKEYS), a round trip more, and no way on while that node is down.
            redis_client = self._redis
            target = ({"target_nodes": redis_client.get_node_from_key(keys[0])}
                      if isinstance(redis_client, RedisCluster) else {})
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **target)
        return pipe.execute(raise_on_error=False)


def _verifier_draft(tokens: list[int], parents: list[int], levels: list[int]) -> NgramDraft:
    return NgramDraft(Draft(tuple(tokens), tuple(parents)), tuple(levels), ("verifier",) * len(tokens),
                      ngram.ngram_confidence(parents, levels))


def _learned_draft(tokens: list[int], parents: list[int], weights: list[int], totals: list[int],
                   match: int) -> LearnedDraft:
    """lua/learned_lookup.lua's reply as learned.walk returns it (used: already bumped in Redis)."""
    confidence = tuple(learned.evidence(match, weight / total) for weight, total in zip(weights, totals))
    return LearnedDraft(Draft(tuple(tokens), tuple(parents)), match, confidence, ())


def read_learned_store(client: redis.Redis | RedisCluster, tenant: str = "") -> LearnedStore:
    """A tenant's learned store as specpipe.core.learned keeps it, read back from its six keys (tests
    compare it with the reference; inspection). O(store): not for the serving path."""
    docs, counts, lru, digests, ix, state = global_keys(tenant)
    def hash_of(key: str) -> dict[bytes, bytes]:  # redis-py types replies as bytes or str: these are bytes
        return cast(dict[bytes, bytes], client.hgetall(key))

    tokens, count, fields = hash_of(docs), hash_of(counts), hash_of(state)
    used = dict(cast(list[tuple[bytes, float]], client.zrange(lru, 0, -1, withscores=True)))
    return LearnedStore(
        documents={int(member): Document(_unpacked(tokens[member]), int(count[member]), int(used[member]))
                   for member in tokens},
        index={_unpacked(key): list(zip(*[iter(_unpacked(pairs))] * 2)) for key, pairs in hash_of(ix).items()},
        digests={digest.decode(): int(member) for digest, member in hash_of(digests).items()},
        tokens=int(fields.get(b"tokens", 0)), next_id=int(fields.get(b"last_id", 0)) + 1,
        clock=int(fields.get(b"clock", 0)))


def _unpacked(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(data) // 4}i", data)


def redacted(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{credentials.split(':')[0]}:***@{host}" if at else url

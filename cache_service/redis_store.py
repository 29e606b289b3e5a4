"""Redis n-gram store: every replica of every service shares one store (docs/design.md, "Drafting").

Layout: one hash per table (specpipe.core.ngram.TABLES). A session's verifier table (all levels n = 2..N)
is the hash `{s:<id>}:verifier`, the global (corpus) table is `{g}:ngram`; field = prefix
"t1,...,t_{n-1}", value = continuations "c1,c2,..." most recent first, at most max_continuations (LRU
per prefix, Self-Draft). A session's keys carry the hash tag {s:<id>}, so they live on one Redis
Cluster slot; every session update PEXPIREs them (one TTL per session) and a release is one DEL. A
whole K-token lookup is ONE EVALSHA of lua/lookup.lua; a record_branches and an update_global are each
ONE EVALSHA of lua/update.lua (one round trip each), with the semantics of specpipe.core.ngram. The
session's context is not stored: the n-gram drafter searches the context it is given.

Limits: a lookup with the global fallback touches two hash slots (the session's and {g}), which Redis
Cluster refuses (CROSSSLOT); on a cluster run with NgramConfig(use_global=False). The global hash is
bounded in prefixes (NgramConfig.max_global_prefixes, checked with HLEN) and per prefix, and never
expires: size Redis's maxmemory for it, or seed it from a curated corpus (`specpipe cache seed`).
"""

from __future__ import annotations

import contextlib
import importlib.resources
from typing import Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from specpipe.core import ngram
from specpipe.core.errors import SpecpipeError, Unavailable
from specpipe.core.ngram import TABLES, NgramConfig, NgramDraft
from specpipe.core.tenancy import check_tenant
from specpipe.core.types import Draft

GLOBAL_KEY = "{g}:ngram"  # the default tenant's global table
# What specpipe's Redis user needs and no more: its own keys (sessions {s:..., global tables {g}:... and
# {g:<tenant>}:...), reads, writes, the Lua scripts and PING, nothing @dangerous (docs/security.md;
# deploy/k8s/base/redis.yaml writes the same rules into its ACL file).
ACL_RULES = "~{s:* ~{g}:* ~{g:* +@read +@write +@scripting +ping -@dangerous"


def global_key(tenant: str) -> str:
    """A tenant's global table (specpipe.core.tenancy); the default tenant keeps the key it always had."""
    return f"{{g:{tenant}}}:ngram" if tenant else GLOBAL_KEY


def _lua(name: str) -> str:
    return importlib.resources.files("cache_service").joinpath("lua", name).read_text()


LOOKUP_LUA = _lua("lookup.lua")
UPDATE_LUA = _lua("update.lua")


def verifier_key(session_id: str) -> str:
    """The session's verifier table. A session's keys carry the hash tag {s:<id>} (one Cluster slot)."""
    return f"{{s:{session_id}}}:verifier"


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
def _errors(url: str):
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as err:
        raise Unavailable(f"redis at {url}: {type(err).__name__}: {err}") from None
    except redis.RedisError as err:
        raise SpecpipeError(f"redis at {url}: {type(err).__name__}: {err}") from None


class RedisNgramCache:
    """specpipe.core.protocols.NgramCache on Redis (standalone, Sentinel or Cluster-compatible keys)."""

    def __init__(self, client: redis.Redis, config: NgramConfig = NgramConfig(), url: str = ""):
        self.config = config
        self._redis = client
        self._url = url or repr(client)
        self._lookup = client.register_script(LOOKUP_LUA)
        self._update = client.register_script(UPDATE_LUA)

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
        keys = [verifier_key(session_id)]  # TABLES order
        if self.config.use_global:
            keys.append(global_key(tenant))
        suffix = list(context_suffix)[max(0, len(context_suffix) - (self.config.max_n - 1)):]
        with _errors(self._url):
            tokens, parents, levels, sources = self._lookup(keys=keys, args=[self.config.max_n, k, width, *suffix])
        return NgramDraft(Draft(tuple(tokens), tuple(parents)), tuple(levels), tuple(TABLES[i] for i in sources))

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        ngram.check_session_id(session_id)
        ngram.check_branches(branches)
        if not branches:
            return 0
        # A branch records only its last token after at most max_n-1 tokens: send no more.
        segments = [(len(b[-self.config.max_n:]) - 1, b[-self.config.max_n:]) for b in branches]
        return self._record([verifier_key(session_id)], segments, self._ttl_ms())

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        ngram.check_tokens(tokens, "tokens")
        check_tenant(tenant)
        return self._record([global_key(tenant)], [(0, tokens)], 0, self.config.max_global_prefixes)

    def release(self, session_id: str) -> bool:
        ngram.check_session_id(session_id)
        with _errors(self._url):
            return self._redis.delete(verifier_key(session_id)) > 0

    def close(self) -> None:
        self._redis.close()

    def _ttl_ms(self) -> int:
        return max(1, round(self.config.session_ttl_s * 1000))

    def _record(self, keys: list[str], segments: Sequence[tuple[int, Sequence[int]]], ttl_ms: int,
                max_prefixes: int = 0) -> int:
        """ONE update.lua call: record tokens[start:] of every (start, tokens) segment in keys[0] and
        refresh the TTL of all keys (ttl_ms 0 = none); max_prefixes 0 = unbounded."""
        args = [self.config.max_n, self.config.max_continuations, ttl_ms, max_prefixes]
        for start, tokens in segments:
            args += [start, len(tokens), *tokens]
        with _errors(self._url):
            return int(self._update(keys=keys, args=args))


def redacted(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{credentials.split(':')[0]}:***@{host}" if at else url

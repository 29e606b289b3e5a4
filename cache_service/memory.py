"""In-memory n-gram store: the embedded default. Same semantics as the Redis backend (the contract
tests run one suite over both): per session a verifier table with a TTL, refreshed by each update,
and per tenant a learned store (specpipe.core.learned), bounded in tokens (LRU), with a TTL."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from specpipe.core import learned, ngram
from specpipe.core.learned import LearnedStore
from specpipe.core.ngram import NgramConfig, NgramDraft, Table
from specpipe.core.tenancy import check_tenant


@dataclass
class _Session:
    verifier: Table = field(default_factory=dict)  # the verifier's argmax off the accepted path (record_branches)
    expires_at: float = 0.0  # clock() seconds


@dataclass
class _Tenant:
    store: LearnedStore = field(default_factory=LearnedStore)
    expires_at: float = 0.0


class InMemoryNgramCache:
    """specpipe.core.protocols.NgramCache in this process; thread-safe (one lock, lookups are microseconds)."""

    def __init__(self, config: NgramConfig = NgramConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._tenants: dict[str, _Tenant] = {}  # tenant -> its learned store
        self._next_sweep = 0.0

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int,
               tenant: str = "") -> NgramDraft:
        ngram.check_lookup(session_id, context_suffix, k, width)
        check_tenant(tenant)
        k = min(k, self.config.max_draft_len)
        suffix = list(context_suffix)
        with self._lock:
            session = self._live(session_id) or _Session()
            found = ngram.mln_lookup([session.verifier], suffix, k, width, self.config.max_n)
            owner = self._tenant(tenant) if self.config.use_global else None
            if owner is None:
                return found
            return ngram.better(found, ngram.learned_draft(learned.lookup(owner.store, suffix, k, width,
                                                                          self.config.learned)))

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        ngram.check_session_id(session_id)
        ngram.check_branches(branches)
        if not branches:
            return 0  # as Redis, which is not even called: no TTL refresh
        with self._lock:
            session = self._touch(session_id, True)
            assert session is not None  # create: a missing session is opened
            return ngram.apply_branches(session.verifier, branches, self.config)

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        ngram.check_tokens(tokens, "tokens")
        check_tenant(tenant)
        with self._lock:
            self._sweep(self._clock())
            owner = self._tenant(tenant) or self._tenants.setdefault(tenant, _Tenant())
            owner.expires_at = self._clock() + self.config.learned.ttl_s
            return learned.learn(owner.store, tokens, self.config.learned)

    def release(self, session_id: str) -> bool:
        ngram.check_session_id(session_id)
        with self._lock:
            return self._live(session_id) is not None and self._sessions.pop(session_id) is not None

    def close(self) -> None:
        """Nothing to let go of: the tables live in this process."""

    def _touch(self, session_id: str, create: bool) -> _Session | None:
        """The live session with its TTL refreshed; a missing one is opened only if create (as Redis,
        where a session with nothing recorded has no key)."""
        now = self._clock()
        self._sweep(now)
        session = self._live(session_id)
        if session is None:
            if not create:
                return None
            session = self._sessions[session_id] = _Session()
        session.expires_at = now + self.config.session_ttl_s
        return session

    def _tenant(self, tenant: str) -> _Tenant | None:
        """The tenant's learned store unless it expired."""
        return self._unexpired(self._tenants, tenant)

    def _live(self, session_id: str) -> _Session | None:
        """The session unless it expired."""
        return self._unexpired(self._sessions, session_id)

    def _unexpired(self, entries: dict[str, Any], key: str) -> Any:
        """entries[key] unless it expired (an expired one is dropped, as Redis drops its keys)."""
        entry = entries.get(key)
        if entry is not None and self._clock() >= entry.expires_at:
            del entries[key]
            return None
        return entry

    def _sweep(self, now: float) -> None:
        """Drop expired sessions and learned stores that nobody touches any more, at most once per minute."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(60.0, self.config.session_ttl_s)
        for entries in (self._sessions, self._tenants):
            for key in [k for k, entry in entries.items() if now >= entry.expires_at]:
                del entries[key]

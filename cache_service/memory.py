"""In-memory n-gram store: the embedded default. Same semantics as the Redis backend (the contract
tests run one suite over both): per session a verifier table with a TTL, refreshed by each update,
and a global table bounded in prefixes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from specpipe.core import ngram
from specpipe.core.ngram import NgramConfig, NgramDraft, Table
from specpipe.core.tenancy import check_tenant


@dataclass
class _Session:
    verifier: Table = field(default_factory=dict)  # the verifier's argmax off the accepted path (record_branches)
    expires_at: float = 0.0  # clock() seconds


class InMemoryNgramCache:
    """specpipe.core.protocols.NgramCache in this process; thread-safe (one lock, lookups are microseconds)."""

    def __init__(self, config: NgramConfig = NgramConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._global: dict[str, Table] = {}  # tenant -> its global table
        self._next_sweep = 0.0

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int,
               tenant: str = "") -> NgramDraft:
        ngram.check_lookup(session_id, context_suffix, k, width)
        check_tenant(tenant)
        k = min(k, self.config.max_draft_len)
        with self._lock:
            session = self._live(session_id) or _Session()
            tables = [session.verifier]  # TABLES order
            if self.config.use_global:
                tables.append(self._global.get(tenant, {}))
            return ngram.mln_lookup(tables, list(context_suffix), k, width, self.config.max_n)

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        ngram.check_session_id(session_id)
        ngram.check_branches(branches)
        if not branches:
            return 0  # as Redis, which is not even called: no TTL refresh
        with self._lock:
            session = self._touch(session_id, True)
            return ngram.apply_branches(session.verifier, branches, self.config)

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        ngram.check_tokens(tokens, "tokens")
        check_tenant(tenant)
        with self._lock:
            table = self._global.setdefault(tenant, {})
            return ngram.apply_updates(table, list(tokens), 0, self.config, self.config.max_global_prefixes)

    def release(self, session_id: str) -> bool:
        ngram.check_session_id(session_id)
        with self._lock:
            return self._live(session_id) is not None and self._sessions.pop(session_id) is not None

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

    def _live(self, session_id: str) -> _Session | None:
        """The session unless it expired (an expired one is dropped, as Redis drops the key)."""
        session = self._sessions.get(session_id)
        if session is not None and self._clock() >= session.expires_at:
            del self._sessions[session_id]
            return None
        return session

    def _sweep(self, now: float) -> None:
        """Drop expired sessions that nobody touches any more, at most once per minute."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(60.0, self.config.session_ttl_s)
        for session_id in [s for s, session in self._sessions.items() if now >= session.expires_at]:
            del self._sessions[session_id]

"""In-memory n-gram store: the embedded default. Same semantics as the Redis backend (the contract
tests run one suite over both): session tables with a TTL refreshed on update, and a global table."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from specpipe import ngram
from specpipe.ngram import NgramConfig, NgramDraft, Table


@dataclass
class _Session:
    table: Table = field(default_factory=dict)
    expires_at: float = 0.0  # clock() seconds


class InMemoryNgramCache:
    """specpipe.protocols.NgramCache in this process; thread-safe (one lock, lookups are microseconds)."""

    def __init__(self, config: NgramConfig = NgramConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._global: Table = {}
        self._next_sweep = 0.0

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int) -> NgramDraft:
        ngram.check_lookup(session_id, context_suffix, k, width)
        k = min(k, self.config.max_draft_len)
        with self._lock:
            session = self._live(session_id)
            tables = [session.table] if session is not None else []
            if self.config.use_global:
                tables.append(self._global)
            return ngram.mln_lookup(tables, list(context_suffix), k, width, self.config.max_n)

    def update(self, session_id: str, tokens: Sequence[int], start: int) -> int:
        ngram.check_session_id(session_id)
        ngram.check_update(tokens, start)
        with self._lock:
            now = self._clock()
            self._sweep(now)
            session = self._live(session_id)
            if session is None:
                if not ngram.ngram_updates(tokens, start, self.config.max_n):
                    return 0  # nothing to record: do not open a session (as Redis, which has no key)
                session = self._sessions[session_id] = _Session()
            session.expires_at = now + self.config.session_ttl_s
            return ngram.apply_updates(session.table, list(tokens), start, self.config)

    def update_global(self, tokens: Sequence[int]) -> int:
        ngram.check_tokens(tokens, "tokens")
        with self._lock:
            return ngram.apply_updates(self._global, list(tokens), 0, self.config)

    def release(self, session_id: str) -> bool:
        ngram.check_session_id(session_id)
        with self._lock:
            return self._live(session_id) is not None and self._sessions.pop(session_id) is not None

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

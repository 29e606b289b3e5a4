"""Session lifecycle: the client's deadline carried to every internal call, idle sessions swept, a
fresh random seed for a request that gives none (docs/security.md); a service's start-up heap kept
out of the garbage collector's full passes.

The deadline lives in a context variable: the Generation servicer sets it from its call's remaining
time, the gRPC clients read it (every verifier, drafter and cache call of that generation gets the
time left, never more), and ContextPool carries it into the branch schedule's worker threads.
Cancellation travels the same way: every RPC handler runs in the scope of a Cancellation that is
set when its caller goes away; the gRPC clients cancel the long calls (prefills) made in that scope,
so a client that leaves stops the prefill made for it, down to the verifier, which drops its rest.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator, Mapping, MutableMapping, TypeVar

from specpipe.core.errors import Cancelled, DeadlineExceeded

log = logging.getLogger("specpipe.runtime.lifecycle")

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("specpipe_deadline", default=None)


class Cancellation:
    """Set once, when the caller of an RPC has gone; callbacks (cancel a call made for it) run then."""

    def __init__(self):
        self._callbacks: list[Callable[[], object]] = []
        self._lock = threading.Lock()
        self._set = False

    @property
    def cancelled(self) -> bool:
        return self._set

    def cancel(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set, callbacks, self._callbacks = True, self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Run callback at cancel (now, if cancelled already); returns a function that forgets it."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


_CANCELLATION: contextvars.ContextVar[Cancellation | None] = contextvars.ContextVar("specpipe_cancel", default=None)


@contextlib.contextmanager
def cancel_scope(cancellation: Cancellation | None) -> Iterator[None]:
    """Calls made inside are cancelled with cancellation (None: never, as cleanup must not be)."""
    token = _CANCELLATION.set(cancellation)
    try:
        yield
    finally:
        _CANCELLATION.reset(token)


def current_cancellation() -> Cancellation | None:
    return _CANCELLATION.get()


def check_cancelled(what: str) -> None:
    """Cancelled when the scope's caller has gone."""
    cancellation = _CANCELLATION.get()
    if cancellation is not None and cancellation.cancelled:
        raise Cancelled(f"{what}: the caller went away")


NO_DEADLINE_S = 1e9  # more time left than this is no deadline at all


def client_time_left(remaining_s: float | None) -> float | None:
    """A server context's time_remaining() -> seconds, None for a call without a deadline: grpc reports
    such a call as about 9.2e18 s left, which as a call's timeout overflows into one already passed
    (and as a lock's timeout raises OverflowError)."""
    return None if remaining_s is None or remaining_s > NO_DEADLINE_S else remaining_s


@contextlib.contextmanager
def deadline_scope(remaining_s: float | None) -> Iterator[None]:
    """Calls made inside (and in ContextPool tasks submitted inside) end within remaining_s."""
    token = _DEADLINE.set(None if remaining_s is None else time.monotonic() + remaining_s)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def call_timeout(timeout_s: float | None, what: str) -> float | None:
    """A call's deadline in seconds: its own timeout_s, shortened to the scope's time left;
    DeadlineExceeded when none is left (the call would fail on the peer anyway)."""
    left = time_left()
    if left == float("inf"):
        return timeout_s
    if left <= 0:
        raise DeadlineExceeded(f"{what}: the client's deadline has passed")
    return left if timeout_s is None else min(timeout_s, left)


def time_left() -> float:
    """Seconds until the scope's deadline (may be <= 0), inf without one."""
    deadline = _DEADLINE.get()
    return float("inf") if deadline is None else deadline - time.monotonic()


T = TypeVar("T")  # what a submitted task returns


class ContextPool(ThreadPoolExecutor):
    """A thread pool whose tasks run in the submitter's context (its deadline)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def random_seed() -> int:
    """A seed for a request that gives none: every such client gets its own sample."""
    return secrets.randbits(63) + 1  # never 0, the wire's "unset"


def idle(last_used: Mapping[str, float], now: float, ttl_s: float) -> list[str]:
    """The sessions whose last use is more than ttl_s before now."""
    return [sid for sid, used in last_used.items() if now - used > ttl_s]


def evict_idle(sessions: MutableMapping[str, Any], ttl_s: float) -> int:
    """Drop the sessions (objects with a monotonic last_used) idle for more than ttl_s; the caller
    holds the lock of sessions. Returns how many."""
    gone = idle({sid: session.last_used for sid, session in sessions.items()}, time.monotonic(), ttl_s)
    for sid in gone:
        del sessions[sid]
    return len(gone)


class Sweeper:
    """Calls sweep() (a bound method) every period_s on a daemon thread until close() or until its
    object is gone: sessions whose clients went away without releasing them are evicted even when
    no new session arrives."""

    def __init__(self, sweep: Callable[[], object], period_s: float, name: str):
        self._sweep = weakref.WeakMethod(sweep)  # the sweeper must not keep a verifier alive
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            sweep = self._sweep()
            if sweep is None:
                return
            try:
                sweep()
            except Exception:  # a failed sweep is retried next period
                log.exception("session sweep failed")
            del sweep

    def close(self) -> None:
        self._stop.set()


def sweep_period(ttl_s: float) -> float:
    """A session lives at most ttl_s + one period: a quarter of the TTL, within [0.05 s, 30 s]."""
    return min(30.0, max(0.05, ttl_s / 4))


def freeze_startup_heap() -> int:
    """Move what is alive once a service has started (its model, torch's and transformers' modules:
    some 400,000 objects) to the collector's permanent generation, as vLLM and SGLang do after their
    warm-up. A full collection then walks only what serving made since: over the start-up heap it
    held the GIL for about 0.25 s on a CPU, every stream of the process waiting, to find nothing there.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

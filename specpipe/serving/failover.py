"""Replicated roles behind the Verifier and Drafter protocols, so the generation loop needs no change.

Verifier: a session is pinned to one replica (its KV cache lives there), the least loaded when it
starts. The wrapper keeps the session's context (the prompt plus every verified token, recorded from
prefill and from each VerifyResult): that context is the truth, so a session lost with its replica
(it died, drains, restarted and forgot the session) is re-prefilled on another replica from it and the
verify is retried there. Greedy and sampled verification are pure functions of (seed, position), so
the retried round gives the same verdict: nothing is lost, repeated or changed. When no replica
takes the session (a lone verifier restarting), the re-prefill is retried with backoff for a while,
within the client's deadline, before the generation fails with UNAVAILABLE.

Drafter: any serving replica, preferring the one that drafted the session last (its KV cache is
synced already; a drafter resyncs by longest common prefix anyway). A failed replica costs this
draft's retry on another one; when none answers the generation goes on without a draft, and a failed
replica gets no drafts until its probe says SERVING again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from specpipe.core.errors import FailedPrecondition, ResourceExhausted, SpecpipeError, Unavailable
from specpipe.core.types import Draft, ModelInfo, ProposeRequest, ProposeResult, SamplingParams, VerifyResult
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import check_cancelled, time_left
from specpipe.serving.replicas import Probe, ReplicaSet

log = logging.getLogger("specpipe.serving.failover")

REPLICA_DOWN = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})  # the replica, not the request
SESSION_LOST = REPLICA_DOWN | {"FAILED_PRECONDITION"}  # unknown session / out of step: re-prefill
FULL = "RESOURCE_EXHAUSTED"  # admission refused: try the next replica
PROBE_TIMEOUT_S = 1.0  # a hung replica must not stall the refresh of the others
REOPEN_WAIT_S = 10.0   # every replica down (one verifier restarting): retry the prefill this long
BACKOFF_S = (0.05, 1.0)  # first and longest pause between those retries


def verifier_probe(client: Any) -> Probe:
    """Health plus the Load RPC: open sessions and queued work."""
    if client.health("", PROBE_TIMEOUT_S) != "SERVING":
        return Probe(serving=False)
    load = client.load(PROBE_TIMEOUT_S)
    return Probe(serving=True, load=load.open_sessions + load.queued)


def drafter_probe(client: Any) -> Probe:
    return Probe(serving=client.health("", PROBE_TIMEOUT_S) == "SERVING")


@contextlib.contextmanager
def calling(replicas: ReplicaSet, address: str) -> Iterator[Any]:
    """The replica's client, counted as one call in flight on it (its load as this process sees it)."""
    client = replicas.client(address)
    replicas.note_call(address, +1)
    try:
        yield client
    finally:
        replicas.note_call(address, -1)


def first_answer(replicas: ReplicaSet, method: str) -> Any:
    """client.method() of the first replica that answers (info(): every replica serves the same model)."""
    errors = []
    for address in replicas.candidates():
        try:
            return getattr(replicas.client(address), method)()
        except SpecpipeError as err:
            errors.append(f"{address}: {err}")
    raise Unavailable(f"no replica of {replicas.target} answered: " + ("; ".join(errors) or "none known"))


@dataclass
class PinnedSession:
    address: str        # the replica holding the session's KV cache
    context: list[int]  # prompt + every verified token: what a re-prefill starts from
    lock: threading.Lock = field(default_factory=threading.Lock)


class ReplicatedVerifier:
    """specpipe.core.protocols.Verifier over a ReplicaSet of verifier clients."""

    def __init__(self, replicas: ReplicaSet, max_failovers: int = 3, reopen_wait_s: float = REOPEN_WAIT_S):
        self.replicas = replicas
        self.max_failovers = max_failovers  # per round
        self.reopen_wait_s = reopen_wait_s  # how long a session waits for a down replica to come back
        self._sessions: dict[str, PinnedSession] = {}
        self._lock = threading.Lock()
        self._info: ModelInfo | None = None

    def info(self) -> ModelInfo:
        if self._info is None:
            self._info = first_answer(self.replicas, "info")
        return self._info

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        address = self._open(session_id, prompt_ids, avoid=None)
        with self._lock:
            self._sessions[session_id] = PinnedSession(address, list(prompt_ids))
        return len(prompt_ids)

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        session = self._session(session_id)
        with session.lock:
            self._before_round(session_id, session, context_len)
            return self._rounds(session_id, session, (context_len, draft, sampling), self.max_failovers + 1)

    def verify_async(self, session_id: str, context_len: int, draft: Draft,
                     sampling: SamplingParams) -> Callable[[], VerifyResult]:
        """verify(), the round sent now where the pinned replica's client can (its verify_async: over the
        stream of rounds), its result when the returned call is made, with the same failover; the session
        is held until then."""
        session = self._session(session_id)
        if getattr(self.replicas.client(session.address), "verify_async", None) is None:
            return lambda: self.verify(session_id, context_len, draft, sampling)  # a client that cannot send ahead
        session.lock.acquire()
        try:
            self._before_round(session_id, session, context_len)
            address = session.address
            start = self.replicas.client(address).verify_async
            self.replicas.note_call(address, +1)
            try:
                pending = start(session_id, context_len, draft, sampling)
            except BaseException:
                self.replicas.note_call(address, -1)
                raise
        except BaseException:
            session.lock.release()
            raise

        def result() -> VerifyResult:
            try:
                try:
                    verified = pending()
                finally:
                    self.replicas.note_call(address, -1)
            except SpecpipeError as err:
                if err.code not in SESSION_LOST or self.max_failovers == 0:
                    session.lock.release()
                    raise
                try:
                    self._lost(session_id, session, err)
                    return self._rounds(session_id, session, (context_len, draft, sampling), self.max_failovers)
                finally:
                    session.lock.release()
            session.context.extend(verified.emitted)
            session.lock.release()
            return verified

        return result

    def _before_round(self, session_id: str, session: PinnedSession, context_len: int) -> None:
        if context_len != len(session.context):
            raise FailedPrecondition(
                f"session {session_id!r} has {len(session.context)} tokens, the request assumes {context_len}")
        if self.replicas.should_leave(session.address):  # draining: move before the round, not after
            self._repin(session_id, session, "draining")

    def _rounds(self, session_id: str, session: PinnedSession, args: tuple[int, Draft, SamplingParams],
                attempts: int) -> VerifyResult:
        """The round on the session's replica, moved to another one after a loss, at most attempts times."""
        for attempt in range(attempts):
            try:
                with calling(self.replicas, session.address) as client:
                    result = client.verify(session_id, *args)
            except SpecpipeError as err:
                if err.code not in SESSION_LOST or attempt == attempts - 1:
                    raise
                self._lost(session_id, session, err)
                continue
            session.context.extend(result.emitted)
            return result
        raise AssertionError("unreachable")

    def _lost(self, session_id: str, session: PinnedSession, err: SpecpipeError) -> None:
        """A round failed for its replica (down, or the session lost there): move the session."""
        check_cancelled("verify")  # the caller left: not the replica's fault
        if err.code in REPLICA_DOWN:
            self.replicas.mark_failed(session.address, str(err))
        self._repin(session_id, session, err.code.lower())

    def release(self, session_id: str) -> bool:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        with calling(self.replicas, session.address) as client:
            return client.release(session_id)

    # --- internals -----------------------------------------------------------------------------

    def _session(self, session_id: str) -> PinnedSession:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise FailedPrecondition(f"unknown session {session_id!r}: prefill it first")
        return session

    def _open(self, session_id: str, context: Sequence[int], avoid: str | None) -> str:
        """Prefill context on the least-loaded replica that takes it; avoid only as a last resort.
        When every replica is down (a lone verifier restarting), retry with backoff for up to
        reopen_wait_s, never past the client's deadline; then UNAVAILABLE. Replicas that are up but
        full are not waited for: RESOURCE_EXHAUSTED, the caller's cue to back off (not to fail over)."""
        give_up = time.monotonic() + self.reopen_wait_s
        pause = BACKOFF_S[0]
        while True:
            address, errors, all_down = self._try_open(session_id, context, avoid)
            if address is not None:
                return address
            if errors and not all_down:
                raise ResourceExhausted(f"every verifier replica of {self.replicas.target} that is up is full: "
                                        + "; ".join(errors))
            wait = min(pause, give_up - time.monotonic(), time_left())
            if not errors or wait <= 0:
                raise Unavailable(f"no verifier replica of {self.replicas.target} took the session: "
                                  + ("; ".join(errors) or "none known"))
            time.sleep(wait)
            pause = min(2 * pause, BACKOFF_S[1])

    def _try_open(self, session_id: str, context: Sequence[int], avoid: str | None
                  ) -> tuple[str | None, list[str], bool]:
        """One pass over the replicas: (the one that took the session or None, the errors, whether
        every error said the replica is down)."""
        order = self.replicas.candidates(exclude=(avoid,) if avoid else ())
        errors, all_down = [], True
        for address in order + ([avoid] if avoid else []):
            try:
                with calling(self.replicas, address) as client:
                    if address == avoid:  # back where it was (a lone replica): free what the session left there
                        with contextlib.suppress(SpecpipeError):
                            client.release(session_id)
                    client.prefill(session_id, context)
            except SpecpipeError as err:
                if err.code not in REPLICA_DOWN | {FULL}:
                    raise
                check_cancelled("prefill")  # the caller left: not the replica's fault
                if err.code in REPLICA_DOWN:
                    self.replicas.mark_failed(address, str(err))
                all_down &= err.code in REPLICA_DOWN
                errors.append(f"{address}: {err}")
                continue
            self.replicas.note_pinned(address)
            return address, errors, all_down
        return None, errors, all_down

    def _repin(self, session_id: str, session: PinnedSession, reason: str) -> None:
        """Re-prefill the session's context on another replica (the same one only if it is the last)."""
        old = session.address
        if reason != "deadline_exceeded":  # a live replica frees the KV now; a hung one would stall us
            with contextlib.suppress(SpecpipeError, ValueError), calling(self.replicas, old) as client:
                client.release(session_id)
        session.address = self._open(session_id, session.context, avoid=old)
        metrics.VERIFIER_FAILOVERS.labels(reason=reason).inc()
        log.warning("session moved to another verifier replica",
                    extra={"session_id": session_id, "from": old, "to": session.address, "reason": reason,
                           "context_len": len(session.context)})


class ReplicatedDrafter:
    """specpipe.core.protocols.Drafter over a ReplicaSet of drafter clients, for one draft method."""

    def __init__(self, replicas: ReplicaSet, method: str = "", attempts: int = 2):
        self.replicas = replicas
        self.method = method
        self.attempts = attempts  # replicas tried per proposal
        self._last: dict[str, str] = {}     # session -> replica that drafted it last
        self._used: dict[str, set[str]] = {}  # session -> replicas that hold its drafter state
        self._lock = threading.Lock()

    def info(self) -> ModelInfo:
        return first_answer(self.replicas, "info")

    def propose(self, request: ProposeRequest) -> ProposeResult:
        session_id = request.session_id
        with self._lock:
            prefer = self._last.get(session_id)
        # Serving replicas only: a failed or partitioned one costs one call's timeout, then drafts
        # skip it until a probe says SERVING again (a draft is never worth waiting for).
        order = [a for a in self.replicas.candidates(prefer=prefer) if self.replicas.usable(a)][: self.attempts]
        if not order:
            raise Unavailable(f"no drafter replica of {self.replicas.target} is serving")
        for i, address in enumerate(order):
            try:
                with calling(self.replicas, address) as client:
                    result = client.with_method(self.method).propose(request)
            except SpecpipeError as err:
                if err.code not in REPLICA_DOWN:
                    raise  # ABORTED (a stale epoch) and bad requests are the caller's
                check_cancelled("propose")
                self.replicas.mark_failed(address, str(err))
                if i == len(order) - 1:
                    raise
                metrics.DRAFTER_FAILOVERS.inc()
                continue
            with self._lock:
                self._last[session_id] = address
                self._used.setdefault(session_id, set()).add(address)
            return result
        raise AssertionError("unreachable")

    def release(self, session_id: str) -> bool:
        with self._lock:
            self._last.pop(session_id, None)
            used = self._used.pop(session_id, set())
        released = False
        for address in used:
            with contextlib.suppress(SpecpipeError):
                released |= self.replicas.client(address).with_method(self.method).release(session_id)
        return released

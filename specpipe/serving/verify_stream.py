"""Rounds of many sessions over one gRPC stream between an orchestrator and a verifier replica
(`Verifier.VerifyStream`; docs/pipeline.md, "One stream of rounds").

A unary Verify call per session and round costs each side a call's setup and its threads' hand-offs,
which at GPU speed and tens of sessions cost more CPU than the rest of the round. Over one stream:

- client (VerifyMux): a verify call queues its tagged round and waits. The stream's request iterator,
  which grpcio drains on a thread of its own, sends every round queued since its last message as one
  VerifyBatch, so rounds that come back together leave together, with no wait added to any. A reader
  thread hands each reply to its caller by tag. A round's failure is its own status; a broken stream
  fails the rounds in flight with its status (UNAVAILABLE: the failover's cue) and the next round
  opens a new one.
- server (serve_rounds): a reader thread takes each VerifyBatch's rounds into the verifier's queue at
  once (Verifier.submit: they join the same forward); the handler's own thread finishes each round
  whose forward is over (accept / reject, rollback: the verdict) and sends the rounds of one forward as
  one VerifyBatchReply, while the scheduler's thread runs the next forward.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from specpipe.core import errors
from specpipe.core.protocols import RoundVerifier
from specpipe.core.types import RoundRequest, VerifyResult
from specpipe.runtime import cpu
from specpipe.serving import convert
from specpipe.v1 import verifier_pb2

log = logging.getLogger(__name__)

_END = object()   # the request stream ended
_STOP = object()  # the call is over (cancelled, the server stopping) or the process is exiting
POLL_S = 0.5      # how often a waiting handler looks whether the process is exiting
_exiting = threading.Event()
# Set before the interpreter joins the server's threads (threading's own hook: concurrent.futures joins
# them from one registered earlier, and these run in reverse order).
getattr(threading, "_register_atexit", lambda fn: None)(_exiting.set)


# --- client ---------------------------------------------------------------------------------------

@dataclass
class _Waiting:
    event: threading.Event = field(default_factory=threading.Event)
    reply: verifier_pb2.TaggedVerifyReply | None = None
    error: errors.SpecpipeError | None = None


class VerifyMux:
    """One verifier replica's stream of rounds, shared by every session of this process."""

    def __init__(self, open_stream: Callable[[Iterator[verifier_pb2.VerifyBatch]], Any],
                 to_error: Callable[[grpc.RpcError], errors.SpecpipeError]):
        """open_stream(requests) -> the call (a reply iterator); to_error(grpc.RpcError) -> SpecpipeError."""
        self._open_stream = open_stream
        self._to_error = to_error
        self._lock = threading.Condition()
        self._queue: list[verifier_pb2.TaggedVerify] = []
        self._waiting: dict[int, _Waiting] = {}
        self._tags = itertools.count(1)
        self._call: Any = None            # the open stream, or None
        self._stream: object | None = None  # a token of the open stream: its request iterator serves it only
        self._closed = False

    def verify(self, request: verifier_pb2.VerifyRequest, timeout_s: float | None, traceparent: str = "",
               ) -> verifier_pb2.VerifyReply:
        """Send request on the stream and wait for its reply (DEADLINE_EXCEEDED after timeout_s)."""
        return self.wait(self.send(request, traceparent), timeout_s)

    def send(self, request: verifier_pb2.VerifyRequest, traceparent: str = "") -> tuple[int, _Waiting]:
        """Queue request on the stream (opened if none is); wait() for its reply. traceparent: the
        round's trace context ("" untraced), carried in the round itself (the stream is every session's)."""
        waiting = _Waiting()
        with self._lock:
            if self._closed:
                raise errors.Unavailable("the verifier client is closed")
            tag = next(self._tags)
            self._waiting[tag] = waiting
            self._queue.append(verifier_pb2.TaggedVerify(tag=tag, request=request, traceparent=traceparent))
            if self._call is None:
                self._open()
            self._lock.notify()
        return tag, waiting

    def wait(self, sent: tuple[int, _Waiting], timeout_s: float | None) -> verifier_pb2.VerifyReply:
        """The reply to what send() queued (DEADLINE_EXCEEDED after timeout_s)."""
        tag, waiting = sent
        if not waiting.event.wait(timeout_s):
            with self._lock:
                self._waiting.pop(tag, None)
            raise errors.DeadlineExceeded(f"verify round: no reply on the verifier's stream within {timeout_s:g} s")
        if waiting.error is not None:
            raise waiting.error
        reply = waiting.reply
        assert reply is not None  # set with the event, unless error is
        if reply.code:
            raise errors.from_code(grpc.StatusCode(_status(reply.code)).name, reply.message)
        return reply.reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call, self._call, self._stream = self._call, None, None
            failed, self._waiting = self._waiting, {}
            self._lock.notify_all()
        if call is not None:
            call.cancel()
        for waiting in failed.values():
            waiting.error = errors.Unavailable("the verifier client is closed")
            waiting.event.set()

    def _open(self) -> None:
        """Open a stream (the lock held): its request iterator and its reader thread."""
        stream = self._stream = object()
        call = self._call = self._open_stream(self._requests(stream))
        threading.Thread(target=self._read, args=(call,), name="specpipe-verify-stream", daemon=True).start()

    def _requests(self, stream: object) -> Iterator[verifier_pb2.VerifyBatch]:
        """Every round queued since the last message, as one message (grpcio's thread drains this),
        for as long as its stream is the open one."""
        while True:
            with self._lock:
                while not self._queue and not self._closed and self._stream is stream:
                    self._lock.wait()
                if self._closed or self._stream is not stream:
                    return
                rounds, self._queue = self._queue, []
            yield verifier_pb2.VerifyBatch(rounds=rounds)

    def _read(self, call: Any) -> None:
        try:
            for batch in call:
                with self._lock:
                    found = [(self._waiting.pop(r.tag, None), r) for r in batch.replies]
                for waiting, reply in found:
                    if waiting is not None:  # None: its caller gave up (its timeout)
                        waiting.reply = reply
                        waiting.event.set()
            error: errors.SpecpipeError = errors.Unavailable("the verifier ended the stream of rounds")
        except grpc.RpcError as err:
            error = self._to_error(err)
        self._broken(call, error)

    def _broken(self, call: Any, error: errors.SpecpipeError) -> None:
        """The stream is over: fail every round waiting on it; the next round opens another."""
        with self._lock:
            if self._call is not call:
                return  # an older stream: its rounds failed with it already
            self._call = self._stream = None
            failed, self._waiting = self._waiting, {}
            self._queue.clear()
            self._lock.notify_all()
        for waiting in failed.values():
            waiting.error = error
            waiting.event.set()


def _status(code: int) -> tuple[int, str]:
    """grpc.StatusCode's value for a code number."""
    return next(s.value for s in grpc.StatusCode if s.value[0] == code)


# --- server ---------------------------------------------------------------------------------------

def serve_rounds(verifier: RoundVerifier, batches: Iterator[verifier_pb2.VerifyBatch], context: Any = None,
                 ) -> Iterator[verifier_pb2.VerifyBatchReply]:
    """The replies to a stream of round batches (see the module docstring). verifier: a
    SessionVerifier (submit, finish); one that runs one session per forward verifies on the reader.
    context: the call's (its end stops the replies)."""
    done: queue.SimpleQueue[Any] = queue.SimpleQueue()
    outstanding = _Count()
    if context is not None and hasattr(context, "add_callback"):
        context.add_callback(lambda: done.put(_STOP))
    reader = threading.Thread(target=_read_rounds, args=(verifier, batches, done, outstanding),
                              name="specpipe-verify-stream-reader", daemon=True)
    reader.start()
    ended = False
    try:
        while not (ended and outstanding.value == 0):
            items = _finished(done)
            if _STOP in items:
                return
            ended = ended or _END in items
            with cpu.hop("verifier", "stream"):
                replies = [_reply(verifier, item[0], item[1], outstanding) for item in items if item is not _END]
            del items  # the finished rounds (their sessions' KV slots) are not held while the next is awaited
            if replies:
                yield verifier_pb2.VerifyBatchReply(replies=replies)
    finally:
        if not (ended and outstanding.value == 0):  # the caller left: free the sessions of rounds still running
            threading.Thread(target=_drain, args=(verifier, done, outstanding, ended), daemon=True).start()


def _finished(done: queue.SimpleQueue[Any]) -> list[Any]:
    """The next finished round (or end, or _STOP) and those that finished with it: the rounds of one
    forward finish together, and leave in one reply."""
    items = [_next(done)]
    while True:
        try:
            items.append(done.get_nowait())
        except queue.Empty:
            return items


def _next(done: queue.SimpleQueue[Any]) -> Any:
    """The next finished round (or end); _STOP once the process is exiting (a stream nobody closed
    must not hold the interpreter's exit, which joins the server's threads)."""
    while True:
        try:
            return done.get(timeout=POLL_S)
        except queue.Empty:
            if _exiting.is_set():
                return _STOP


@dataclass
class _Count:
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.value += n


def _read_rounds(verifier: RoundVerifier, batches: Iterator[verifier_pb2.VerifyBatch], done: queue.SimpleQueue[Any],
                 outstanding: _Count) -> None:
    try:
        for batch in batches:
            with cpu.hop("verifier", "stream"):
                _submit(verifier, batch, done, outstanding)
    except grpc.RpcError:
        pass  # the caller left
    except Exception:
        log.exception("the stream of verify rounds failed")
    finally:
        done.put(_END)


def _submit(verifier: RoundVerifier, batch: verifier_pb2.VerifyBatch, done: queue.SimpleQueue[Any],
            outstanding: _Count) -> None:
    rounds: list[RoundRequest] = []
    for item in batch.rounds:
        try:
            request = item.request
            rounds.append(RoundRequest(request.session_id, request.context_len, convert.draft_from_proto(request.draft),
                                       convert.sampling_from_proto(request.sampling), item.tag, item.traceparent))
        except errors.SpecpipeError as err:
            outstanding.add(1)
            done.put((item.tag, err))
    if not verifier.batched:  # one session per forward: verify here, one at a time
        for r in rounds:
            outstanding.add(1)
            try:
                done.put((r.tag, verifier.verify(r.session_id, r.context_len, r.draft, r.sampling)))
            except errors.SpecpipeError as err:
                done.put((r.tag, err))
        return
    outstanding.add(len(rounds))
    for r, outcome in zip(rounds, verifier.submit(rounds, lambda pending: done.put((pending.tag, pending)))):
        if isinstance(outcome, Exception):
            done.put((r.tag, outcome))


def _reply(verifier: RoundVerifier, tag: int, outcome: Any, outstanding: _Count) -> verifier_pb2.TaggedVerifyReply:
    outstanding.add(-1)
    try:
        if isinstance(outcome, Exception):
            raise outcome
        result = outcome if isinstance(outcome, VerifyResult) else verifier.finish(outcome)
        return verifier_pb2.TaggedVerifyReply(tag=tag, reply=convert.verify_result_to_proto(result))
    except errors.SpecpipeError as err:
        return verifier_pb2.TaggedVerifyReply(tag=tag, code=grpc.StatusCode[err.code].value[0], message=str(err))
    except Exception as err:  # a bug fails its round, never the stream
        log.exception("a verify round failed")
        return verifier_pb2.TaggedVerifyReply(tag=tag, code=grpc.StatusCode.INTERNAL.value[0],
                                              message=f"internal error: {type(err).__name__}: {err}")


def _drain(verifier: RoundVerifier, done: queue.SimpleQueue[Any], outstanding: _Count, ended: bool) -> None:
    """After the caller left: finish (and drop) the rounds still running, so their sessions are free."""
    while not (ended and outstanding.value == 0):
        item = _next(done)
        if item is _STOP:
            if _exiting.is_set():
                return
            continue
        if item is _END:
            ended = True
        else:
            _reply(verifier, item[0], item[1], outstanding)

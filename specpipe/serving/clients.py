"""gRPC clients implementing the role protocols (specpipe.core.protocols), plus the public Generation
client. A failed call raises the same specpipe.core.errors exception the in-process object would."""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any, Callable, Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specpipe.core import errors, types
from specpipe.core.tenancy import TENANT_METADATA
from specpipe.runtime import cpu, tracing
from specpipe.runtime.lifecycle import call_timeout, check_cancelled, current_cancellation
from specpipe.serving import convert
from specpipe.serving.security import Tls, bearer_metadata
from specpipe.serving.server import MAX_MESSAGE_BYTES
from specpipe.serving.verify_stream import VerifyMux
from specpipe.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, generation_pb2_grpc, verifier_pb2, verifier_pb2_grpc

CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),         # detect a dead peer on an idle session
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_http_proxy", 0),              # services talk directly, never through an HTTP proxy
    ("grpc.initial_reconnect_backoff_ms", 100),  # a restarted peer is reached again within a second
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Each channel its own subchannels: from grpcio's process-wide pool, a new channel to a peer restarted
    # on the same address took the old peer's failed connection and its backoff, and failed at once.
    ("grpc.use_local_subchannel_pool", 1),
)


def channel(target: str, tls: Tls | None = None) -> grpc.Channel:
    """A channel to target: TLS (mutual with tls.cert) when tls is given, else plaintext; with tracing
    on, through the gRPC instrumentation's interceptor (specpipe.runtime.tracing)."""
    if tls is not None:
        name = (("grpc.ssl_target_name_override", tls.server_name),) if tls.server_name else ()
        made = grpc.secure_channel(target, tls.channel_credentials(), options=CHANNEL_OPTIONS + name)
    else:
        made = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    return tracing.traced_channel(made)  # with tracing on, a generation's calls carry its traceparent


def to_specpipe_error(err: grpc.RpcError) -> errors.SpecpipeError:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    name = code.name if code is not None else "UNKNOWN"
    return errors.from_code(name, details or name)


@contextlib.contextmanager
def rpc_errors() -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise to_specpipe_error(err) from None


@contextlib.contextmanager
def encoding(what: str) -> Iterator[None]:
    """A value the wire cannot carry (a token id beyond int32, a negative seed) is a bad argument."""
    try:
        yield
    except (ValueError, TypeError) as err:
        raise errors.InvalidArgument(f"{what} cannot be sent: {err}") from None


def _settled(call: Callable[..., types.VerifyResult], *args: Any) -> Callable[[], types.VerifyResult]:
    """call(*args) made now, its result (or its error) given when the returned call is made."""
    try:
        result = call(*args)
    except errors.SpecpipeError as err:
        error = err

        def failed() -> types.VerifyResult:
            raise error

        return failed
    return lambda: result


class Client:
    """A channel to one target; timeout_s is the per-call deadline (None = none); hop_delay_ms is
    latency added to each direction of every call (an emulated network, for benchmarks); tls: TLS
    (mutual with a client certificate) instead of plaintext."""

    def __init__(self, target: str, timeout_s: float | None = None, wait_for_ready: bool = False,
                 hop_delay_ms: float = 0.0, tls: Tls | None = None):
        self.target = target
        self.timeout_s = timeout_s
        self.wait_for_ready = wait_for_ready  # True: calls wait for the server (startup) instead of failing fast
        self.hop_delay_s = hop_delay_ms / 1e3
        self._channel = channel(target, tls)

    def _call(self, method: Any, request: Any, timeout_s: float | None = None, cancellable: bool = False) -> Any:
        """cancellable: a long call (a prefill), cancelled when the caller of the RPC it serves goes away
        (specpipe.runtime.lifecycle), and bounded only by that caller's deadline, not by the per-call one: its
        time grows with the prompt and with the verifier's load (chunks cut short while others decode),
        so a busy verifier would look dead. A short call just runs to its end (a future costs ~0.5 ms more)."""
        if self.hop_delay_s:
            time.sleep(self.hop_delay_s)  # the request's way
        what = f"{self.target} {type(request).__name__}"
        timeout_s = call_timeout(None if cancellable else timeout_s or self.timeout_s, what)  # the client's, if less
        cancellation = current_cancellation() if cancellable else None
        with rpc_errors():
            if cancellation is None:
                reply = method(request, timeout=timeout_s, wait_for_ready=self.wait_for_ready)
            else:
                check_cancelled(what)
                future = method.future(request, timeout=timeout_s, wait_for_ready=self.wait_for_ready)
                forget = cancellation.on_cancel(future.cancel)
                try:
                    reply = future.result()
                except grpc.FutureCancelledError:
                    raise errors.Cancelled(f"{what}: the caller went away") from None
                finally:
                    forget()
        if self.hop_delay_s:
            time.sleep(self.hop_delay_s)  # the reply's way
        return reply

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the channel connects; Unavailable after timeout_s."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise errors.Unavailable(f"{self.target} not reachable within {timeout_s:g} s") from None

    def health(self, service: str = "", timeout_s: float | None = None) -> str:
        """Health status name of a service ("" = the whole server): SERVING, NOT_SERVING, ..."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        reply = self._call(stub.Check, health_pb2.HealthCheckRequest(service=service), timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def close(self) -> None:
        self._close_streams()
        self._channel.close()

    def _close_streams(self) -> None:
        """Streams of this client's (VerifierClient's rounds)."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VerifierClient(Client):
    """specpipe.core.protocols.Verifier over gRPC. Rounds go over one stream shared by every session
    (specpipe.serving.verify_stream), or as unary calls with stream False or against a verifier that
    serves no stream."""

    def __init__(self, target: str, timeout_s: float | None = None, wait_for_ready: bool = False,
                 hop_delay_ms: float = 0.0, tls: Tls | None = None, stream: bool = True):
        super().__init__(target, timeout_s, wait_for_ready, hop_delay_ms, tls)
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._mux = VerifyMux(lambda requests: self._stub.VerifyStream(requests, wait_for_ready=self.wait_for_ready),
                              to_specpipe_error) if stream and not hop_delay_ms else None

    def info(self) -> types.ModelInfo:
        return convert.model_info_from_proto(self._call(self._stub.Info, verifier_pb2.VerifierInfoRequest()))

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        with encoding("prefill request"):
            request = verifier_pb2.PrefillRequest(session_id=session_id, prompt_ids=prompt_ids)
        return self._call(self._stub.Prefill, request, cancellable=True).context_len

    def verify(
        self, session_id: str, context_len: int, draft: types.Draft, sampling: types.SamplingParams
    ) -> types.VerifyResult:
        with cpu.hop("orchestrator", "verify_rpc"):  # encoding, the call's own CPU, decoding
            with encoding("verify request"):
                request = verifier_pb2.VerifyRequest(
                    session_id=session_id,
                    context_len=context_len,
                    draft=convert.draft_to_proto(draft),
                    sampling=convert.sampling_to_proto(sampling),
                )
            if self._mux is not None:
                try:
                    reply = self._mux.verify(request, call_timeout(self.timeout_s, f"{self.target} verify"),
                                             tracing.traceparent() if tracing.ACTIVE else "")
                    return convert.verify_result_from_proto(reply)
                except errors.SpecpipeError as err:
                    if err.code != "UNIMPLEMENTED":
                        raise
                    self._mux = None  # a verifier without the stream: unary calls from now on
            return convert.verify_result_from_proto(self._call(self._stub.Verify, request))

    def verify_async(
        self, session_id: str, context_len: int, draft: types.Draft, sampling: types.SamplingParams
    ) -> Callable[[], types.VerifyResult]:
        """verify(), its round sent now on the stream and its result when the returned call is made (the
        caller works meanwhile: the orchestrator streams the previous round's tokens); without the
        stream, verified now."""
        mux = self._mux
        if mux is None:
            return _settled(self.verify, session_id, context_len, draft, sampling)
        with cpu.hop("orchestrator", "verify_rpc"):
            with encoding("verify request"):
                request = verifier_pb2.VerifyRequest(session_id=session_id, context_len=context_len,
                                                     draft=convert.draft_to_proto(draft),
                                                     sampling=convert.sampling_to_proto(sampling))
            timeout_s = call_timeout(self.timeout_s, f"{self.target} verify")
            sent = mux.send(request, tracing.traceparent() if tracing.ACTIVE else "")

        def result() -> types.VerifyResult:
            with cpu.hop("orchestrator", "verify_rpc"):
                try:
                    return convert.verify_result_from_proto(mux.wait(sent, timeout_s))
                except errors.SpecpipeError as err:
                    if err.code != "UNIMPLEMENTED":
                        raise
            self._mux = None  # a verifier without the stream: unary calls from now on
            return self.verify(session_id, context_len, draft, sampling)

        return result

    def release(self, session_id: str) -> bool:
        return self._call(self._stub.Release, common_pb2.ReleaseRequest(session_id=session_id)).released

    def _close_streams(self) -> None:
        if self._mux is not None:
            self._mux.close()

    def load(self, timeout_s: float | None = None) -> Any:
        """The replica's load (specpipe.serving.replicas.VerifierLoad), for least-loaded routing."""
        from specpipe.serving.replicas import VerifierLoad

        reply = self._call(self._stub.Load, verifier_pb2.LoadRequest(), timeout_s)
        return VerifierLoad(reply.open_sessions, reply.max_sessions, reply.queued)


class DrafterClient(Client):
    """specpipe.core.protocols.Drafter over gRPC: one draft method (ModelInfo.methods) of a drafter service."""

    def __init__(self, target: str, timeout_s: float | None = None, wait_for_ready: bool = False, method: str = "",
                 hop_delay_ms: float = 0.0, tls: Tls | None = None):
        super().__init__(target, timeout_s, wait_for_ready, hop_delay_ms, tls)
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)
        self.method = method  # "" = the service's first method

    def info(self) -> types.ModelInfo:
        return convert.model_info_from_proto(self._call(self._stub.Info, drafter_pb2.DrafterInfoRequest()))

    def propose(self, request: types.ProposeRequest) -> types.ProposeResult:
        with cpu.hop("orchestrator", "draft_rpc"):  # encoding, the call's own CPU, decoding
            with encoding("propose request"):
                message = convert.propose_request_to_proto(request, self.method)
            return convert.propose_result_from_proto(self._call(self._stub.Propose, message))

    def release(self, session_id: str) -> bool:
        return self._call(self._stub.Release, common_pb2.ReleaseRequest(session_id=session_id)).released

    def with_method(self, method: str) -> DrafterClient:
        """This client on the same channel for another draft method (closing either closes both)."""
        if method == self.method:
            return self
        other = copy.copy(self)
        other.method = method
        return other


class GenerationClient(Client):
    """The public API: a stream of verified chunks for one prompt."""

    def __init__(self, target: str, timeout_s: float | None = None, wait_for_ready: bool = False,
                 tls: Tls | None = None, auth_token: str | None = None):
        super().__init__(target, timeout_s, wait_for_ready, tls=tls)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._auth = bearer_metadata(auth_token)  # the public API's bearer token, if it requires one

    def generate(
        self,
        prompt: str | None = None,
        messages: Sequence[tuple[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        max_new_tokens: int = 64,
        stop: Sequence[str] = (),
        sampling: types.SamplingParams = types.GREEDY,
        speculation: types.SpeculationOptions | None = None,  # None = the server's defaults
        request_id: str = "",
        tenant: str = "",
        traceparent: str = "",
    ) -> Iterator[types.GenerationChunk]:
        """Exactly one of prompt / messages / token_ids (none: the server answers INVALID_ARGUMENT).
        Closing the iterator early cancels the RPC, which releases the sessions on the server.
        traceparent: a W3C trace context, the parent of the generation's trace (docs/observability.md)."""
        source = convert.GenerateInput(
            prompt=prompt,
            messages=tuple(messages) if messages is not None else None,
            token_ids=tuple(token_ids) if token_ids is not None else None,
        )
        if sum(x is not None for x in (prompt, messages, token_ids)) > 1:
            raise errors.InvalidArgument("give exactly one of prompt, messages or token_ids")
        with encoding("generate request"):
            request = convert.generate_request_to_proto(source, max_new_tokens, request_id, stop, sampling, speculation)
        metadata = self._auth + (((TENANT_METADATA, tenant),) if tenant else ())  # tenant: specpipe.core.tenancy
        metadata += ((tracing.TRACEPARENT, traceparent),) if traceparent else ()
        call = self._stub.Generate(request, timeout=self.timeout_s, wait_for_ready=self.wait_for_ready,
                                   metadata=metadata or None)
        return self._chunks(call)

    @staticmethod
    def _chunks(call: Any) -> Iterator[types.GenerationChunk]:
        try:
            with rpc_errors():
                for msg in call:
                    yield convert.chunk_from_proto(msg)
        finally:
            call.cancel()  # no-op once the stream has ended

"""The one server bootstrap of every service: a gRPC server with its servicers, the standard health
service (grpc.health.v1, what Kubernetes probes), reflection, Prometheus metrics over HTTP, and a
graceful drain on SIGTERM / SIGINT. Also `rpc_method`, the one place where errors become statuses.

Drain (what Kubernetes does to a pod it stops): health turns NOT_SERVING for every service, calls
that start new work (NEW_WORK: a session, a stream, a draft) are refused with UNAVAILABLE so the
caller goes to another replica, calls already running (rounds of open sessions, Generate streams)
finish for up to drain_timeout_s, then the server stops.
"""

from __future__ import annotations

import functools
import inspect
import logging
import signal
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specpipe.config.limits import DEFAULT_LIMITS
from specpipe.config.services import ServeConfig
from specpipe.core.errors import SpecpipeError, Unavailable
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import Cancellation, cancel_scope
from specpipe.serving.security import Tls, TokenAuth

log = logging.getLogger("specpipe.serving")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a taken port is an error, not a silently shared one
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),  # accept client keepalives (30 s)
)


@dataclass(frozen=True)
class Service:
    """One servicer and how to mount it."""

    name: str                                        # full proto name, e.g. "specpipe.v1.Verifier"
    servicer: object
    add_to_server: Callable[[object, grpc.Server], None]


SERVE = ServeConfig()  # the settings' defaults (specpipe.config.services)


@dataclass(frozen=True)
class ServerConfig:
    host: str = SERVE.host
    port: int = SERVE.port           # 0 = a free port
    metrics_port: int | None = None  # Prometheus HTTP; None = off, 0 = a free port
    max_workers: int = SERVE.max_workers  # concurrent RPCs (a Generate stream holds one for its lifetime)
    grace_s: float = 5.0             # in-flight RPCs get this long on stop
    max_request_bytes: int = DEFAULT_LIMITS.max_request_bytes  # a larger request: RESOURCE_EXHAUSTED, unread
    tls: Tls | None = None           # None = plaintext; with a CA, mutual TLS (specpipe.serving.security)
    auth_token: str | None = None    # the services (not health, reflection) require "authorization: Bearer <it>"
    reflection: bool = False         # server reflection (grpcurl without protos): off unless asked for
    drain_timeout_s: float = SERVE.drain_timeout_s  # on SIGTERM: how long running calls may go on before the stop
    health_port: int | None = None   # also serve grpc.health.v1 alone, in plaintext, here (probes that
                                     # speak no TLS: Kubernetes' gRPC probes); None = off, 0 = a free port


# Calls refused while draining: each starts work a replica would have to carry past its end.
NEW_WORK = frozenset({"/specpipe.v1.Verifier/Prefill", "/specpipe.v1.Generation/Generate",
                      "/specpipe.v1.Drafter/Propose"})


def service_name(pb2_module: Any, name: str) -> str:
    return pb2_module.DESCRIPTOR.services_by_name[name].full_name


# --- errors -> statuses ------------------------------------------------------------------------

def _fail(context: grpc.ServicerContext, method: str, err: Exception) -> None:
    """Abort the RPC with err's status. A bad request fails only itself, never the server."""
    if isinstance(err, SpecpipeError):
        log.info("rpc failed", extra={"rpc": method, "code": err.code, "error": str(err)})
        context.abort(grpc.StatusCode[err.code], str(err))
    log.exception("unexpected error", extra={"rpc": method})
    context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error: {type(err).__name__}: {err}")


def _aborted_already(context: grpc.ServicerContext) -> bool:
    code = getattr(context, "code", None)
    return callable(code) and code() is not None


def rpc_cancellation(context: Any) -> Cancellation | None:
    """A Cancellation set when the RPC ends before its handler does (the caller cancelled, its deadline
    passed); None where the context cannot tell (Ray Serve's)."""
    add_callback = getattr(context, "add_callback", None)
    if add_callback is None:
        return None
    cancellation = Cancellation()
    if not add_callback(cancellation.cancel):  # the RPC has ended already
        cancellation.cancel()
    return cancellation


F = TypeVar("F", bound=Callable[..., Any])  # a servicer method


def rpc_method(fn: F) -> F:
    """Servicer method decorator: SpecpipeError -> its status, anything else -> INTERNAL (logged).
    The handler runs in its RPC's cancellation scope (specpipe.runtime.lifecycle)."""
    method = fn.__qualname__
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(self: Any, request: Any, context: Any) -> Iterator[Any]:
            try:
                with cancel_scope(rpc_cancellation(context)):
                    yield from fn(self, request, context)
            except Exception as err:  # GeneratorExit (client gone) is not an Exception: it passes
                if _aborted_already(context):
                    raise
                _fail(context, method, err)

        return cast(F, stream)

    @functools.wraps(fn)
    def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            with cancel_scope(rpc_cancellation(context)):
                return fn(self, request, context)
        except Exception as err:
            if _aborted_already(context):
                raise
            _fail(context, method, err)

    return cast(F, unary)


# --- drain and in-flight accounting ------------------------------------------------------------

class _Drain(grpc.ServerInterceptor):
    """Counts the calls of the served services in flight and refuses NEW_WORK while draining."""

    def __init__(self, service_names: tuple[str, ...]):
        self._prefixes = tuple(f"/{name}/" for name in service_names)  # not health / reflection
        self._inflight = 0
        self._idle = threading.Condition()
        self.draining = threading.Event()

    @property
    def inflight(self) -> int:
        return self._inflight

    def wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        if self.draining.is_set() and method in NEW_WORK:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{method}: this replica is draining (shutting down); "
                          "retry on another replica")
        with self._idle:
            self._inflight += 1
        metrics.RPC_INFLIGHT.labels(method=method[1:]).inc()

    def _exit(self, method: str, start: float) -> None:
        metrics.RPC_INFLIGHT.labels(method=method[1:]).dec()
        metrics.RPC_SECONDS.labels(method=method[1:]).inc(time.perf_counter() - start)
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefixes):
            return handler
        if handler.unary_unary is not None:
            def unary(request, context):
                self._enter(method, context)
                start = time.perf_counter()
                try:
                    return handler.unary_unary(request, context)
                finally:
                    self._exit(method, start)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            def stream(request, context):
                self._enter(method, context)
                start = time.perf_counter()
                try:
                    yield from handler.unary_stream(request, context)
                finally:
                    self._exit(method, start)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler  # no client-streaming calls in specpipe's protos


# --- bootstrap ---------------------------------------------------------------------------------

class ServerHandle:
    """A started server. `port` / `address` are the bound ones (useful with port 0)."""

    def __init__(self, server: grpc.Server, health_servicer: health.HealthServicer, config: ServerConfig,
                 port: int, service_names: tuple[str, ...], drain: _Drain, metrics_http: Any = None,
                 health_server: tuple[grpc.Server, int] | None = None) -> None:
        self.server = server
        self._health_server: grpc.Server | None = health_server[0] if health_server else None
        self.health_port: int | None = health_server[1] if health_server else None
        self._drain = drain
        self.health = health_servicer
        self.config = config
        self.port = port
        self.service_names = service_names
        self._metrics_http = metrics_http
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_http.server_port if self._metrics_http is not None else None

    @property
    def draining(self) -> bool:
        return self._drain.draining.is_set()

    @property
    def inflight(self) -> int:
        """Calls of the served services running now (not health checks)."""
        return self._drain.inflight

    def drain(self, timeout_s: float | None = None) -> bool:
        """NOT_SERVING, refuse new work, wait up to timeout_s for running calls; True if they all ended.
        The server keeps listening (running sessions' rounds still come in) until stop()."""
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        if not self._drain.draining.is_set():
            self._drain.draining.set()
            metrics.DRAINING.set(1)
            self.health.enter_graceful_shutdown()
            log.info("draining", extra={"services": list(self.service_names), "inflight": self.inflight,
                                        "timeout_s": timeout_s})
        idle = self._drain.wait_idle(timeout_s)
        if not idle:
            log.warning("drain timed out", extra={"inflight": self.inflight, "timeout_s": timeout_s})
        return idle

    def stop(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING first (load balancers stop sending), then let in-flight RPCs finish."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(self.config.grace_s if grace_s is None else grace_s).wait()
        if self._health_server is not None:
            self._health_server.stop(0).wait()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        log.info("server stopped", extra={"services": list(self.service_names), "port": self.port})

    def wait(self) -> None:
        """Block until SIGTERM / SIGINT (handlers installed when called from the main thread), then
        drain (up to config.drain_timeout_s) and stop."""
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: stop.set())
        while not stop.wait(0.1) and not self._stopped.is_set():
            pass
        if not self._stopped.is_set():
            self.drain()
        self.stop()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=0)


def _health_only(health_servicer: health.HealthServicer, host: str, port: int) -> tuple[grpc.Server, int]:
    """A plaintext server of the health service alone (the same statuses, drain included): what it
    tells, SERVING or not, is no secret, and no other service is reachable through it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=(("grpc.so_reuseport", 0),))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = _listen(server, host, port)
    server.start()
    return server, port


def _listen(server: grpc.Server, host: str, port: int, tls: Tls | None = None) -> int:
    """Bind server to host:port (TLS or plaintext); the bound port, or UNAVAILABLE."""
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, tls.server_credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as err:
        raise Unavailable(f"cannot listen on {address}: {err}") from None
    if bound == 0:
        raise Unavailable(f"cannot listen on {address} (in use?)")
    return bound


def serve(services: Sequence[Service], config: ServerConfig = ServerConfig()) -> ServerHandle:
    """Start a server with the given (ready) servicers; health turns SERVING once it listens."""
    options = tuple(o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length")
    options += (("grpc.max_receive_message_length", config.max_request_bytes),)
    names = tuple(s.name for s in services)
    drain = _Drain(names)
    auth = [TokenAuth(config.auth_token, names)] if config.auth_token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=config.max_workers), options=options,
                         interceptors=(*auth, drain))
    for service in services:
        service.add_to_server(service.servicer, server)

    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection:
        reflection.enable_server_reflection(names + (health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    port = _listen(server, config.host, config.port, config.tls)

    metrics_http = None
    if config.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            metrics_http, _ = start_http_server(config.metrics_port, addr=config.host)
        except OSError as err:
            raise Unavailable(f"cannot serve metrics on {config.host}:{config.metrics_port}: {err}") from None

    health_server = (_health_only(health_servicer, config.host, config.health_port)
                     if config.health_port is not None else None)
    server.start()
    for name in names + ("",):  # "" = the whole server
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    handle = ServerHandle(server, health_servicer, config, port, names, drain, metrics_http, health_server)
    log.info("server started", extra={"services": list(names), "address": handle.address,
                                      "metrics_port": handle.metrics_port})
    return handle

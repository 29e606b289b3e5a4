"""An ASGI application (the orchestrator's OpenAI-compatible API) served by uvicorn on a thread of its
own, beside a gRPC server: the same host, the same TLS files (no client certificates: the public API's
clients bring a bearer token), stopped with it.

Slow clients and floods (docs/http-api.md, "Overload and slow clients", HttpLimits). uvicorn bounds
neither how long a request's headers may take nor how many connections it holds open (its
limit_concurrency answers 503 once a request's headers are in, and counts nothing before), so its
HTTP/1.1 protocol (h11) is extended here:
- a connection beyond max_connections is answered 503 and closed at once, so a flood of HTTP
  connections never takes the file descriptors the gRPC server beside it needs;
- a request's headers must arrive within header_timeout_s of its first byte (or of the connection,
  for its first request), else 408 and the connection closes (slowloris);
- malformed HTTP is answered in the OpenAI error shape (uvicorn's own answer is plain text);
and in ASGI (BodyDeadline) a request's body must arrive within body_timeout_s of its headers (408).
The body's size is the application's to bound (FastAPI's max_body_size: a Content-Length over it is
refused before any byte is read, a body without one is cut at the cap).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from http import HTTPStatus
from typing import Any

from specpipe.config.limits import DEFAULT_HTTP, HttpLimits
from specpipe.config.services import TlsFiles
from specpipe.core.errors import Unavailable
from specpipe.runtime import metrics

log = logging.getLogger(__name__)


def raw_response(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    """A whole HTTP/1.1 answer in the OpenAI error shape that closes the connection (written before,
    or instead of, what the protocol would write)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def guarded_protocol(limits: HttpLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the connection cap and the header timeout of limits."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            if limits.max_connections and len(self.server_state.connections) >= limits.max_connections:
                self.transport = transport  # what connection_lost closes
                metrics.HTTP_REFUSED.labels(reason="connections").inc()
                transport.write(raw_response(503, f"this server holds {limits.max_connections} connections "
                                             "(--http-max-connections); retry later", "service_unavailable"))
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a request's headers are in
                self._disarm()
            elif self.cycle is None or self.cycle.response_complete:  # a request's headers are coming
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(raw_response(400, f"malformed HTTP request: {msg}"))
            self.transport.close()

        def _arm(self) -> None:
            if limits.header_timeout_s and self._header_timer is None:
                self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                metrics.HTTP_REFUSED.labels(reason="header_timeout").inc()
                self.transport.write(raw_response(408, f"the request's headers did not arrive within "
                                                  f"{limits.header_timeout_s:g} s (--http-header-timeout)"))
                self.transport.close()

    return GuardedH11Protocol


class BodyDeadline:
    """ASGI middleware: a request's body must arrive within timeout_s of its headers, else 408 (the
    application's error handler answers, as for any HTTPException raised while reading the body)."""

    def __init__(self, app: Any, timeout_s: float):
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.timeout_s:
            return await self.app(scope, receive, send)
        deadline = time.monotonic() + self.timeout_s
        reading = True

        async def timed_receive() -> dict[str, Any]:
            nonlocal reading
            if not reading:  # after the body: the disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                from starlette.exceptions import HTTPException

                metrics.HTTP_REFUSED.labels(reason="body_timeout").inc()
                raise HTTPException(408, f"the request's body did not arrive within {self.timeout_s:g} s "
                                    "(--http-body-timeout)") from None
            reading = message["type"] == "http.request" and message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)


class HttpServer:
    def __init__(self, app: Any, host: str, port: int, tls_files: TlsFiles | None = None,
                 limits: HttpLimits = DEFAULT_HTTP):
        """tls_files: the certificate and key to serve HTTPS with; None: plain HTTP."""
        import uvicorn

        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as err:
            self._socket.close()
            raise Unavailable(f"cannot serve HTTP on {host}:{port}: {err}") from None
        self.host, self.port = host, self._socket.getsockname()[1]
        cert, key = (tls_files.cert, tls_files.key) if tls_files is not None else (None, None)
        self.scheme = "https" if cert else "http"
        config = uvicorn.Config(BodyDeadline(app, limits.body_timeout_s), http=guarded_protocol(limits), ws="none",
                                log_level="warning", access_log=False, lifespan="off",
                                ssl_certfile=cert if cert else None, ssl_keyfile=key if cert else None,
                                timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="specpipe-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise Unavailable(f"the HTTP server on {host}:{self.port} did not start")
        log.info("http server started", extra={"url": self.url})

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._server.server_state.connections)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

"""An ASGI application (the orchestrator's OpenAI-compatible API) served by uvicorn on a thread of its
own, beside a gRPC server: the same host, the same TLS files (no client certificates: the public API's
clients bring a bearer token), stopped with it."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from specpipe.config.services import TlsFiles
from specpipe.core.errors import Unavailable

log = logging.getLogger(__name__)


class HttpServer:
    def __init__(self, app: Any, host: str, port: int, tls_files: TlsFiles | None = None) -> None:
        """tls_files: specpipe.config.services.TlsFiles (cert and key), or None for plain HTTP."""
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
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
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

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

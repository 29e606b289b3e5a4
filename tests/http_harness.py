"""Helpers for the HTTP API's tests: a served app over a generator, raw sockets for what no HTTP client
sends (half-sent headers, a body that never ends, a Content-Length that lies), and the invariants every
case ends with: never a 500, an answer within the timeouts, the server healthy afterwards."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httpx

from orchestrator.openai_api import ApiConfig, create_app
from orchestrator.request_path import RequestPath
from specpipe.config.limits import DEFAULT_HTTP
from specpipe.serving.http import HttpServer

MODEL = "tiny"


@contextlib.contextmanager
def api(generator, admission=None, token=None, draining=lambda: False, limits=DEFAULT_HTTP, **config):
    """The OpenAI-compatible API over generator (and admission), on a free loopback port."""
    app = create_app(RequestPath(generator, admission), ApiConfig(MODEL, token, **config), draining)
    server = HttpServer(app, "127.0.0.1", 0, limits=limits)
    try:
        yield server
    finally:
        server.stop()


def connect(server, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=timeout_s)


def exchange(server, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send data on a fresh connection and read until the server closes it (or timeout_s passes)."""
    with connect(server, timeout_s) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before all is sent
            sock.sendall(data)
        return read_all(sock, timeout_s)


def read_all(sock: socket.socket, timeout_s: float) -> bytes:
    deadline, received = time.monotonic() + timeout_s, b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            part = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:  # reset: what came before it counts
            break
        if not part:
            break
        received += part
    return received


def status_of(answer: bytes) -> int | None:
    """The status of a raw HTTP/1.1 answer, None if none came."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else None


def error_of(answer: bytes) -> dict:
    """The OpenAI error of a raw answer (a KeyError if it is not in that shape)."""
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A raw POST whose body is exactly these bytes."""
    head = {"host": "t", "content-type": "application/json", "content-length": str(len(body)), **(headers or {})}
    return (f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + body


def assert_healthy(server, valid: dict | None = None) -> None:
    """/health answers and a valid request is served (after any case)."""
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    body = valid or {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] >= 1

"""A real redis-server on a free loopback port in a temp dir, for tests (never the machine's Redis).

    from tests.redis_harness import redis_url  # noqa: F401  (the session-scoped fixture)

    def test_x(redis_url): ...

    with redis_server() as server:  # a private one, e.g. to stop it mid-test
        server.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

import pytest

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def redis_server(timeout_s: float = 10.0, port: int | None = None) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port (or the given one, to restart a stopped server)."""
    if REDIS_SERVER is None:
        if os.environ.get("CI"):  # .ci/run installs it: in CI a missing server is a failure, not a skip
            raise RuntimeError("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with tempfile.TemporaryDirectory(prefix="specpipe-redis-") as tmp:
        port = port or free_port()
        process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", tmp, "--logfile", f"{tmp}/redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        server = RedisServer(process, port)
        try:
            deadline = time.monotonic() + timeout_s
            while not _ping(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start (exit {process.poll()})")
                time.sleep(0.05)
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as server:
        yield server.url

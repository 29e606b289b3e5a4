"""A private redis-server on a free loopback port, without persistence, in a temp dir: the n-gram store
of `specpipe up --cache redis` and of the tests (never the machine's own Redis).

    with local_redis() as server:   # or: server = start(); ...; server.stop()
        cache = RedisNgramCache.from_url(server.url)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import quote, urlencode

from specpipe.core.errors import FailedPrecondition, Unavailable

HOST = "127.0.0.1"
NOT_FOUND = "redis-server not found; install it (apt-get install redis-server) or pass --cache redis://HOST:PORT"
LOG_TAIL_LINES = 10


def find_binary() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class RedisTls:
    """TLS files of a redis-server: clients connect with rediss:// and present a certificate (mTLS)."""

    cert: str
    key: str
    ca: str


@dataclass
class LocalRedis:
    process: subprocess.Popen
    port: int
    workdir: str  # its --dir and log file; removed by stop()
    password: str | None = None  # requirepass: the default user's password
    tls: RedisTls | None = None  # the port speaks TLS only

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """redis://[:password@]host:port, or rediss://... with the TLS files as query parameters (redis-py)."""
        credentials = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{credentials}{self.address}"
        files = urlencode({"ssl_ca_certs": self.tls.ca, "ssl_certfile": self.tls.cert, "ssl_keyfile": self.tls.key})
        return f"rediss://{credentials}{self.address}?{files}"

    def stop(self) -> None:
        """SIGTERM (redis shuts down at once: nothing to save), SIGKILL after 5 s; idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(port: int | None = None, timeout_s: float = 10.0, password: str | None = None,
          tls: RedisTls | None = None) -> LocalRedis:
    """Start redis-server on port (default: a free one) and wait until it answers PING. password:
    requirepass; tls: the port speaks TLS only, clients must present a certificate of tls.ca.
    FailedPrecondition when the binary is missing, Unavailable when it does not come up."""
    binary = find_binary()
    if binary is None:
        raise FailedPrecondition(NOT_FOUND)
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="specpipe-redis-")
    listen = ["--port", str(port)] if tls is None else [
        "--port", "0", "--tls-port", str(port), "--tls-cert-file", tls.cert, "--tls-key-file", tls.key,
        "--tls-ca-cert-file", tls.ca, "--tls-auth-clients", "yes"]
    try:
        config = [_secret_config(workdir, password)] if password else []  # never on the command line (ps)
    except ValueError:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    process = subprocess.Popen(
        [binary, *config, *listen, "--bind", HOST, "--save", "", "--appendonly", "no",
         "--dir", workdir, "--logfile", f"{workdir}/redis.log"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C goes to our process, which stops it last
        preexec_fn=_die_with_parent,
    )
    server = LocalRedis(process, port, workdir, password, tls)
    deadline = time.monotonic() + timeout_s
    while not _ping(port, tls):
        if process.poll() is not None or time.monotonic() > deadline:
            log = _log_tail(workdir)
            server.stop()
            raise Unavailable(f"redis-server on port {port} did not start (exit {process.poll()}){log}")
        time.sleep(0.05)
    return server


@contextlib.contextmanager
def local_redis(port: int | None = None, timeout_s: float = 10.0) -> Iterator[LocalRedis]:
    server = start(port, timeout_s)
    try:
        yield server
    finally:
        server.stop()


def _ping(port: int, tls: RedisTls | None = None) -> bool:
    """Whether the server answers (NOAUTH is an answer: it is up and wants the password)."""
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2) as raw:
        sock = raw
        if tls is not None:
            context = ssl.create_default_context(cafile=tls.ca)
            context.load_cert_chain(tls.cert, tls.key)
            sock = context.wrap_socket(raw, server_hostname=HOST)
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    return False


def _log_tail(workdir: str) -> str:
    try:
        with open(f"{workdir}/redis.log", errors="replace") as log:
            lines = log.read().splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return ""
    return "".join(f"\n    {line}" for line in lines)


def _secret_config(workdir: str, password: str) -> str:
    """A redis.conf readable by this user only (0600, in the 0700 workdir) with the password: a
    command line is readable by every user of the machine, a config file is not."""
    if any(c in password for c in '"\\\r\n'):
        raise ValueError("the redis password must not contain quotes, backslashes or line breaks")
    path = os.path.join(workdir, "secret.conf")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as conf:
        conf.write(f'requirepass "{password}"\n')
    return path


def _die_with_parent() -> None:
    """Runs in the child before exec: a crashed parent must not leave a redis-server behind."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

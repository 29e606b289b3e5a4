"""The secure path of `specpipe up`: with --tls a private CA and a certificate per service (mutual TLS
between them, TLS on the public port, specpipe.serving.pki), and always a private redis-server with a random
password (rediss:// with client certificates under --tls)."""

from __future__ import annotations

import pathlib
import secrets

from specpipe.devtools import local_redis
from specpipe.devtools.local_redis import LocalRedis, RedisTls
from specpipe.serving.pki import Pki, make_pki
from specpipe.serving.security import Tls

CERTIFICATES = ("verifier", "drafter", "orchestrator", "redis", "client")  # "client": for the user's calls


def prepare(log_dir: pathlib.Path, tls: bool) -> Pki | None:
    return make_pki(log_dir / "tls", CERTIFICATES) if tls else None


def service_flags(pki: Pki | None, role: str) -> tuple[str, ...]:
    if pki is None:
        return ()
    return ("--tls-cert", pki.issued[role].cert, "--tls-key", pki.issued[role].key, "--tls-ca", pki.ca)


def client_tls(pki: Pki | None) -> Tls | None:
    """What a client of these services presents: the client certificate, and the CA to check them by."""
    return None if pki is None else Tls.from_files(pki.issued["client"].cert, pki.issued["client"].key, pki.ca)


def start_redis(pki: Pki | None) -> tuple[LocalRedis, str]:
    """The private redis-server and the URL its clients use (password and, with pki, TLS files in it)."""
    password = secrets.token_urlsafe(24)
    if pki is None:
        server = local_redis.start(password=password)
        return server, server.url
    server = local_redis.start(password=password, tls=RedisTls(pki.issued["redis"].cert, pki.issued["redis"].key,
                                                               pki.ca))
    client = LocalRedis(server.process, server.port, "", password,
                        RedisTls(pki.issued["client"].cert, pki.issued["client"].key, pki.ca))
    return server, client.url


def describe(pki: Pki | None) -> str:
    if pki is None:
        return ""
    client = pki.issued["client"]
    return f"; TLS: CA {pki.ca}, client certificate {client.cert} (key {client.key})"

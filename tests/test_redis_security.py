"""The private redis-server of `specpipe up`: a password (requirepass), and rediss:// with mutual TLS
(this redis-server is built with TLS), through the n-gram store a deployment uses."""

from __future__ import annotations

import pytest

from cache_service import local_redis
from cache_service.local_redis import RedisTls
from specpipe.errors import SpecpipeError
from specpipe.pki import make_pki

if local_redis.find_binary() is None:
    pytest.skip(local_redis.NOT_FOUND, allow_module_level=True)


def round_trip(url: str) -> tuple[int, ...]:
    from cache_service.stores import open_store

    store = open_store(url)
    store.update_global([5, 6, 7, 8])
    return store.lookup("s", [5, 6], 2, 1).draft.tokens


def test_password_required():
    server = local_redis.start(password="p@ss word/1")
    try:
        assert server.url.startswith("redis://:p%40ss%20word%2F1@")
        assert round_trip(server.url) == (7, 8)
        with pytest.raises(SpecpipeError, match="(?i)auth"):
            round_trip(f"redis://{server.address}")
        with pytest.raises(SpecpipeError, match="(?i)auth|password|WRONGPASS"):
            round_trip(f"redis://:wrong@{server.address}")
    finally:
        server.stop()


def test_rediss_with_client_certificates(tmp_path):
    pki = make_pki(tmp_path, ["redis", "client"])
    server_files = RedisTls(pki.issued["redis"].cert, pki.issued["redis"].key, pki.ca)
    server = local_redis.start(password="secret", tls=server_files)
    try:
        client = local_redis.LocalRedis(server.process, server.port, "", "secret",
                                        RedisTls(pki.issued["client"].cert, pki.issued["client"].key, pki.ca))
        assert client.url.startswith("rediss://:secret@")
        assert round_trip(client.url) == (7, 8)
        with pytest.raises(SpecpipeError):  # plaintext to the TLS port
            round_trip(f"redis://:secret@{server.address}")
        with pytest.raises(SpecpipeError):  # TLS without a client certificate
            round_trip(f"rediss://:secret@{server.address}?ssl_ca_certs={pki.ca}")
    finally:
        server.stop()

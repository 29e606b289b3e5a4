"""A real redis-server on a free loopback port in a temp dir, for tests (never the machine's Redis);
the server itself is specpipe.devtools.local_redis, as for `specpipe up --cache redis`.

    from tests.redis_harness import redis_url  # noqa: F401  (the session-scoped fixture)

    def test_x(redis_url): ...

    with redis_server() as server:  # a private one, e.g. to stop it mid-test
        server.stop()
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest

from specpipe.devtools import local_redis
from specpipe.devtools.local_redis import LocalRedis as RedisServer  # .url, .port, .stop()


@contextlib.contextmanager
def redis_server(timeout_s: float = 10.0, port: int | None = None) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port (or the given one, to restart a stopped server)."""
    if local_redis.find_binary() is None:
        if os.environ.get("CI"):  # .ci/run installs it: in CI a missing server is a failure, not a skip
            raise RuntimeError(local_redis.NOT_FOUND)
        pytest.skip(local_redis.NOT_FOUND)
    with local_redis.local_redis(port, timeout_s) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as server:
        yield server.url

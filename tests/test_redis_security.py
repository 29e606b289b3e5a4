"""The private redis-server of `specpipe up`: a password (requirepass), and rediss:// with mutual TLS
(this redis-server is built with TLS), through the n-gram store a deployment uses."""

from __future__ import annotations

import pytest

from specpipe.core.errors import SpecpipeError
from specpipe.devtools import local_redis
from specpipe.devtools.local_redis import RedisTls
from specpipe.serving.pki import make_pki

if local_redis.find_binary() is None:
    pytest.skip(local_redis.NOT_FOUND, allow_module_level=True)


def round_trip(url: str) -> tuple[int, ...]:
    from cache_service.stores import open_store

    store = open_store(url)
    store.update_global([4, 5, 6, 7, 8])
    return store.lookup("s", [4, 5, 6], 2, 1).draft.tokens


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


def test_the_password_is_not_on_redis_servers_command_line():
    import os
    import pathlib

    password = "n0t-on-the-command-line"
    server = local_redis.start(password=password)
    try:
        assert round_trip(server.url) == (7, 8)
        assert password not in pathlib.Path(f"/proc/{server.process.pid}/cmdline").read_text()
        assert password not in " ".join(server.process.args)  # not even before redis-server renames itself
        conf = pathlib.Path(server.workdir) / "secret.conf"
        assert os.stat(conf).st_mode & 0o777 == 0o600 and os.stat(server.workdir).st_mode & 0o077 == 0
    finally:
        server.stop()
    with pytest.raises(ValueError, match="quotes"):
        local_redis.start(password='a"b')


@pytest.mark.slow  # three services and a redis-server as processes: 20-60 s on a shared 2-core machine
def test_the_password_is_on_no_command_line(tmp_path):
    """`specpipe up --cache redis`: the private redis-server's password reaches redis-server in a
    0600 config file and the services in their environment (SPECPIPE_CACHE), never on a command line,
    which every user of the machine can read (/proc/<pid>/cmdline)."""
    import os
    import pathlib
    from urllib.parse import unquote, urlsplit

    from specpipe.serving.clients import GenerationClient
    from tests.test_contract_generation import specpipe_up

    with specpipe_up(tmp_path, "--cache", "redis") as (proc, lines):
        pids = {row[0]: int(row[3]) for row in (line.split() for line in lines)
                if row[:1] and row[0] in ("orchestrator", "verifier", "drafter", "redis")}
        assert set(pids) == {"orchestrator", "verifier", "drafter", "redis"}
        environ = dict(item.split("=", 1) for item in
                       pathlib.Path(f"/proc/{pids['orchestrator']}/environ").read_text().split("\0") if "=" in item)
        password = unquote(urlsplit(environ["SPECPIPE_CACHE"]).password or "")
        assert len(password) >= 24
        for name, pid in {**pids, "up": proc.pid}.items():
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_text()
            assert password not in cmdline and "--requirepass" not in cmdline, name
        conf = pathlib.Path(os.readlink(f"/proc/{pids['redis']}/cwd")) / "secret.conf"  # its --dir
        assert conf.stat().st_mode & 0o777 == 0o600 and password in conf.read_text()
        drafter_env = pathlib.Path(f"/proc/{pids['drafter']}/environ").read_text()
        assert environ["SPECPIPE_CACHE"] in drafter_env  # the drafter shares the store
        assert os.stat(f"/proc/{pids['drafter']}/environ").st_mode & 0o077 == 0  # this user's only
        table = {row[0]: row[1] for row in (line.split() for line in lines) if row[:1] == ["orchestrator"]}
        with GenerationClient(table["orchestrator"], timeout_s=60) as client:
            chunks = list(client.generate(prompt="hello", max_new_tokens=6))
        assert sum(len(c.token_ids) for c in chunks) == 6
        with pytest.raises(SpecpipeError, match="(?i)auth"):  # and the server does require it
            round_trip(f"redis://127.0.0.1:{urlsplit(environ['SPECPIPE_CACHE']).port}")


def test_the_acl_user_of_the_docs_can_do_what_specpipe_does_and_no_more():
    """A shared Redis: specpipe's own user with cache_service.redis_store.ACL_RULES (docs/security.md,
    deploy/k8s/base/redis.yaml). Sessions, every tenant's global table and releases work; other keys
    and dangerous commands are refused."""
    import redis

    from cache_service.redis_store import ACL_RULES
    from cache_service.stores import open_store

    server = local_redis.start(password="admin-secret")
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", "specpipe", "on", ">user-secret", *ACL_RULES.split())
        admin.set("someone-else:key", "private")
        url = f"redis://specpipe:user-secret@{server.address}"
        assert round_trip(url) == (7, 8)
        store = open_store(url)
        store.update_global([1, 2, 3, 4, 5], tenant="team-a")
        assert store.lookup("s1", [1, 2, 3], 2, 1, tenant="team-a").draft.tokens == (4, 5)
        assert store.record_branches("s1", [[9, 8, 7]]) > 0
        assert store.lookup("s1", [9, 8], 1, 1).draft.tokens == (7,)
        assert store.release("s1")
        user = redis.Redis.from_url(url)
        for command in (("GET", "someone-else:key"), ("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
    finally:
        server.stop()

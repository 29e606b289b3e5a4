"""Which replica (specpipe.serving.replicas): target parsing, DNS re-resolution, least-loaded ranking, and the
ReplicaSet's view of real servers (health, load, failures)."""

import socket

import pytest

from specpipe.core.errors import InvalidArgument
from specpipe.serving.replicas import Probe, ReplicaSet, ReplicaSetConfig, _Replica, parse_target, rank, resolve


@pytest.mark.parametrize("target, expected", [
    ("a:1", (("a:1",), None)),
    ("a:1, b:2,a:1", (("a:1", "b:2"), None)),
    ("dns:///verifier-headless:50052", ((), "verifier-headless:50052")),
    ("dns://8.8.8.8/verifier:50052", ((), "verifier:50052")),
    ("dns:verifier:50052", ((), "verifier:50052")),
])
def test_parse_target(target, expected):
    assert parse_target(target) == expected


@pytest.mark.parametrize("target", ["", "a", "a:", "a:0", "a:x", "dns:///name", ",", "dns:///"])
def test_parse_target_rejects(target):
    with pytest.raises(InvalidArgument, match="expected"):
        parse_target(target)


def test_resolve_localhost_and_unknown_name():
    addresses = resolve("localhost:50052")
    assert "127.0.0.1:50052" in addresses
    assert all(a.endswith(":50052") for a in addresses)
    assert resolve("no-such-host.invalid:1") == ()


def _replicas(**states) -> dict:
    return {address: _Replica(client=None, **state) for address, state in states.items()}


@pytest.mark.parametrize("states, exclude, prefer, expected", [
    ({"a": dict(serving=True, load=3), "b": dict(serving=True, load=1)}, (), None, ["b", "a"]),
    ({"a": dict(serving=True, load=1, pinned=2), "b": dict(serving=True, load=2)}, (), None, ["b", "a"]),
    ({"a": dict(serving=True, load=0, inflight=1), "b": dict(serving=True, load=0)}, (), None, ["b", "a"]),
    ({"a": dict(serving=True, load=3), "b": dict(serving=True, load=1)}, (), "a", ["a", "b"]),
    ({"a": dict(serving=False, load=0), "b": dict(serving=True, load=9)}, (), "a", ["b", "a"]),
    ({"a": dict(serving=True), "b": dict(serving=True, gone=True)}, (), None, ["a"]),
    ({"a": dict(serving=True), "b": dict(serving=True)}, ("a",), None, ["b"]),
    ({"a": dict(serving=False, failed_at=5.0), "b": dict(serving=False, failed_at=2.0)}, (), None, ["b", "a"]),
], ids=["least loaded", "pinned since probe", "in flight", "prefer", "prefer not serving", "gone", "exclude",
        "last resort: longest failed first"])
def test_rank(states, exclude, prefer, expected):
    assert rank(_replicas(**states), exclude, prefer) == expected


class FakeClient:
    """A client of a replica that is not a server: its probe answers are set by the test."""

    def __init__(self, address):
        self.address, self.closed = address, False

    def close(self):
        self.closed = True


def test_replica_set_follows_dns_and_probes(monkeypatch):
    answers = {"svc:7": ("10.0.0.1:7", "10.0.0.2:7")}
    monkeypatch.setattr("specpipe.serving.replicas.resolve", lambda name: answers[name])
    probes = {"10.0.0.1:7": Probe(True, 3.0), "10.0.0.2:7": Probe(True, 1.0), "10.0.0.3:7": Probe(True, 0.0)}
    config = ReplicaSetConfig(refresh_s=3600, resolve_s=0)  # refreshed by hand below
    with ReplicaSet("dns:///svc:7", FakeClient, lambda c: probes[c.address], config) as replicas:
        assert replicas.candidates() == ["10.0.0.2:7", "10.0.0.1:7"]
        replicas.note_pinned("10.0.0.2:7")
        replicas.note_pinned("10.0.0.2:7")
        assert replicas.candidates()[0] == "10.0.0.1:7"  # two sessions pinned since the probe
        old = replicas.client("10.0.0.1:7")

        answers["svc:7"] = ("10.0.0.2:7", "10.0.0.3:7")  # a replica came, one went
        replicas.refresh()
        assert replicas.candidates() == ["10.0.0.3:7", "10.0.0.2:7"]
        assert not replicas.usable("10.0.0.1:7") and not old.closed  # its sessions move first
        assert replicas.should_leave("10.0.0.1:7")
        replicas.refresh()
        assert old.closed  # gone for a whole period: retired

        probes["10.0.0.3:7"] = Probe(serving=False)  # draining
        replicas.refresh()
        assert replicas.candidates() == ["10.0.0.2:7", "10.0.0.3:7"] and replicas.should_leave("10.0.0.3:7")
        replicas.mark_failed("10.0.0.2:7", "test")
        assert not replicas.usable("10.0.0.2:7") and not replicas.should_leave("10.0.0.2:7")  # none better


def test_failed_lookup_keeps_known_replicas(monkeypatch):
    answers = {"svc:7": ("10.0.0.1:7",)}
    monkeypatch.setattr("specpipe.serving.replicas.resolve", lambda name: answers[name])
    config = ReplicaSetConfig(refresh_s=3600, resolve_s=0)
    with ReplicaSet("dns:///svc:7", FakeClient, lambda c: Probe(True), config) as replicas:
        answers["svc:7"] = ()
        replicas.refresh()
        assert replicas.candidates() == ["10.0.0.1:7"]


def test_dns_target_resolves_localhost_to_a_real_server():
    from specpipe.serving.clients import VerifierClient
    from specpipe.serving.failover import verifier_probe
    from tests.grpc_harness import shared_tiny_cluster

    port = shared_tiny_cluster().verifier_server.port
    with ReplicaSet(f"dns:///localhost:{port}", lambda a: VerifierClient(a, 5.0), verifier_probe) as replicas:
        assert f"127.0.0.1:{port}" in replicas.candidates()
        assert replicas.usable(f"127.0.0.1:{port}")
    with socket.socket() as s:  # a port nobody listens on: not serving, still a last-resort candidate
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with ReplicaSet(dead, lambda a: VerifierClient(a, 5.0), verifier_probe) as replicas:
        assert replicas.candidates() == [dead] and not replicas.usable(dead)

"""A private Redis Cluster on loopback: 3 masters with 1 replica each (6 redis-server processes on free
ports), without persistence, in a temp dir; the n-gram store on a cluster (cache_service.cluster) in
the tests and the benches. Each node is started as specpipe.devtools.local_redis starts one.

    with local_cluster() as cluster:
        store = open_store(cluster.url)           # redis+cluster://127.0.0.1:PORT
        cluster.kill(cluster.masters()[0])        # its replica takes over in about 2 s:
        cluster.wait_ok()
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
from typing import Any, Iterator

import redis

from specpipe.core.errors import FailedPrecondition, Unavailable
from specpipe.devtools.local_redis import HOST, LocalRedis, _die_with_parent, _log_tail, _ping, find_binary, free_port

MASTERS = 3
REPLICAS = 1  # per master
SLOTS = 16384
NODE_TIMEOUT_MS = 1000  # a master silent this long is failed; its replica's election takes about 1 s more
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000
NOT_FOUND = "redis-server or redis-cli not found; install them (apt-get install redis-server)"


@dataclass(frozen=True)
class NodeState:
    """A node as one line of another node's CLUSTER NODES shows it."""

    port: int
    master: bool
    failed: bool  # flagged fail (or, not yet agreed, fail?) by the node asked
    slots: int  # hash slots it serves


@dataclass
class LocalCluster:
    servers: dict[int, LocalRedis]  # port -> its redis-server, masters and replicas
    workdir: str  # one folder per node (its --dir, log and nodes.conf); removed by stop()

    @property
    def nodes(self) -> list[int]:
        return list(self.servers)

    @property
    def url(self) -> str:
        """The URL of a live node: the seed from which a client finds the others."""
        return self.url_of(self._live()[0])

    def url_of(self, port: int) -> str:
        return f"redis+cluster://{HOST}:{port}"

    def masters(self) -> list[int]:
        """Ports of the running masters that serve slots, as a running node sees them (CLUSTER NODES)."""
        return [n.port for n in self._running() if n.master and n.slots]

    def replicas(self) -> list[int]:
        return [n.port for n in self._running() if not n.master]

    def view(self, port: int) -> list[NodeState]:
        """The cluster as the node on port sees it."""
        return [_parse_node(line) for line in _command(port, "CLUSTER", "NODES").splitlines() if line]

    def sync(self, port: int, timeout_s: float = 5.0) -> None:
        """Until every replica of the master on port has acknowledged its replication stream up to now:
        replication is asynchronous, so a master killed right after a write may take the write with it
        (replicas acknowledge about once a second)."""
        written = _command(port, "INFO", "replication")["master_repl_offset"]
        deadline = time.monotonic() + timeout_s
        while True:
            info = _command(port, "INFO", "replication")  # slave<i>: {"offset": acknowledged, ...}
            acked = [
                value["offset"] for key, value in info.items() if key.startswith("slave") and isinstance(value, dict)
            ]
            if acked and min(acked) >= written:
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"the replicas of redis node {port} did not acknowledge its writes in {timeout_s} s")
            time.sleep(0.05)

    def kill(self, port: int) -> None:
        """SIGKILL the node on port (no shutdown, no goodbye to the others): a crashed server."""
        process = self.servers[port].process
        if process.poll() is None:
            process.kill()
            process.wait()

    def wait_ok(self, timeout_s: float = 15.0) -> None:
        """Until every live node sees cluster_state:ok, all slots served by live masters, no master
        without slots (a replica whose role has not reached that node yet) and its replication link up
        (a failover of a killed master takes NODE_TIMEOUT_MS plus about 1 s)."""
        deadline = time.monotonic() + timeout_s
        while not self._ok():
            if time.monotonic() > deadline:
                raise Unavailable(f"redis cluster on {self.nodes} not ok after {timeout_s} s{self._logs()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every node (local_redis's stop: SIGTERM, SIGKILL after 5 s); idempotent."""
        for server in self.servers.values():
            server.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _running(self) -> list[NodeState]:
        live = self._live()
        return [n for n in self.view(live[0]) if n.port in live and not n.failed]

    def _live(self) -> list[int]:
        live = [port for port, server in self.servers.items() if server.process.poll() is None]
        if not live:
            raise Unavailable(f"no node of the redis cluster on {self.nodes} is running")
        return live

    def _ok(self) -> bool:
        live = set(self._live())
        try:
            for port in live:
                info = _fields(_command(port, "CLUSTER", "INFO"))
                replication = _command(port, "INFO", "replication")  # parsed by redis-py
                masters = [n for n in self.view(port) if n.master and n.port in live and not n.failed]
                serving = sum(n.slots for n in masters)
                settled = all(n.slots for n in masters)  # no replica still seen as a master without slots
                if (info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != SLOTS or serving != SLOTS
                        or not settled or replication.get("master_link_status", "up") != "up"):
                    return False
        except redis.RedisError:
            return False
        return True

    def _logs(self) -> str:
        return "".join(f"\n  node {port}:{_log_tail(server.workdir)}" for port, server in self.servers.items())


def start(timeout_s: float = 30.0) -> LocalCluster:
    """Start MASTERS * (1 + REPLICAS) nodes, join them with redis-cli --cluster create and wait until
    the cluster is ok. FailedPrecondition when the binaries are missing, Unavailable when it does not
    come up."""
    server_binary, cli_binary = find_binary(), shutil.which("redis-cli")
    if server_binary is None or cli_binary is None:
        raise FailedPrecondition(NOT_FOUND)
    deadline = time.monotonic() + timeout_s
    cluster = LocalCluster({}, tempfile.mkdtemp(prefix="specpipe-cluster-"))
    try:
        for _ in range(MASTERS * (1 + REPLICAS)):
            port = _cluster_port()
            cluster.servers[port] = _start_node(server_binary, port, f"{cluster.workdir}/{port}")
        for port, server in cluster.servers.items():
            while not _ping(port):
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise Unavailable(f"redis-server on port {port} did not start (exit {server.process.poll()})"
                                      f"{_log_tail(server.workdir)}")
                time.sleep(0.05)
        _create(cli_binary, cluster.nodes, deadline - time.monotonic())
        cluster.wait_ok(deadline - time.monotonic())
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def local_cluster(timeout_s: float = 30.0) -> Iterator[LocalCluster]:
    cluster = start(timeout_s)
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_node(binary: str, port: int, workdir: str) -> LocalRedis:
    """One cluster-enabled redis-server; cluster-require-full-coverage no: a shard that is down costs
    its own slots, not every slot (a cache: the other shards' sessions keep drafting)."""
    os.makedirs(workdir)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no", "--dir", workdir,
         "--logfile", f"{workdir}/redis.log", "--cluster-enabled", "yes",
         "--cluster-config-file", f"{workdir}/nodes-{port}.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
         "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0",  # replicas sync at once
         "--cluster-replica-validity-factor", "0"],  # a replica fails over however long its link was down
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=_die_with_parent,
    )
    return LocalRedis(process, port, workdir)


def _create(cli_binary: str, ports: list[int], timeout_s: float) -> None:
    """redis-cli --cluster create: slots split over the first MASTERS nodes, the others their replicas."""
    try:
        created = subprocess.run(
            [cli_binary, "--cluster", "create", *(f"{HOST}:{port}" for port in ports),
             "--cluster-replicas", str(REPLICAS), "--cluster-yes"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        raise Unavailable(f"redis-cli --cluster create did not finish in {timeout_s:.0f} s") from None
    if created.returncode != 0:
        raise Unavailable(f"redis-cli --cluster create failed (exit {created.returncode}): "
                          f"{(created.stdout + created.stderr)[-2000:]}")


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + BUS_OFFSET) is free too."""
    while True:
        port = free_port()
        if port + BUS_OFFSET < 65536:
            with contextlib.suppress(OSError), socket.socket() as sock:
                sock.bind((HOST, port + BUS_OFFSET))
                return port


def _command(port: int, *args: str) -> Any:
    with redis.Redis(HOST, port, socket_timeout=1.0, socket_connect_timeout=1.0, decode_responses=True) as client:
        return client.execute_command(*args)


def _fields(text: str) -> dict[str, str]:
    """CLUSTER INFO text -> {field: value}."""
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _parse_node(line: str) -> NodeState:
    """<id> <ip:port@bus> <flags> <master id> <ping> <pong> <epoch> <link> <slot ranges...>"""
    fields = line.split()
    flags = set(fields[2].split(","))
    slots = 0
    for entry in fields[8:]:
        if not entry.startswith("["):  # [slot->-id]: a slot being migrated, counted by its range
            first, _, last = entry.partition("-")
            slots += int(last or first) - int(first) + 1
    return NodeState(int(fields[1].split("@")[0].rsplit(":", 1)[1]), "master" in flags,
                       bool(flags & {"fail", "fail?"}), slots)

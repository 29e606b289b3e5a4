"""Which replica: the endpoints of one role, each one's health and load, and the pick of the
least-loaded healthy one (docs/design.md, "Deployment shapes and serving"). Endpoints are a static comma list
(`a:50052,b:50052`) or a DNS name (`dns:///specpipe-verifier-headless:50052`) re-resolved as
replicas come and go: each address the name resolves to is a replica (a headless Service).

What a session does when its replica is lost is specpipe.serving.failover's business; this module knows
nothing of sessions, so another transport (Ray Serve handles) can reuse the failover logic.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Protocol, TypeVar

from specpipe.core.errors import InvalidArgument, SpecpipeError, Unavailable

log = logging.getLogger("specpipe.serving.replicas")

DNS_SCHEME = "dns:///"
class _Client(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Client)  # a client of one replica (VerifierClient, DrafterClient, ...)


@dataclass(frozen=True)
class VerifierLoad:
    """What a verifier replica reports for routing (the Load RPC)."""

    open_sessions: int
    max_sessions: int
    queued: int  # verify / prefill work waiting for or running on the model


@dataclass(frozen=True)
class Probe:
    serving: bool      # health SERVING (NOT_SERVING while draining)
    load: float = 0.0  # what the replica reports; lower is better


@dataclass(frozen=True)
class ReplicaSetConfig:
    refresh_s: float = 1.0        # probe period (health, load)
    resolve_s: float = 5.0        # DNS re-resolution period


@dataclass
class _Replica(Generic[C]):
    client: C
    serving: bool = False  # the last probe said SERVING and no call has failed since
    load: float = 0.0      # last probed load
    pinned: int = 0        # sessions pinned here since that probe (the next probe counts them)
    inflight: int = 0      # calls of this process running on it now
    failed_at: float = 0.0
    gone: bool = False     # no longer in the DNS answer: no new work; closed at the next resolution


# --- pure functions ----------------------------------------------------------------------------

def parse_target(target: str) -> tuple[tuple[str, ...], str | None]:
    """(static endpoints, DNS name:port to re-resolve or None) of a --verifier-addr / --drafter-addr."""
    target = target.strip()
    if target.startswith("dns:"):
        name = target.split("/", 3)[-1] if target.startswith("dns://") else target[len("dns:"):]
        if not name or ":" not in name:
            raise InvalidArgument(f"{target!r}: expected dns:///name:port")
        return (), name
    endpoints = tuple(dict.fromkeys(e.strip() for e in target.split(",") if e.strip()))
    if not endpoints or any(e.rpartition(":")[2] in ("", "0") or not e.rpartition(":")[2].isdigit() for e in endpoints):
        raise InvalidArgument(f"{target!r}: expected host:port[,host:port...] or dns:///name:port")
    return endpoints, None


def resolve(name_port: str) -> tuple[str, ...]:
    """Every address name resolves to, as host:port (IPv6 in brackets); () when it does not resolve."""
    host, _, port = name_port.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except socket.gaierror:
        return ()
    hosts = {str(info[4][0]) for info in infos}
    return tuple(sorted(f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts))


def rank(replicas: dict[str, _Replica], exclude: Iterable[str] = (), prefer: str | None = None) -> list[str]:
    """Candidates best first: serving ones by load (prefer first when it is serving), then the
    others, longest-failed first (a last resort: the call says UNAVAILABLE if they really are down)."""
    exclude = set(exclude)
    live = [a for a, r in replicas.items() if a not in exclude and not r.gone]
    serving = sorted((a for a in live if replicas[a].serving),
                     key=lambda a: (a != prefer, replicas[a].load + replicas[a].pinned + replicas[a].inflight, a))
    rest = sorted((a for a in live if not replicas[a].serving), key=lambda a: replicas[a].failed_at)
    return serving + rest


# --- the set -----------------------------------------------------------------------------------

class ReplicaSet(Generic[C]):
    """The replicas of one role. connect(address) makes a client; probe(client) asks one replica
    for its health and load. A background thread re-probes every refresh_s and re-resolves a DNS
    target every resolve_s."""

    def __init__(self, target: str, connect: Callable[[str], C], probe: Callable[[C], Probe],
                 config: ReplicaSetConfig = ReplicaSetConfig()):
        self.target = target
        self.config = config
        self._static, self._dns_name = parse_target(target)
        self._connect, self._probe = connect, probe
        self._replicas: dict[str, _Replica[C]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._resolved_at = 0.0
        self._update_endpoints(self._static or resolve(self._dns_name or ""))
        self.refresh()  # route by real health and load from the first session on
        self._thread = threading.Thread(target=self._refresh_loop, name="specpipe-replicas", daemon=True)
        self._thread.start()

    # which replica
    def candidates(self, exclude: Iterable[str] = (), prefer: str | None = None) -> list[str]:
        with self._lock:
            return rank(self._replicas, exclude, prefer)

    def client(self, address: str) -> C:
        with self._lock:
            replica = self._replicas.get(address)
        if replica is None:
            raise Unavailable(f"replica {address} of {self.target} is gone")
        return replica.client

    def usable(self, address: str) -> bool:
        with self._lock:
            replica = self._replicas.get(address)
            return replica is not None and replica.serving and not replica.gone

    def should_leave(self, address: str) -> bool:
        """The replica is draining, failed or gone, and another one serves: move work off it."""
        with self._lock:
            replica = self._replicas.get(address)
            if replica is not None and replica.serving and not replica.gone:
                return False
            return any(r.serving and not r.gone for a, r in self._replicas.items() if a != address)

    # what callers tell it
    def note_pinned(self, address: str) -> None:
        with self._lock:
            if address in self._replicas:
                self._replicas[address].pinned += 1

    def note_call(self, address: str, delta: int) -> None:
        with self._lock:
            if address in self._replicas:
                self._replicas[address].inflight += delta

    def mark_failed(self, address: str, reason: str) -> None:
        """No new work until a probe says SERVING again."""
        with self._lock:
            replica = self._replicas.get(address)
            if replica is None:
                return
            replica.serving, replica.failed_at = False, time.monotonic()
        log.warning("replica failed", extra={"target": self.target, "replica": address, "reason": reason})

    # refresh
    def refresh(self) -> None:
        """Re-resolve (when due) and probe every replica now."""
        if self._dns_name and time.monotonic() - self._resolved_at >= self.config.resolve_s:
            addresses = resolve(self._dns_name)
            if addresses:  # a failed lookup keeps the replicas we know
                self._update_endpoints(addresses)
        with self._lock:
            replicas = list(self._replicas.items())
        for address, replica in replicas:
            try:
                probe = self._probe(replica.client)
            except (SpecpipeError, ValueError) as err:  # ValueError: a channel closed meanwhile
                probe = Probe(serving=False)
                log.debug("probe failed", extra={"replica": address, "error": str(err)})
            with self._lock:
                replica.serving, replica.load, replica.pinned = probe.serving, probe.load, 0
                if not probe.serving:
                    replica.failed_at = replica.failed_at or time.monotonic()
                else:
                    replica.failed_at = 0.0

    def wait_ready(self, timeout_s: float) -> None:
        """Block until a replica serves; Unavailable after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            if any(self.usable(a) for a in self.candidates()):
                return
            if time.monotonic() > deadline or self._closed.is_set():
                raise Unavailable(f"no replica of {self.target} serving within {timeout_s:g} s")
            time.sleep(min(0.2, self.config.refresh_s))

    def _update_endpoints(self, addresses: tuple[str, ...]) -> None:
        retired = []
        with self._lock:
            self._resolved_at = time.monotonic()
            for address in addresses:
                if address not in self._replicas:
                    self._replicas[address] = _Replica(self._connect(address))
                self._replicas[address].gone = False
            for address, replica in list(self._replicas.items()):
                if address in addresses:
                    continue
                if replica.gone:  # gone for a whole period: its sessions have moved
                    retired.append(self._replicas.pop(address).client)
                else:
                    replica.gone = True
        for client in retired:
            client.close()
        if retired:
            log.info("replicas retired", extra={"target": self.target, "replicas": len(retired)})

    def _refresh_loop(self) -> None:
        while not self._closed.wait(self.config.refresh_s):
            try:
                self.refresh()
            except Exception:  # never let the thread die: routing would freeze on stale state
                log.exception("replica refresh failed", extra={"target": self.target})

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            clients = [r.client for r in self._replicas.values()]
            self._replicas.clear()
        for client in clients:
            client.close()

    def __enter__(self) -> ReplicaSet[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


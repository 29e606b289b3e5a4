"""Session affinity for Ray Serve: a custom request router (Serve's request_router_config) that pins
a session, named by the handle's session_id, to the replica its first call went to.

The verifier's KV of a session lives on one replica, so its calls must all reach it (strict); a drafter
resyncs any session by longest common prefix, so its calls prefer the last replica and fall back to any other
(not strict). A new session goes to the least loaded replica: fewest sessions pinned by this router, then the
shortest queue Serve knows. A pin to a replica that is gone (scaled down, dead) is dropped: the session's next
call is placed anew, and the orchestrator re-prefills it there (specpipe.serving.failover,
specpipe/rayserve/handles.py). Why not Serve's consistent-hash router: placement by hash ignores load, and
every change of the replica set moves running sessions away from their KV.

Pins are per router, i.e. per orchestrator replica and deployment: a session's calls all come from
the orchestrator replica that runs its generation, so that is the router that needs them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Mapping, Sequence, TypeVar

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

RELEASE_METHOD = "release"  # the deployments' method that ends a session


R = TypeVar("R", bound=Hashable)  # a replica's id


def rank_replicas(pinned: R | None, candidates: Sequence[R], sessions: Mapping[R, int],
                  queue_len: Mapping[R, int], strict: bool) -> list[R]:
    """Replicas to try in order: the pinned one alone (strict) or first; else the least loaded
    first, by (sessions pinned, queue length); ties keep the candidates' order."""
    if pinned is not None and pinned in candidates:
        if strict:
            return [pinned]
        rest = [r for r in candidates if r != pinned]
        return [pinned, *sorted(rest, key=lambda r: (sessions.get(r, 0), queue_len.get(r, 0)))]
    return sorted(candidates, key=lambda r: (sessions.get(r, 0), queue_len.get(r, 0)))


class SessionPinRouter(RequestRouter):
    """request_router_kwargs: strict (default True): a pinned session's calls go to its replica only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._strict = True
        self._pins: dict[str, ReplicaID] = {}  # session_id -> replica
        super().__init__(*args, **kwargs)

    def initialize_state(self, strict: bool = True, **kwargs: Any) -> None:
        self._strict = bool(strict)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True  # a full pinned replica: wait, do not spin
        by_id = {r.replica_id: r for r in candidate_replicas}
        queue_len = {rid: self.replica_queue_len_cache.get(rid) or 0 for rid in by_id}
        ranked = rank_replicas(self._pins.get(pending_request.metadata.session_id), list(by_id),
                               Counter(self._pins.values()), queue_len, self._strict)
        return [[by_id[rid]] for rid in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        session_id = pending_request.metadata.session_id
        if not session_id:
            return
        if pending_request.metadata.call_method == RELEASE_METHOD:
            self._pins.pop(session_id, None)
        else:
            self._pins[session_id] = replica_id

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        self._pins = {s: r for s, r in self._pins.items() if r in live}

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._pins = {s: r for s, r in self._pins.items() if r != replica_id}

"""The Verifier and Drafter protocols over Ray Serve DeploymentHandles: what the orchestrator
deployment's Generator calls (the same loop as every other deployment shape). Calls block on
DeploymentResponse.result() from the Generator's threads (never on Serve's event loop).

A session's calls carry its id as the handle's session_id, which the deployments' request router
(specpipe/rayserve/router.py) pins to one replica. Ray's failures come back as the specpipe.core.errors a gRPC
client raises, so the Generator and specpipe.serving.failover cannot tell a Ray peer from a gRPC one.

Failover is specpipe.serving.failover's ReplicatedVerifier, over a ReplicaSet of one endpoint: the whole
verifier deployment (serve_replicas), inside which Serve's router places sessions on replicas. A
session whose replica is lost is re-prefilled through the handle from the context ReplicatedVerifier
recorded, and the router puts it on a live replica.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Sequence

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError

from specpipe.core import errors
from specpipe.core.types import Draft, ModelInfo, ProposeRequest, ProposeResult, SamplingParams, VerifyResult
from specpipe.serving.failover import ReplicatedVerifier
from specpipe.serving.replicas import Probe, ReplicaSet


@contextlib.contextmanager
def ray_errors(what: str) -> Iterator[None]:
    """A peer's SpecpipeError as itself; a lost replica UNAVAILABLE; a full one RESOURCE_EXHAUSTED."""
    try:
        yield
    except RayTaskError as err:
        if isinstance(err.cause, errors.SpecpipeError):
            raise err.cause from None
        if isinstance(err.cause, (RayActorError, ActorUnavailableError)):
            raise errors.Unavailable(f"{what}: replica lost: {err.cause}") from None
        raise errors.SpecpipeError(f"{what}: {type(err.cause).__name__}: {err.cause}") from None
    except (RayActorError, ActorUnavailableError, DeploymentUnavailableError, RequestCancelledError) as err:
        raise errors.Unavailable(f"{what}: replica lost or unavailable: {err}") from None
    except BackPressureError as err:
        raise errors.ResourceExhausted(f"{what}: {err.message}") from None
    except TimeoutError:
        raise errors.DeadlineExceeded(f"{what}: no reply within the deadline") from None


DEPLOYMENT_ENDPOINT = "ray-serve-verifier:1"  # the ReplicaSet's one endpoint (its form: host:port)


def deployment_probe(client: Any) -> Probe:
    """Serve health-checks the replicas and routes to live ones only: the deployment serves."""
    return Probe(serving=True)


def serve_replicas(verifier: HandleVerifier) -> ReplicatedVerifier:
    """The failover verifier of the orchestrator deployment (see the module's docstring)."""
    return ReplicatedVerifier(ReplicaSet(DEPLOYMENT_ENDPOINT, lambda address: verifier, deployment_probe))


@dataclass(frozen=True)
class Placement:
    """Where a verifier session lived: the replica that prefilled it, from when to when (monotonic s)."""

    session_id: str
    replica: str
    opened_s: float
    released_s: float | None = None


class HandleVerifier:
    """specpipe.core.protocols.Verifier over the verifier deployment. Records where each session was
    prefilled (placements(): recent sessions, for operators and tests)."""

    def __init__(self, handle: Any, info: ModelInfo, timeout_s: float | None = 60.0, history: int = 1024) -> None:
        self._handle = handle
        self._info = info  # fetched once by the orchestrator's constructor: it never changes
        self._timeout_s = timeout_s
        self._open: dict[str, Placement] = {}
        self._closed: deque[Placement] = deque(maxlen=history)
        self._lock = threading.Lock()

    def _call(self, session_id: str, method: str, *args: Any) -> Any:
        with ray_errors(f"verifier {method}"):
            response = getattr(self._handle.options(session_id=session_id), method).remote(session_id, *args)
            return response.result(timeout_s=self._timeout_s)

    def info(self) -> ModelInfo:
        return self._info

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        context_len, replica = self._call(session_id, "prefill", tuple(prompt_ids))
        with self._lock:
            self._open[session_id] = Placement(session_id, replica, time.monotonic())
        return context_len

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        return self._call(session_id, "verify", context_len, draft, sampling)

    def release(self, session_id: str) -> bool:
        try:
            return self._call(session_id, "release")
        finally:
            with self._lock:
                placement = self._open.pop(session_id, None)
                if placement is not None:
                    self._closed.append(Placement(placement.session_id, placement.replica, placement.opened_s,
                                                  time.monotonic()))

    def placements(self) -> list[Placement]:
        with self._lock:
            return [*self._closed, *self._open.values()]

    def close(self) -> None:
        """The handle needs no closing (ReplicaSet's client protocol)."""


class HandleDrafter:
    """specpipe.core.protocols.Drafter over one draft method of the drafter deployment."""

    def __init__(self, handle: Any, method: str, info: ModelInfo, timeout_s: float | None = 60.0) -> None:
        self._handle = handle
        self.method = method
        self._info = info
        self._timeout_s = timeout_s

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        with ray_errors("drafter propose"):
            response = self._handle.options(session_id=request.session_id).propose.remote(request, self.method)
            return response.result(timeout_s=self._timeout_s)

    def release(self, session_id: str) -> bool:
        with ray_errors("drafter release"):
            return self._handle.options(session_id=session_id).release.remote(session_id).result(
                timeout_s=self._timeout_s)

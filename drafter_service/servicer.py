"""gRPC servicer of the Drafter service: proto <-> specpipe.core.protocols.Drafter, nothing else. One
service serves one or more draft methods (model, ngram, hybrid), chosen per request."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from specpipe.config.limits import DEFAULT_LIMITS, Limits, check_propose
from specpipe.core.errors import FailedPrecondition
from specpipe.core.protocols import Drafter
from specpipe.core.types import ModelInfo
from specpipe.runtime import cpu
from specpipe.serving import convert
from specpipe.serving.server import Service, rpc_method, service_name
from specpipe.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc


class DraftMethods:
    """The draft methods one drafter service serves (method -> Drafter); the first is the default.
    Also what the Ray Serve drafter deployment serves (deploy/ray)."""

    def __init__(self, drafters: Mapping[str, Drafter]):
        if not drafters:
            raise ValueError("a drafter service needs at least one draft method")
        self._drafters = dict(drafters)

    def drafter(self, method: str) -> Drafter:
        drafter = self._drafters.get(method or next(iter(self._drafters)))
        if drafter is None:
            raise FailedPrecondition(f"draft method {method!r} is not served here; served: {', '.join(self._drafters)}")
        return drafter

    def info(self) -> ModelInfo:
        return replace(self.drafter("").info(), methods=tuple(self._drafters))

    def release(self, session_id: str) -> bool:
        released = [drafter.release(session_id) for drafter in self._drafters.values()]
        return any(released)


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, drafters: Mapping[str, Drafter], limits: Limits = DEFAULT_LIMITS):
        self._methods = DraftMethods(drafters)
        self._limits = limits  # an orchestrator's own Generate caps draft_len and width; any other caller, here

    @rpc_method
    def Info(self, request: drafter_pb2.DrafterInfoRequest, context: Any) -> common_pb2.ModelInfo:
        return convert.model_info_to_proto(self._methods.info())

    @rpc_method
    def Propose(self, request: drafter_pb2.ProposeRequest, context: Any) -> drafter_pb2.ProposeReply:
        with cpu.hop("drafter", "rpc"):
            propose = convert.propose_request_from_proto(request)
            check_propose(propose, self._limits)
            result = self._methods.drafter(request.method).propose(propose)
            return convert.propose_result_to_proto(result)

    @rpc_method
    def Release(self, request: common_pb2.ReleaseRequest, context: Any) -> common_pb2.ReleaseReply:
        return common_pb2.ReleaseReply(released=self._methods.release(request.session_id))


def service(drafters: Mapping[str, Drafter], limits: Limits = DEFAULT_LIMITS) -> Service:
    return Service(
        service_name(drafter_pb2, "Drafter"),
        DrafterServicer(drafters, limits),
        drafter_pb2_grpc.add_DrafterServicer_to_server,
    )

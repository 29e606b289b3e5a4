"""gRPC servicer of the Drafter service: proto <-> specpipe.protocols.Drafter, nothing else."""

from __future__ import annotations

from specpipe.protocols import Drafter
from specpipe.rpc import convert
from specpipe.rpc.server import Service, rpc_method, service_name
from specpipe.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, drafter: Drafter):
        self._drafter = drafter

    @rpc_method
    def Info(self, request, context):
        return convert.model_info_to_proto(self._drafter.info())

    @rpc_method
    def Propose(self, request, context):
        result = self._drafter.propose(
            request.session_id,
            tuple(request.context),
            request.draft_len,
            request.width,
            convert.sampling_from_proto(request.sampling),
        )
        return drafter_pb2.ProposeReply(draft=convert.draft_to_proto(result.draft), draft_ms=result.draft_ms)

    @rpc_method
    def Release(self, request, context):
        return verifier_pb2.ReleaseReply(released=self._drafter.release(request.session_id))


def service(drafter: Drafter) -> Service:
    return Service(
        service_name(drafter_pb2, "Drafter"),
        DrafterServicer(drafter),
        drafter_pb2_grpc.add_DrafterServicer_to_server,
    )

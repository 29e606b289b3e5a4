"""gRPC servicer of the Verifier service: proto <-> specpipe.core.protocols.Verifier, nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from specpipe.runtime import cpu
from specpipe.serving import convert, verify_stream
from specpipe.serving.server import Service, rpc_method, service_name
from specpipe.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.verifier import SessionVerifier


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, verifier: SessionVerifier):
        self._verifier = verifier

    @rpc_method
    def Info(self, request: verifier_pb2.VerifierInfoRequest, context: Any) -> common_pb2.ModelInfo:
        return convert.model_info_to_proto(self._verifier.info())

    @rpc_method
    def Prefill(self, request: verifier_pb2.PrefillRequest, context: Any) -> verifier_pb2.PrefillReply:
        with cpu.hop("verifier", "rpc"):
            context_len = self._verifier.prefill(request.session_id, tuple(request.prompt_ids))
            return verifier_pb2.PrefillReply(context_len=context_len)

    @rpc_method
    def Verify(self, request: verifier_pb2.VerifyRequest, context: Any) -> verifier_pb2.VerifyReply:
        with cpu.hop("verifier", "rpc"):
            result = self._verifier.verify(
                request.session_id,
                request.context_len,
                convert.draft_from_proto(request.draft),
                convert.sampling_from_proto(request.sampling),
            )
            return convert.verify_result_to_proto(result)

    @rpc_method
    def VerifyStream(self, request_iterator: Iterator[verifier_pb2.VerifyBatch],
                     context: Any) -> Iterator[verifier_pb2.VerifyBatchReply]:
        yield from verify_stream.serve_rounds(self._verifier, request_iterator, context)

    @rpc_method
    def Release(self, request: common_pb2.ReleaseRequest, context: Any) -> common_pb2.ReleaseReply:
        return common_pb2.ReleaseReply(released=self._verifier.release(request.session_id))

    @rpc_method
    def Load(self, request: verifier_pb2.LoadRequest, context: Any) -> verifier_pb2.LoadReply:
        load = self._verifier.serving_load()
        return verifier_pb2.LoadReply(open_sessions=load.open_sessions, max_sessions=load.max_sessions,
                                      queued=load.queued)


def service(verifier: SessionVerifier) -> Service:
    return Service(
        service_name(verifier_pb2, "Verifier"),
        VerifierServicer(verifier),
        verifier_pb2_grpc.add_VerifierServicer_to_server,
    )

"""gRPC servicer of the Cache service: proto <-> specpipe.protocols.NgramCache, nothing else."""

from __future__ import annotations

from specpipe.protocols import NgramCache
from specpipe.rpc import cache_convert
from specpipe.rpc.server import Service, rpc_method, service_name
from specpipe.v1 import cache_pb2, cache_pb2_grpc, common_pb2


class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(self, cache: NgramCache):
        self._cache = cache

    @rpc_method
    def Lookup(self, request, context):
        result = self._cache.lookup(request.session_id, tuple(request.context_suffix), request.k, request.width)
        return cache_convert.ngram_draft_to_proto(result)

    @rpc_method
    def RecordBranches(self, request, context):
        recorded = self._cache.record_branches(request.session_id, cache_convert.branches_from_proto(request))
        return cache_pb2.UpdateReply(recorded=recorded)

    @rpc_method
    def UpdateGlobal(self, request, context):
        return cache_pb2.UpdateReply(recorded=self._cache.update_global(tuple(request.tokens)))

    @rpc_method
    def Release(self, request, context):
        return common_pb2.ReleaseReply(released=self._cache.release(request.session_id))


def service(cache: NgramCache) -> Service:
    return Service(service_name(cache_pb2, "Cache"), CacheServicer(cache), cache_pb2_grpc.add_CacheServicer_to_server)

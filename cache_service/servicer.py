"""gRPC servicer of the Cache service: proto <-> specpipe.core.protocols.NgramCache, nothing else."""

from __future__ import annotations

from typing import Any

from specpipe.config.limits import DEFAULT_LIMITS, Limits, check_lookup
from specpipe.core.protocols import NgramCache
from specpipe.serving import cache_convert
from specpipe.serving.server import Service, rpc_method, service_name
from specpipe.v1 import cache_pb2, cache_pb2_grpc, common_pb2


class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(self, cache: NgramCache, limits: Limits = DEFAULT_LIMITS):
        self._cache = cache
        self._limits = limits

    @rpc_method
    def Lookup(self, request: cache_pb2.LookupRequest, context: Any) -> cache_pb2.LookupReply:
        check_lookup(request.session_id, request.context_suffix, self._limits)
        result = self._cache.lookup(request.session_id, tuple(request.context_suffix), request.k, request.width,
                                    request.tenant)
        return cache_convert.ngram_draft_to_proto(result)

    @rpc_method
    def RecordBranches(self, request: cache_pb2.RecordBranchesRequest, context: Any) -> cache_pb2.UpdateReply:
        recorded = self._cache.record_branches(request.session_id, cache_convert.branches_from_proto(request))
        return cache_pb2.UpdateReply(recorded=recorded)

    @rpc_method
    def UpdateGlobal(self, request: cache_pb2.UpdateGlobalRequest, context: Any) -> cache_pb2.UpdateReply:
        return cache_pb2.UpdateReply(recorded=self._cache.update_global(tuple(request.tokens), request.tenant))

    @rpc_method
    def Release(self, request: common_pb2.ReleaseRequest, context: Any) -> common_pb2.ReleaseReply:
        return common_pb2.ReleaseReply(released=self._cache.release(request.session_id))


def service(cache: NgramCache, limits: Limits = DEFAULT_LIMITS) -> Service:
    return Service(service_name(cache_pb2, "Cache"), CacheServicer(cache, limits),
                   cache_pb2_grpc.add_CacheServicer_to_server)

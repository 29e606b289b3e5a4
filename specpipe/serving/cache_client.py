"""specpipe.core.protocols.NgramCache over gRPC. A failed call raises the same specpipe.core.errors exception
the in-process store would (Unavailable when the cache service is down)."""

from __future__ import annotations

from typing import Sequence

from specpipe.core import ngram
from specpipe.core.ngram import NgramDraft
from specpipe.serving import cache_convert
from specpipe.serving.clients import Client, encoding
from specpipe.serving.security import Tls
from specpipe.v1 import cache_pb2, cache_pb2_grpc, common_pb2


class CacheClient(Client):
    def __init__(self, target: str, timeout_s: float | None = None, wait_for_ready: bool = False,
                 tls: Tls | None = None):
        super().__init__(target, timeout_s, wait_for_ready, tls=tls)
        self._stub = cache_pb2_grpc.CacheStub(self._channel)

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int,
               tenant: str = "") -> NgramDraft:
        with encoding("lookup request"):
            request = cache_convert.lookup_request_to_proto(session_id, context_suffix, k, width, tenant)
        return cache_convert.ngram_draft_from_proto(self._call(self._stub.Lookup, request))

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        if not branches:  # the common fully-accepted round: no call, as the stores (same errors)
            ngram.check_session_id(session_id)
            return 0
        with encoding("record_branches request"):
            request = cache_convert.record_branches_request_to_proto(session_id, branches)
        return self._call(self._stub.RecordBranches, request).recorded

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        with encoding("update_global request"):
            request = cache_pb2.UpdateGlobalRequest(tokens=tokens, tenant=tenant)
        return self._call(self._stub.UpdateGlobal, request).recorded

    def release(self, session_id: str) -> bool:
        return self._call(self._stub.Release, common_pb2.ReleaseRequest(session_id=session_id)).released

"""Pure conversions between cache.proto messages and the n-gram value types (specpipe.core.ngram).
Validation is not done here: the in-process stores validate, so both sides raise the same errors."""

from __future__ import annotations

from typing import Sequence

from specpipe.core.ngram import NgramDraft
from specpipe.serving.convert import draft_from_proto, draft_to_proto, sources_from_proto, sources_to_proto
from specpipe.v1 import cache_pb2


def lookup_request_to_proto(session_id: str, context_suffix: Sequence[int], k: int, width: int,
                            tenant: str = "") -> cache_pb2.LookupRequest:
    return cache_pb2.LookupRequest(session_id=session_id, context_suffix=context_suffix, k=k, width=width,
                                   tenant=tenant)


def ngram_draft_to_proto(result: NgramDraft) -> cache_pb2.LookupReply:
    return cache_pb2.LookupReply(draft=draft_to_proto(result.draft), levels=result.levels,
                                 sources=sources_to_proto(result.sources), confidence=result.confidence)


def ngram_draft_from_proto(msg: cache_pb2.LookupReply) -> NgramDraft:
    return NgramDraft(draft_from_proto(msg.draft), tuple(msg.levels), sources_from_proto(msg.sources),
                      tuple(msg.confidence))


def record_branches_request_to_proto(
    session_id: str, branches: Sequence[Sequence[int]]
) -> cache_pb2.RecordBranchesRequest:
    return cache_pb2.RecordBranchesRequest(
        session_id=session_id, branches=[cache_pb2.Branch(tokens=branch) for branch in branches])


def branches_from_proto(msg: cache_pb2.RecordBranchesRequest) -> list[tuple[int, ...]]:
    return [tuple(branch.tokens) for branch in msg.branches]

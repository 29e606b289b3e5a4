"""N-gram drafter: drafts from the shared n-gram store (ANPD Multi-Level N-gram lookup), no forward
pass at all. Drafts are deterministic (q = None, one-hot), so they also serve sampling: rejection
sampling accepts a token x with probability p(x) (DESIGN section 3)."""

from __future__ import annotations

import time
from dataclasses import replace

from specpipe import metrics
from specpipe.ngram import SUFFIX_TOKENS
from specpipe.protocols import NgramCache
from specpipe.types import ModelInfo, ProposeRequest, ProposeResult


class NgramDrafter:
    def __init__(self, cache: NgramCache, info: ModelInfo):
        self._cache = cache
        self._info = info  # the verifier's: the store holds the verifier's own tokens

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        """A lookup has no state to protect: every epoch is served."""
        start = time.perf_counter()
        width = request.width if request.sampling.greedy else 1
        found = self._cache.lookup(request.session_id, list(request.context[-SUFFIX_TOKENS:]), request.draft_len, width)
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.NGRAM_LOOKUPS.inc()
        for level in found.levels:
            metrics.NGRAM_DRAFT_TOKENS.labels(level=str(level)).inc()
        metrics.DRAFT_MS.labels(drafter="ngram").observe(draft_ms)
        return ProposeResult(replace(found.draft, sources=found.sources), draft_ms)

    def release(self, session_id: str) -> bool:
        return False  # the store's session tables belong to the orchestrator's session lifecycle

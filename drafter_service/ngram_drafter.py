"""N-gram drafter: drafts from the shared n-gram store (ANPD Multi-Level N-gram lookup), no forward
pass at all. Drafts are deterministic (q = None, one-hot), so they also serve sampling: rejection
sampling accepts a token x with probability p(x) (DESIGN section 3)."""

from __future__ import annotations

import time
from typing import Sequence

from specpipe import metrics
from specpipe.ngram import SUFFIX_TOKENS
from specpipe.protocols import NgramCache
from specpipe.types import Draft, ModelInfo, ProposeResult, SamplingParams


class NgramDrafter:
    def __init__(self, cache: NgramCache, info: ModelInfo):
        self._cache = cache
        self._info = info  # the verifier's: the store holds the verifier's own tokens

    def info(self) -> ModelInfo:
        return self._info

    def propose(
        self, session_id: str, context: Sequence[int], draft_len: int, width: int, sampling: SamplingParams,
        epoch: int = 0,
    ) -> ProposeResult:
        """A lookup has no state to protect, so every epoch is served."""
        start = time.perf_counter()
        found = self._cache.lookup(session_id, list(context[-SUFFIX_TOKENS:]), draft_len,
                                   width if sampling.greedy else 1)
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.NGRAM_LOOKUPS.inc()
        for level in found.levels:
            metrics.NGRAM_DRAFT_TOKENS.labels(level=str(level)).inc()
        metrics.DRAFT_MS.labels(drafter="ngram").observe(draft_ms)
        return ProposeResult(Draft(found.draft.tokens, found.draft.parents), draft_ms, found.sources)

    def release(self, session_id: str) -> bool:
        return False  # the store's session tables belong to the orchestrator's session lifecycle

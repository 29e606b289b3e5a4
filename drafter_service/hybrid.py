"""Hybrid drafter: the small model's chain/tree and the n-gram continuations merged into one token
tree (shared prefixes merged), at most max_nodes nodes (DESIGN section 4). The n-gram store failing
costs only its part of the tree. Sampling needs the model's q for every node, so with temperature > 0
the hybrid proposes the model's chain alone."""

from __future__ import annotations

import logging
import time
from typing import Sequence

from specpipe import metrics
from specpipe.protocols import Drafter
from specpipe.trees import merge_drafts
from specpipe.types import ModelInfo, ProposeResult, SamplingParams

log = logging.getLogger("specpipe.drafter")


class HybridDrafter:
    def __init__(self, model: Drafter, ngram: Drafter, nodes_per_level: int = 2):
        self._model = model
        self._ngram = ngram
        self._nodes_per_level = nodes_per_level  # tree budget: max_nodes = nodes_per_level * draft_len

    def info(self) -> ModelInfo:
        return self._model.info()

    def propose(
        self, session_id: str, context: Sequence[int], draft_len: int, width: int, sampling: SamplingParams
    ) -> ProposeResult:
        start = time.perf_counter()
        model = self._model.propose(session_id, context, draft_len, width, sampling)
        if not sampling.greedy:
            return model
        try:
            ngram = self._ngram.propose(session_id, context, draft_len, width, sampling)
        except Exception as err:  # a failing store costs the n-gram branch, not the round
            log.warning("n-gram lookup failed, drafting from the model only",
                        extra={"session_id": session_id, "error": str(err)})
            return model
        draft, _ = merge_drafts([model.draft, ngram.draft], self._nodes_per_level * draft_len)
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.DRAFT_MS.labels(drafter="hybrid").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def release(self, session_id: str) -> bool:
        return self._model.release(session_id)

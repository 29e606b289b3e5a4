"""Hybrid drafter: one token tree from the small model and the n-gram store (shared prefixes merged),
at most nodes_per_level * draft_len nodes (docs/design.md, "Drafting"), in this priority:

  1. the model's chain / tree;
  2. the n-gram continuation of the model's main chain: drafts past the model's depth at no forward
     cost, accepted when the chain is and the text goes on as it did before;
  3. the n-gram continuation of the context: an alternative to the model's first token.

The n-gram store failing costs only its part of the tree. Sampling needs the model's q for every
node, so with temperature > 0 the hybrid proposes the model's draft alone."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from specpipe.core.protocols import Drafter
from specpipe.core.trees import attach, first_path_nodes, merge_drafts
from specpipe.core.types import ModelInfo, ProposeRequest, ProposeResult
from specpipe.runtime import metrics

log = logging.getLogger("specpipe.drafter")


class HybridDrafter:
    def __init__(self, model: Drafter, ngram: Drafter, nodes_per_level: int = 2):
        self._model = model
        self._ngram = ngram
        self._nodes_per_level = nodes_per_level

    def info(self) -> ModelInfo:
        return self._model.info()

    def propose(self, request: ProposeRequest) -> ProposeResult:
        start = time.perf_counter()
        model = self._model.propose(request)
        if not request.sampling.greedy or request.draft_len <= 0:
            return model
        chain = model.draft.select(first_path_nodes(model.draft))
        try:
            extension = self._ngram.propose(replace(request, context=(*request.context, *chain.tokens), width=1))
            alternative = self._ngram.propose(request)
        except Exception as err:  # a failing store costs the n-gram branches, not the round
            log.warning("n-gram lookup failed, drafting from the model only",
                        extra={"session_id": request.session_id, "error": str(err)})
            return model
        parts = [model.draft, attach(chain, extension.draft, len(chain) - 1), alternative.draft]
        draft, _ = merge_drafts(parts, self._nodes_per_level * request.draft_len)
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.DRAFT_MS.labels(drafter="hybrid").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def release(self, session_id: str) -> bool:
        return self._model.release(session_id)

"""Hybrid drafter: one token tree from the small model and the n-gram store (shared prefixes merged),
at most nodes_per_level * draft_len nodes (DESIGN section 4), in this priority:

  1. the model's chain / tree;
  2. the n-gram continuation of the model's main chain: drafts past the model's depth at no forward
     cost, accepted when the chain is and the text goes on as it did before;
  3. the n-gram continuation of the context: an alternative to the model's first token.

The n-gram store failing costs only its part of the tree. Sampling needs the model's q for every
node, so with temperature > 0 the hybrid proposes the model's draft alone."""

from __future__ import annotations

import logging
import time
from typing import Sequence

from specpipe import metrics
from specpipe.protocols import Drafter
from specpipe.trees import first_path_nodes, merge_drafts
from specpipe.types import Draft, ModelInfo, ProposeResult, SamplingParams

log = logging.getLogger("specpipe.drafter")


class HybridDrafter:
    def __init__(self, model: Drafter, ngram: Drafter, nodes_per_level: int = 2):
        self._model = model
        self._ngram = ngram
        self._nodes_per_level = nodes_per_level

    def info(self) -> ModelInfo:
        return self._model.info()

    def propose(
        self, session_id: str, context: Sequence[int], draft_len: int, width: int, sampling: SamplingParams,
        epoch: int = 0,
    ) -> ProposeResult:
        start = time.perf_counter()
        model = self._model.propose(session_id, context, draft_len, width, sampling, epoch)
        if not sampling.greedy or draft_len <= 0:
            return model
        chain_nodes = first_path_nodes(model.draft)
        chain = [model.draft.tokens[node] for node in chain_nodes]
        try:
            extension = self._ngram.propose(session_id, [*context, *chain], draft_len, 1, sampling)
            alternative = self._ngram.propose(session_id, context, draft_len, width, sampling)
        except Exception as err:  # a failing store costs the n-gram branches, not the round
            log.warning("n-gram lookup failed, drafting from the model only",
                        extra={"session_id": session_id, "error": str(err)})
            return model
        extended = Draft.chain([*chain, *extension.draft.tokens])  # a chain lookup: its nodes are a chain
        parts = [(model.draft, model.sources or ("model",) * len(model.draft)),
                 (extended, ("model",) * len(chain) + extension.sources),
                 (alternative.draft, alternative.sources)]
        draft, origins = merge_drafts([d for d, _ in parts], self._nodes_per_level * draft_len)
        sources = tuple(parts[part][1][node] for part, node in origins)
        model_hints = node_hints(model)
        hints = [model_hints, [model_hints[n] for n in chain_nodes] + node_hints(extension), node_hints(alternative)]
        confidence, runner_up, runner_up_confidence = zip(*(hints[part][node] for part, node in origins)) \
            if origins else ((), (), ())
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.DRAFT_MS.labels(drafter="hybrid").observe(draft_ms)
        return ProposeResult(draft, draft_ms, sources, confidence, runner_up, runner_up_confidence)

    def release(self, session_id: str) -> bool:
        return self._model.release(session_id)


def node_hints(result: ProposeResult) -> list[tuple[float, int, float]]:
    """Per node (confidence, runner_up, runner_up_confidence); (-1, -1, 0) where the drafter has none."""
    if not result.confidence:
        return [(-1.0, -1, 0.0)] * len(result.draft)
    return list(zip(result.confidence, result.runner_up, result.runner_up_confidence))

"""N-gram drafter (ANPD Multi-Level N-gram, and SuffixDecoding's drafts from learned outputs), no
forward pass at all. Two sources, compared on their merits: the session's own context, searched here
in the tokens the request carries (as vLLM's n-gram proposer does: no store round trip, no per-round
store update), and the shared store (one lookup: the session's verifier table and the tenant's
learned store of finished outputs, specpipe.core.learned). Each draft's nodes carry a confidence from
their evidence (the match's length, the continuation's share); the one expected to land more tokens
is drafted, and where its chain ends short of k the other source continues it. Drafts are
deterministic (q = None, one-hot), so they also serve sampling: rejection sampling accepts a token
x with probability p(x) (docs/design.md, "Verification").
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from specpipe.core import ngram
from specpipe.core.ngram import SUFFIX_TOKENS, NgramConfig, NgramDraft
from specpipe.core.protocols import NgramCache
from specpipe.core.tenancy import tenant_label
from specpipe.core.trees import first_path
from specpipe.core.types import ModelInfo, ProposeRequest, ProposeResult
from specpipe.runtime import cpu, metrics
from specpipe.runtime.breaker import Breaker

log = logging.getLogger("specpipe.drafter")


@functools.lru_cache(maxsize=None)
def draft_tokens(level: str) -> Any:
    """The draft tokens of an n-gram level ("long": past max_n; labels bound once, a lookup drafts tens)."""
    return metrics.NGRAM_DRAFT_TOKENS.labels(level=level)


@functools.lru_cache(maxsize=None)
def draft_time() -> Any:
    return metrics.DRAFT_MS.labels(drafter="ngram")


@functools.lru_cache(maxsize=1024)
def learned_metrics(tenant: str) -> tuple[Any, Any]:
    """A tenant's learned-store lookups and hits (labels bound once; the label a hash of the id)."""
    label = tenant_label(tenant)
    return metrics.LEARNED_LOOKUPS.labels(tenant=label), metrics.LEARNED_HITS.labels(tenant=label)


class NgramDrafter:
    def __init__(self, cache: NgramCache | None, info: ModelInfo, config: NgramConfig = NgramConfig()):
        """cache: the store of the verifier tables and the learned stores (None: the context alone)."""
        self._cache = cache
        self._info = info  # the verifier's: the store holds the verifier's own tokens
        self._config = config
        self._breaker = Breaker()  # a store that fails is skipped for a while, not waited for every round
        if cache is not None:
            metrics.zero(metrics.CACHE_FAILURES, {"call": "lookup"})

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        """A lookup has no state to protect: every epoch is served."""
        with cpu.hop("drafter", "ngram"):
            return self._propose(request)

    def _propose(self, request: ProposeRequest) -> ProposeResult:
        start = time.perf_counter()
        width = request.width if request.sampling.greedy else 1
        k = min(request.draft_len, self._config.max_draft_len)
        found = self._context(request.context, k, width)
        if self._cache is not None and k > 0:
            stored = self._stored(request, [], k, width)
            if ngram.better(found, stored) is stored:
                found = stored
                chain = first_path(found.draft)
                if len(chain) < k:  # the context goes on where the store's match ends
                    found = ngram.after_chain(found, self._context([*request.context, *chain], k - len(chain), 1))
            else:
                chain = first_path(found.draft)
                if len(chain) < k:
                    found = ngram.after_chain(
                        found, self._stored(request, chain, k - len(chain), 1 if chain else width)
                    )
        draft_ms = (time.perf_counter() - start) * 1e3
        metrics.NGRAM_LOOKUPS.inc()
        levels = Counter(str(level) if level <= self._config.max_n else "long" for level in found.levels)
        for level, tokens in levels.items():
            draft_tokens(level).inc(tokens)
        draft_time().observe(draft_ms)
        return ProposeResult(found.as_draft(), draft_ms)

    def _context(self, context: Sequence[int], k: int, width: int) -> NgramDraft:
        return ngram.context_lookup(context, k, width, self._config.max_n, self._config.max_continuations)

    def _stored(self, request: ProposeRequest, chain: list[int], k: int, width: int) -> NgramDraft:
        """The store's continuation after the context and chain; a store that fails costs its part,
        and is skipped (specpipe.runtime.breaker) until its pause has passed."""
        if self._cache is None or not self._breaker.allows():
            return ngram.EMPTY_NGRAM_DRAFT
        suffix = [*request.context[-SUFFIX_TOKENS:], *chain][-SUFFIX_TOKENS:]
        try:
            with cpu.hop("store", "lookup"):
                found = self._cache.lookup(request.session_id, suffix, k, width, request.tenant)
        except Exception as err:
            self._breaker.failed()
            metrics.CACHE_FAILURES.labels(call="lookup").inc()
            log.warning("n-gram store lookup failed, drafting from the context only",
                        extra={"session_id": request.session_id, "error": str(err)})
            return ngram.EMPTY_NGRAM_DRAFT
        self._breaker.succeeded()
        lookups, hits = learned_metrics(request.tenant)
        lookups.inc()
        if "global" in found.sources:
            hits.inc()
        return found

    def release(self, session_id: str) -> bool:
        return False  # the store's session tables belong to the orchestrator's session lifecycle

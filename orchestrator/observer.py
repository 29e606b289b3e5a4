"""What a round leaves behind besides its tokens: Prometheus metrics, and the n-gram store's tables
(the orchestrator, not the verifier, forwards confirmed tokens and the verifier's argmax to it).

Store calls run off the per-token path, in order, on one background thread: a round does not wait
for the store, and a session's release waits for its records before it returns. A store that is down
or slow costs drafts, never the generation: every store call is guarded, and after a failure the
calls are skipped for a while (specpipe.runtime.breaker: the tables are a cache, and expire on their own)."""

from __future__ import annotations

import functools
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from orchestrator.branch import Resolution
from orchestrator.generation import Generation
from specpipe.core.learned import MATCH_TOKENS
from specpipe.core.ngram import SUFFIX_TOKENS, verifier_branches
from specpipe.core.protocols import NgramCache
from specpipe.core.types import ROUND_PARTS, ProposeResult, RoundStats, SpeculationOptions, VerifyResult
from specpipe.runtime import cpu, metrics
from specpipe.runtime.breaker import Breaker

log = logging.getLogger("specpipe.orchestrator")


class RoundObserver:
    def __init__(self, store: NgramCache | None, learn_global: bool):
        self.store = store
        # Finished outputs, after the tail of their prompt, go to their tenant's learned store if
        # learn_global (on by default: a tenant is one trust domain, docs/security.md); otherwise it
        # holds `specpipe cache seed` corpora alone.
        self.learn_global = learn_global
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specpipe-store")  # FIFO: records in order
        self._breaker = Breaker()

    def verified(self, gen: Generation, proposal: ProposeResult, result: VerifyResult) -> None:
        """Before gen confirms the round: the verifier's argmax after each rejected draft node to the
        session's verifier table (its confirmed tokens need no store: the drafter searches its context)."""
        if self.store is None or not len(proposal.draft):
            return
        tail = gen.context[-SUFFIX_TOKENS:]  # ends with the draft's root
        branches = verifier_branches(tail, proposal.draft, result.accepted_nodes, result.node_argmax)
        if branches:
            self._guard("record_branches", self.store.record_branches, gen.session_id, branches)

    def finished(self, gen: Generation) -> None:
        if self.store is not None and self.learn_global and gen.output:
            # the prompt's tail too: a repeat of the prompt matches it, and drafts the output from its first round
            learned = [*gen.request.prompt_ids[-MATCH_TOKENS:], *gen.output]
            self._guard("update_global", self.store.update_global, learned, gen.request.tenant)
        metrics.GENERATIONS.labels(finish_reason=gen.finish).inc()

    def released(self, session_id: str) -> None:
        """Drop the session's tables once everything queued before has reached the store."""
        if self.store is not None:
            self._guard("release", self.store.release, session_id).result()

    def _guard(self, call: str, fn: Callable[..., object], *args: Any) -> Future[None]:
        return self._calls.submit(self._guarded, call, fn, *args)

    def _guarded(self, call: str, fn: Callable[..., object], *args: Any) -> None:
        if not self._breaker.allows():
            return
        try:
            with cpu.hop("store", call):
                fn(*args)
        except Exception as err:
            self._breaker.failed()
            metrics.CACHE_FAILURES.labels(call=call).inc()
            log.warning("n-gram store call failed", extra={"call": call, "error": str(err)})
        else:
            self._breaker.succeeded()


class _RoundMetrics:
    """A drafter's round metrics, their labels bound once (a labels() lookup costs a microsecond or two,
    and a round counts a dozen)."""

    def __init__(self, drafter: str, schedule: str):
        self.rounds = metrics.ROUNDS.labels(drafter=drafter)
        self.drafted = metrics.DRAFTED_TOKENS.labels(drafter=drafter)
        self.accepted = metrics.ACCEPTED_TOKENS.labels(drafter=drafter)
        self.emitted = metrics.EMITTED_TOKENS.labels(drafter=drafter)
        self.draft_ms = metrics.DRAFT_TIME_MS.labels(drafter=drafter)
        self.hidden_ms = metrics.HIDDEN_DRAFT_MS.labels(drafter=drafter)
        self.idle_ms = metrics.VERIFIER_IDLE_MS.labels(schedule=schedule, drafter=drafter)
        self.round_ms = metrics.ROUND_MS.labels(drafter=drafter)
        self.parts = [(f"{part}_ms", metrics.ROUND_PART_MS.labels(drafter=drafter, part=part)) for part in ROUND_PARTS]
        self.forward = metrics.ROUND_PART_MS.labels(drafter=drafter, part="forward")
        self._drafter = drafter

    @functools.lru_cache(maxsize=None)
    def source(self, source: str) -> tuple:
        return (metrics.SOURCE_DRAFTED.labels(source=source, drafter=self._drafter),
                metrics.SOURCE_ACCEPTED.labels(source=source, drafter=self._drafter))


@functools.lru_cache(maxsize=None)
def round_metrics(drafter: str, schedule: str) -> _RoundMetrics:
    return _RoundMetrics(drafter, schedule)


def count_round(spec: SpeculationOptions, proposal: ProposeResult, result: VerifyResult, emitted: int,
                resolution: Resolution, idle_ms: float, round_ms: float) -> None:
    bound = round_metrics(spec.drafter, spec.schedule)
    if len(proposal.draft):
        sources = proposal.draft.node_sources()
        for source in sources:
            bound.source(source)[0].inc()
        for node in result.accepted_nodes:
            bound.source(sources[node])[1].inc()
    bound.rounds.inc()
    bound.drafted.inc(len(proposal.draft))
    bound.accepted.inc(len(result.accepted_tokens))
    bound.emitted.inc(emitted)
    bound.draft_ms.inc(proposal.draft_ms)
    bound.hidden_ms.inc(resolution.hidden_ms)
    bound.idle_ms.inc(idle_ms)
    bound.round_ms.observe(round_ms)


def count_parts(spec: SpeculationOptions, stats: RoundStats) -> None:
    """Where the round's time went (ROUND_PARTS), and of the verify call the verifier's forward."""
    bound = round_metrics(spec.drafter, spec.schedule)
    for field_name, counter in bound.parts:
        counter.inc(getattr(stats, field_name))
    bound.forward.inc(stats.verify_ms)


def count_prediction(spec: SpeculationOptions, resolution: Resolution) -> None:
    if not resolution.issued:
        return
    labels = {"drafter": spec.drafter, "predictor": spec.predictor}
    metrics.HYPOTHESES.labels(**labels).inc(resolution.issued)
    (metrics.PREDICTION_HITS if resolution.hit else metrics.PREDICTION_MISSES).labels(**labels).inc()
    metrics.WASTED_DRAFT_TOKENS.labels(drafter=spec.drafter).inc(resolution.wasted)

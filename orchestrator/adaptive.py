"""Adaptive speculation (docs/design.md, "Adaptive control"): how much to draft next round, from
what rounds cost and what they yield (the cost model: orchestrator/costs.py).

- Cost (ProPD section 4.2): the verifier's forward time is linear in the tokens it feeds, T(n) =
  a + b*n, fitted online by least squares weighted toward recent rounds (n: every session's tokens
  in a batched forward); drafting time is fitted the same way against the draft length.
- Yield: a_i = P(draft token i accepted | the tokens before it were), per drafter and depth,
  calibrated online (per session, leaning on the estimate of all sessions until it has its own
  evidence). A round of k drafts then yields E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens.
  a_i is also learned per draft source (the small model, or the n-gram drafter's context, verifier
  table or learned store), leaning on the rate of all sources at that depth.
- Entropy gate (Cerberus): a_1 is estimated separately for each bin of the verifier's entropy at
  the last position, so where the verifier is unsure, the first draft token is predicted to fail
  and the choice below drafts little or nothing. The threshold is not a constant: it is wherever
  the learned a_1 makes speculation stop paying.
- Choice: the k in 0..k_max with the most expected tokens per second, E(k) / round_ms(k), where a
  round costs the draft time that is not hidden plus T(k + 1). k = 0 is plain decoding, so
  speculation is chosen only where it is expected to pay.
- Evidence: the n-gram drafter's drafts cost nothing, so it is asked for FREE_DRAFT_FACTOR times
  the cap every round and the tree budget below decides what is verified. A node drafted from the
  session's context or the tenant's learned store carries a confidence from its match (the match's
  length, the continuation's share: specpipe.core.learned); its rate is learned per confidence bin,
  starting from that confidence, so a session's first rounds on recurring text already keep long
  drafts, and a short or rare match's tokens are cut, also right after a long copy has ended.
- Tree budget: once a draft is there, its sources and shape are known. Each node is accepted with
  P(parent accepted) times the rate of its rank among its siblings: the first child's rate is a_d
  for its source, an alternative's (model rank r >= 1: the drafter's r-th runner-up, or an n-gram
  branch) is learned per depth and rank. The draft is cut to the most likely nodes, as many as give
  the most expected tokens per millisecond, the draft time being spent whatever is kept. A chain
  the choice above sized is not cut where its sources' rates match those of all sources; a tree
  (--width) keeps its alternatives only where they pay for the longer verification.
- N-gram first (a hybrid): each fresh round first looks the free n-gram drafter up; where its draft,
  cut by the tree budget, is expected to land at least as many tokens per millisecond as a round
  drafting k with the small model, the round verifies it alone and the model sits the round out.
- Load (goodput): a verifier that batches puts this session's k + 1 tokens into a forward with
  the other sessions' tokens; the choice counts the tokens of the whole forward against its time,
  so a draft token is verified only where it is expected to land more often than the batch gains
  per token of forward time, and under heavy load speculation falls to plain batched decoding.
  Sessions that do not share the forward (an unbatched verifier) take turns: a round takes at least
  that many forwards; the drafter serves one session at a time. Pre-drafts beyond one per round,
  which would take the shared drafter from other sessions, stop under load.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable
from typing import Sequence

from orchestrator.costs import (
    Sharing,
    best_budget,
    best_budget_rate,
    choose_draft_len,
    hypotheses_that_fit,
    node_acceptance,
    round_rate,
)
from orchestrator.estimates import Acceptance, Rates, confidence_bin, depth_key, shrink
from specpipe.core.fits import Ewma, LinearFit
from specpipe.core.types import FREE_DRAFT_FACTOR

ENTROPY_EDGES = (0.1, 0.5, 1.0, 2.0, 3.0)  # nats: upper edges of the entropy bins, the last bin open
PRIOR_ACCEPTANCE = 0.6    # a_i before any round was seen: optimistic enough to try drafting
PRIOR_WEIGHT = 2.0        # pseudo-rounds of the prior in the shared estimate
SOURCE_WEIGHT = 4.0       # pseudo-rounds of the all-sources rate in a source's shared estimate
SESSION_WEIGHT = 6.0      # pseudo-rounds of the shared estimate in a session's
PROBE_AFTER = 4           # rounds without a draft before drafting one token to look again
MAX_PROBE_AFTER = 64      # ... doubling after each failed probe, up to this many
PROBE_SHARE = 0.03        # ... and never so often that probes take more than this share of plain rounds' time
FREE_DRAFTERS = (
    "ngram",
)  # drafters whose drafts cost nothing: asked for FREE_DRAFT_FACTOR x the cap, the tree budget cuts
STOP_CONFIDENCE = 0.4     # a model's greedy chain ends after a token it gives less (transformers' assisted generation's
                          # assistant_confidence_threshold): the cap bounds a draft, its confidence ends it
EVIDENCE_SOURCES = ("global", "context")  # sources whose nodes' confidences are evidence: a match's length


def entropy_bin(nats: float | None) -> int:
    """The entropy bin of the verifier's entropy at the last position; -1 before the first round."""
    return -1 if nats is None else bisect.bisect_left(ENTROPY_EDGES, nats)


class SharedModels:
    """What all generations of one orchestrator learn together, per drafter kind: the verifier's
    cost line, the drafter's cost line, a round's overhead and the acceptance rates."""

    def __init__(self):
        self.verify = LinearFit()                   # verify_ms against tokens fed in the forward (all sessions')
        self.overhead = LinearFit()                 # ms of a verify call beyond the forward (at x = 0)
        self.batch_sessions = Ewma()                # sessions per verifier forward
        self.others_fed = Ewma()                    # tokens of other sessions in a round's forward
        self.emitted = Ewma()                       # tokens a session-round emits
        self.draft: dict[str, LinearFit] = {}       # drafter kind -> draft_ms against draft nodes
        self.acceptance = Rates()                   # (kind[, source], depth | entropy bin) -> hits, trials
        self.probe: dict[str, LinearFit] = {}       # drafter kind -> ms of a probe (at x = 0), catch-up included
        self._lock = threading.Lock()

    def draft_fit(self, kind: str) -> LinearFit:
        with self._lock:
            return self.draft.setdefault(kind, LinearFit(proportional=True))

    def probe_fit(self, kind: str) -> LinearFit:
        with self._lock:
            return self.probe.setdefault(kind, LinearFit())


class AdaptiveController:
    """One generation's choice of draft length (and pre-drafts) each round."""

    def __init__(self, shared: SharedModels, kind: str, k_max: int, m_max: int):
        """k_max: the longest draft (also the first round's, before any timing is known); m_max:
        the most pre-drafts per round (branch schedule)."""
        self._shared = shared
        self._kind = kind
        self._k_max = k_max * FREE_DRAFT_FACTOR if kind in FREE_DRAFTERS else k_max
        self._m_max = m_max
        self._acceptance = Acceptance(shared.acceptance, SESSION_WEIGHT)
        self._hits = [0, 0]            # branch schedule: rounds whose draft came from a pre-draft, rounds
        self._entropy_bin = -1         # of the verifier at the last position
        self._since_draft = 0          # rounds in a row without a draft
        self._probe_after = PROBE_AFTER
        # this round's free draft sufficed (n-gram first), the drafter sitting it out: (its parents, the nodes kept)
        self._free_first: tuple[Sequence[int], list[int]] | None = None
        self._rounds = 0

    def sharing(self, load: int = 1) -> Sharing:
        """How this session's rounds share the verifier and the drafter, from recent rounds: the other
        sessions of its forwards (a batching verifier), and the other generations of this
        orchestrator (load, itself included) that take turns where they are not in its forward."""
        sessions = max(1.0, self._shared.batch_sessions.mean(1.0))
        others_emitted = (sessions - 1) * self._shared.emitted.mean(1.0)
        return Sharing(self._shared.others_fed.mean(), others_emitted, max(1.0, load / sessions), max(1.0, load))

    def _key(self, depth: int, source: str | None = None) -> tuple:
        """The first depth by the current entropy bin, the others by depth; optionally per source."""
        at = ("first", self._entropy_bin) if depth == 1 else ("depth", depth_key(depth))
        return (self._kind, *at) if source is None else (self._kind, source, *at)

    def _alternative_key(self, depth: int, rank: int) -> tuple:
        return self._kind, "alternative", depth_key(depth), rank

    def _rate(self, key: tuple, prior: float = PRIOR_ACCEPTANCE, prior_weight: float = PRIOR_WEIGHT) -> float:
        return self._acceptance.rate(key, prior, prior_weight)

    def _source_rate(self, depth: int, source: str) -> float:
        return self._rate(self._key(depth, source), self._rate(self._key(depth)), SOURCE_WEIGHT)

    def _evidence_key(self, source: str, confidence: float) -> tuple:
        return self._kind, "evidence", source, confidence_bin(confidence)

    def _node_rate(self, depth: int, source: str, confidence: float) -> float:
        """P(a chain node is accepted | its parent was): by its evidence where its source has it."""
        if source in EVIDENCE_SOURCES and confidence >= 0:
            return self._rate(self._evidence_key(source, confidence), confidence, SOURCE_WEIGHT)
        return self._source_rate(depth, source)

    def acceptance(self, sources: Sequence[str] | None = None) -> list[float]:
        """a_1..a_kmax over all sources; with the sources of a draft's main chain, a_1..a_len for
        those sources."""
        if sources is None:
            return [self._rate(self._key(d)) for d in range(1, self._k_max + 1)]
        return [self._source_rate(d, source) for d, source in enumerate(sources, start=1)]

    def hit_rate(self) -> float:
        hits, rounds = self._hits
        return shrink(hits, rounds, 0.5, 2.0)

    def draft_len(self, load: int = 1, branch: bool = False) -> int:
        """This round's k; 0 is plain decoding, except for a one-token probe now and then so that a
        session which stopped drafting notices when drafts would pay again."""
        verify, draft = self._shared.verify, self._shared.draft_fit(self._kind)
        if verify.line() is None or self._kind in FREE_DRAFTERS:  # nothing measured yet, or a free draft
            return self._k_max
        k = choose_draft_len(self.acceptance(), verify.predict, lambda k: draft.predict(k) if k else 0.0,
                             self._k_max, self.hit_rate() if branch else 0.0, self.sharing(load),
                             self._shared.overhead.predict(0))
        if k == 0 and self._probe_due():
            return min(1, self._k_max)
        return k

    def _probe_due(self) -> bool:
        """After rounds without a draft: whether this round drafts one token to look again. The wait
        doubles after each failed probe, and is at least as long as keeps probes (whose draft
        includes the drafter's catch-up on every token since its last draft) within PROBE_SHARE of
        the time of plain rounds."""
        plain_ms = self._shared.verify.predict(1) + self._shared.overhead.predict(0)
        probe_ms = self._shared.probe_fit(self._kind).predict(0)
        wait = max(self._probe_after, math.ceil(probe_ms / (PROBE_SHARE * max(plain_ms, 1e-3))))
        return self._since_draft + 1 >= wait

    def free_suffices(self, parents: Sequence[int], sources: Sequence[str], confidence: Sequence[float] | None,
                      draft_ms: float, k: int, load: int = 1, branch: bool = False) -> bool:
        """N-gram first: whether the free drafter's draft (found in draft_ms), cut by the tree budget,
        is expected to land at least as many tokens per millisecond as a round that drafts k tokens
        with this drafter. Such a round sits the drafter out (observe(..., free=True)); keep() then
        returns the cut already made."""
        verify, draft = self._shared.verify, self._shared.draft_fit(self._kind)
        if verify.line() is None or draft.line() is None:  # nothing measured yet
            return False
        sharing, overhead = self.sharing(load), self._shared.overhead.predict(0)
        nodes, free_rate = best_budget_rate(node_acceptance(parents, self._node_rater(sources, confidence)),
                                            verify.predict, draft_ms + overhead, sharing)
        model_rate = round_rate(self.acceptance(), k, verify.predict, draft.predict,
                                self.hit_rate() if branch else 0.0, sharing, overhead)
        self._free_first = (parents, nodes) if free_rate >= model_rate else None
        return self._free_first is not None

    def _node_rater(self, sources: Sequence[str],
                    confidence: Sequence[float] | None) -> Callable[[int, int, int], float]:
        """rate(node, depth, rank) for node_acceptance: P(node accepted | its parent was and its earlier
        siblings were not), by rank, source and evidence. Each rate is looked up once a draft: the nodes
        of a long copy share their source and evidence."""
        rates: dict[tuple, float] = {}

        def rate(node: int, depth: int, rank: int) -> float:
            source, evidence = sources[node], confidence[node] if confidence else -1.0
            key = ("rank", rank, depth) if rank else ("evidence", source, evidence) \
                if evidence >= 0 and source in EVIDENCE_SOURCES else ("depth", source, depth)  # what it depends on
            if key not in rates:
                rates[key] = self._rate(self._alternative_key(depth, rank)) if rank else \
                    self._node_rate(depth, source, evidence)
            return rates[key]

        return rate

    def keep(self, parents: Sequence[int], sources: Sequence[str], draft_ms: float, load: int = 1,
             confidence: Sequence[float] | None = None) -> list[int]:
        """The nodes of a draft (its parents, each node's source and confidence) worth verifying
        (best_budget); all of them before any timing is known, and in a round due a probe."""
        if self._free_first is not None and self._free_first[0] is parents:  # the free draft free_suffices cut
            return list(self._free_first[1])
        if self._shared.verify.line() is None or self._probe_due():
            return list(range(len(parents)))
        return best_budget(node_acceptance(parents, self._node_rater(sources, confidence)), self._shared.verify.predict,
                           draft_ms + self._shared.overhead.predict(0), self.sharing(load))

    def hypotheses(self, k: int, load: int = 1) -> int:
        """Pre-drafts for the round in flight, whose main chain has k tokens: as many drafts of about
        that length as fit in its verification; one under load. No pre-draft for a free drafter: its lookup
        takes about a millisecond, which a pre-draft hides only on a hit, while beside the forward it
        costs the verification about as much (on smollm2, 2.3% more wall time than it hid)."""
        if self._kind in FREE_DRAFTERS:
            return 0
        if load > 1:
            return 1
        forward_ms = self._shared.verify.predict(self.sharing(load).others_fed + k + 1)
        return hypotheses_that_fit(forward_ms, self._shared.draft_fit(self._kind).predict(k), self._m_max)

    def observe(self, drafted: int, accepted: int, verify_ms: float, draft_ms: float, entropy: float,
                call_ms: float | None = None, *, sources: Sequence[str] = (), confidence: Sequence[float] = (),
                draft_tokens: int | None = None,
                nodes: int | None = None, alternatives: Sequence[tuple[int, int, bool]] = (),
                batch_sessions: int = 1, batch_tokens: int = 0, free: bool = False) -> None:
        """Learn from a round: the main-chain tokens verified and how many were accepted, its timings
        (call_ms: the verify call as the orchestrator saw it), the verifier's entropy at the new
        last position, the source and confidence of each of those tokens (() = all from the model,
        none), how many chain
        tokens draft_ms drafted (default: drafted; more where keep() cut the draft), the draft nodes
        verified (default: drafted), (depth, rank, accepted) of each alternative tried, and the
        verifier forward the round was part of (its sessions and tokens; 0 tokens: not reported).
        free: the draft came from the free drafter in a round this one sat out (Proposer.free): its
        acceptance is learned, its time and the probe clock are not this drafter's."""
        probe = drafted > 0 and not free and self._probe_due()  # as draft_len saw it, before this round's timings
        fed = (drafted if nodes is None else nodes) + 1
        self._shared.verify.add(max(fed, batch_tokens), verify_ms)
        self._shared.batch_sessions.add(max(1, batch_sessions))
        self._shared.others_fed.add(max(0, batch_tokens - fed))
        self._shared.emitted.add(accepted + 1)
        for depth, rank, hit in alternatives:
            self._acceptance.add(self._alternative_key(depth, rank), hit)
        if call_ms is not None:
            self._shared.overhead.add(0, max(0.0, call_ms - verify_ms))
        for depth in range(1, min(drafted, accepted + 1) + 1):  # the depths that were tried
            source = sources[depth - 1] if sources else "model"
            keys = [self._key(depth, source)] if free else [self._key(depth), self._key(depth, source)]
            if source in EVIDENCE_SOURCES and confidence and confidence[depth - 1] >= 0:
                keys.append(self._evidence_key(source, confidence[depth - 1]))
            for key in keys:
                self._acceptance.add(key, depth <= accepted)
        if drafted and not free:
            if self._rounds and not probe:  # those include the drafter's prefill of the prompt or a catch-up
                self._shared.draft_fit(self._kind).add(drafted if draft_tokens is None else draft_tokens, draft_ms)
            if probe:
                self._shared.probe_fit(self._kind).add(0, draft_ms)
                self._probe_after = PROBE_AFTER if accepted else min(2 * self._probe_after, MAX_PROBE_AFTER)
            self._since_draft = 0
        elif self._free_first is None:  # a round the free draft sufficed for is not one that stopped drafting
            self._since_draft += 1
        self._free_first = None
        self._entropy_bin = entropy_bin(entropy)
        self._rounds += 1

    def observe_prediction(self, hit: bool) -> None:
        """Branch schedule: whether the next round's draft came from a pre-draft."""
        self._hits[0] += hit
        self._hits[1] += 1

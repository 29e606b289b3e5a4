"""The generation loop: draft -> verify -> emit, written once against the Drafter and Verifier
protocols, so the embedded default and the distributed deployment run the same code.

A round is composed of parts: the Generation (per-request state, orchestrator/generation.py), a
Schedule (sequential or branch: where the next draft comes from, orchestrator/schedules.py), a
DraftPolicy (fixed or adaptive: how much to draft and verify, orchestrator/policies.py) and a
RoundObserver (metrics and the n-gram store, orchestrator/observer.py).

Only the verifier's tokens are emitted: each round emits the accepted draft tokens and the
correction. A failing drafter costs speed, never correctness: the round goes on without a draft.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

from orchestrator.adaptive import FREE_DRAFTERS, STOP_CONFIDENCE, SharedModels
from orchestrator.branch import NO_SPECULATION, Resolution
from orchestrator.detokenize import Detokenizer
from orchestrator.gate import SpeculationGate
from orchestrator.generation import Generation
from orchestrator.inputs import chat_ids, check_input
from orchestrator.observer import RoundObserver, count_parts, count_prediction, count_round
from orchestrator.policies import AdaptivePolicy, DraftPolicy, FixedPolicy, Verified
from orchestrator.predictors import new_predictor, new_shared
from orchestrator.schedules import Branch, Proposer, Round, Schedule, Sequential
from orchestrator.spans import Traced
from specpipe.config.limits import DEFAULT_LIMITS, Limits, check_generation
from specpipe.core.errors import FailedPrecondition, InvalidArgument, SpecpipeError
from specpipe.core.protocols import Drafter, NgramCache, Verifier
from specpipe.core.sampling import check_sampling
from specpipe.core.tenancy import check_tenant, session_prefix
from specpipe.core.trees import fit_nodes, within_depth
from specpipe.core.types import (
    ADAPTIVE,
    ALL_HYPOTHESES,
    DRAFTER_KINDS,
    FREE_DRAFT_FACTOR,
    PREDICTORS,
    ROUND_PARTS,
    SCHEDULES,
    GenerationChunk,
    GenerationRequest,
    ProposeRequest,
    ProposeResult,
    RoundStats,
    SpeculationOptions,
    VerifyResult,
)
from specpipe.core.verification import check_token_ids
from specpipe.runtime import cpu
from specpipe.runtime.lifecycle import ContextPool, cancel_scope, deadline_scope, random_seed
from specpipe.runtime.traced import traced_drafter, traced_verifier

log = logging.getLogger("specpipe.orchestrator")

# Sessions sharing a verifier forward beyond which a draft is cut to its captured step (ModelInfo.max_step_tokens):
# a longer step adds about a forward, which pays while the others lose less than it lands (at ~4 tokens a
# round each, a few sessions; on the packaged GPU curve, code: 4 users gained from long steps, 16 lost).
CROWDED_SESSIONS = 4


class Load:
    """Generations running now: they share the verifier and the drafter (adaptive control's load)."""

    def __init__(self):
        self.active = 0
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        with self._lock:
            self.active += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1


class Generator:
    def __init__(
        self,
        tokenizer: Any,
        verifier: Verifier,
        drafters: Mapping[str, Drafter],
        defaults: SpeculationOptions = SpeculationOptions(),
        cache: NgramCache | None = None,
        learn_global: bool = True,
        limits: Limits = DEFAULT_LIMITS,
        shared_cores: bool = False,
    ):
        """shared_cores: the drafters' forwards run on the verifier's cores (one process,
        specpipe.engine.cores), so a pre-draft slows the forward beside it about as much as it hides:
        adaptive control drafts a model's rounds sequentially there."""
        self.tokenizer = tokenizer
        self.verifier = traced_verifier(verifier)  # spans where tracing is on (specpipe.runtime.traced)
        self.drafters = {kind: traced_drafter(drafter, kind) for kind, drafter in drafters.items()}
        self.defaults = defaults
        self.limits = limits  # input caps (specpipe.config.limits), checked before any work
        self.cache = cache  # the n-gram store: the orchestrator forwards every confirmed token to it
        self.observer = RoundObserver(cache, learn_global)
        self.info = verifier.info()
        # per generation: a verify, a pre-draft worker (branch) and a drafter warm-up, at 64 generations
        self._pool = ContextPool(max_workers=192, thread_name_prefix="specpipe-branch")
        self._predictor_state: dict[tuple[str, str], object] = {}  # (drafter, predictor) -> state shared by sessions
        self._adaptive = SharedModels()  # cost lines and acceptance rates that adaptive sessions learn together
        self._gates: dict[str, SpeculationGate] = {}  # drafter kind -> whether its generations draft at all
        self._gates_lock = threading.Lock()
        self._load = Load()
        self.shared_cores = shared_cores
        for kind, drafter in self.drafters.items():
            check_same_vocab(kind, drafter, self.info.vocab_fingerprint)

    def encode(
        self,
        prompt: str | None = None,
        messages: Sequence[tuple[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> tuple[int, ...]:
        """Prompt token ids from exactly one of: raw text, chat messages (chat template; their content
        is text, orchestrator/inputs.py), token ids."""
        check_input(prompt, messages, token_ids, self.limits)
        if token_ids is not None:
            return tuple(token_ids)
        if messages is not None:
            return chat_ids(self.tokenizer, messages)
        return tuple(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def validate(self, request: GenerationRequest) -> None:
        check_generation(request, self.limits)
        check_tenant(request.tenant)
        check_token_ids(request.prompt_ids, self.info.vocab_size, "prompt")
        check_sampling(request.sampling)
        if request.max_new_tokens <= 0:
            raise InvalidArgument(f"max_new_tokens must be > 0, got {request.max_new_tokens}")
        if not 0 <= request.min_new_tokens <= request.max_new_tokens:
            raise InvalidArgument(f"min_new_tokens must be in [0, max_new_tokens], got {request.min_new_tokens}")
        total = len(request.prompt_ids) + request.max_new_tokens
        if total > self.info.max_context:
            raise InvalidArgument(
                f"prompt ({len(request.prompt_ids)} tokens) + max_new_tokens ({request.max_new_tokens}) exceeds "
                f"the context window of {self.info.max_context} tokens"
            )
        spec = request.speculation
        if spec.drafter not in DRAFTER_KINDS:
            raise InvalidArgument(f"unknown drafter {spec.drafter!r}; choose from {', '.join(DRAFTER_KINDS)}")
        if spec.drafter != "none" and spec.drafter not in self.drafters:
            raise FailedPrecondition(
                f"drafter {spec.drafter!r} is not available here; available: {', '.join(['none', *self.drafters])}"
            )
        if spec.draft_len < 0 or spec.width < 1:
            raise InvalidArgument(f"draft_len must be >= 0 and width >= 1, got {spec.draft_len} and {spec.width}")
        if spec.schedule not in SCHEDULES:
            raise InvalidArgument(f"unknown schedule {spec.schedule!r}; choose from {', '.join(SCHEDULES)}")
        if spec.predictor not in PREDICTORS:
            raise InvalidArgument(f"unknown predictor {spec.predictor!r}; choose from {', '.join(PREDICTORS)}")
        if spec.hypotheses < 1 and spec.hypotheses != ALL_HYPOTHESES:
            raise InvalidArgument(f"hypotheses must be >= 1 or {ALL_HYPOTHESES} (all), got {spec.hypotheses}")
        if spec.adaptive not in ADAPTIVE:
            raise InvalidArgument(f"adaptive is one of {', '.join(ADAPTIVE)}, got {spec.adaptive!r}")
        if any(not s for s in request.stop):
            raise InvalidArgument("stop strings must not be empty")

    def generate(self, request: GenerationRequest, traceparent: str = "") -> Iterator[GenerationChunk]:
        """Validate now, then stream chunks; closing the iterator releases the sessions. traceparent: the
        client's W3C trace context (a gRPC call's metadata, an HTTP request's header), the parent of the
        generation's trace where tracing is on."""
        self.validate(request)
        if not request.sampling.greedy and request.sampling.seed == 0:  # no seed given: this request's own
            request = replace(request, sampling=replace(request.sampling, seed=random_seed()))
        # Sessions are per generation: two requests that share a request_id must not share a KV cache.
        session_id = f"{session_prefix(request.tenant)}{request.request_id or 'req'}-{uuid.uuid4().hex[:16]}"
        gen = Generation.open(request, session_id, Detokenizer(self.tokenizer))
        gen.spans = Traced.begin(request, session_id, traceparent)
        return self._rounds(gen)

    def _rounds(self, gen: Generation) -> Iterator[GenerationChunk]:
        spec = gen.request.speculation
        policy, branch = self._policy(spec), self._branch(spec)
        proposer = self._proposer(gen, policy, branch)
        schedule = self._schedule(gen, proposer, branch)

        def draft_len(emitted: int | None = None) -> int:  # draft only what can still be emitted
            return min(policy.draft_len(self._load.active, branch), gen.room(emitted))

        crowded = False  # the last round's forward held more than CROWDED_SESSIONS sessions' steps

        def send(proposal: ProposeResult) -> tuple[ProposeResult, ProposeResult, Round, float]:
            """The round's draft as sent (after the draft policy and the window), as drafted, the round, its start."""
            trimmed = policy.trim(proposal, self._load.active)
            as_drafted, proposal = proposal, self._fit(gen, trimmed, crowded or self._load.active > CROWDED_SESSIONS)
            hypotheses = policy.hypotheses(proposal, self._load.active) if branch else 0  # pre-drafts
            start = laps.lap("control")
            return proposal, as_drafted, schedule.start(gen, proposal, as_drafted, hypotheses, draft_len), start

        spans, error = gen.spans, None  # scopes never span a yield (orchestrator.spans)
        with self._load:
            try:
                laps = Laps()
                spans.begin_round()
                with spans.in_round():
                    proposal, resolution, idle_since = schedule.first(gen, draft_len()), NO_SPECULATION, None
                    laps.lap("wait")
                    laps.move("wait", "prefill", schedule.prefill_ms)  # the first draft waited out the prefill
                    laps.lap("rest")
                    proposal, as_drafted, sent, start = send(proposal)
                while True:
                    with spans.in_round():
                        result = sent()
                        verify_end = laps.lap("call")
                        crowded = result.batch_sessions > CROWDED_SESSIONS
                        self.observer.verified(gen, proposal, result)
                        laps.lap("record")
                        policy.observe(Verified(proposal, as_drafted, result, (verify_end - start) * 1e3,
                                                self._load.active))
                        laps.lap("control")
                        idle_ms = (start - idle_since) * 1e3 if idle_since is not None else 0.0
                        chunk = self._emit(gen, proposal, result, resolution, idle_ms, start, laps)
                    if gen.finish:
                        yield chunk
                        break
                    gen.confirm(result)
                    laps.lap("rest")
                    spans.begin_round()
                    with spans.in_round():
                        proposal, resolution = schedule.next(gen, proposal, result, draft_len, start, verify_end)
                        laps.lap("wait")
                        count_prediction(spec, resolution)
                        if resolution.issued:
                            policy.observe_prediction(resolution.proposal is not None)
                        idle_since = verify_end
                        proposal, as_drafted, sent, start = send(proposal)
                    yield chunk  # the client's write while the verifier checks the next round
                    laps.lap("rest")
                with spans.in_generation():
                    self.observer.finished(gen)
                    log.info("generation finished", extra=finished_fields(gen))
            except Exception as err:
                error = err
                raise
            finally:
                with spans.in_generation():
                    schedule.close()
                    self._release(gen.session_id, proposer.drafter)
                spans.end(gen.finish, len(gen.output), error)

    def _fit(self, gen: Generation, proposal: ProposeResult, crowded: bool) -> ProposeResult:
        """The draft cut to what the generation can still emit (a hybrid's n-gram tail may reach past it),
        to the verifier's context window (the room caps a draft's depth, not a tree's nodes, and a fresh
        draft or a pre-draft may be a tree: docs/security.md, "Context window") and, where many sessions
        share the verifier's forwards (crowded), to its captured step: a longer step costs a forward of
        its own, which every other session's round in the batch waits for (docs/batching.md, "Gather
        policy")."""
        nodes = gen.window_room(self.info.max_context)
        if crowded and self.info.max_step_tokens:
            nodes = min(nodes, self.info.max_step_tokens - 1)  # the step is the last token and the draft
        fitted = fit_nodes(within_depth(proposal.draft, max(0, gen.room())), nodes)
        return proposal if fitted is proposal.draft else replace(proposal, draft=fitted)

    def _emit(self, gen: Generation, proposal: ProposeResult, result: VerifyResult, resolution: Resolution,
              idle_ms: float, start: float, laps: Laps) -> GenerationChunk:
        """The round's chunk for the client: its verified tokens, the new text and what it cost (laps:
        where its time went, taken for this round)."""
        assert gen.detokenizer is not None  # Generation.open gives one
        spans = gen.spans
        with spans.detokenize():  # with the stop strings
            new_tokens, delta = gen.emit(result, gen.detokenizer, self.info.eos_token_ids)
        laps.lap("emit")
        round_ms = (time.perf_counter() - start) * 1e3
        count_round(gen.request.speculation, proposal, result, len(new_tokens), resolution, idle_ms, round_ms,
                    spans.exemplar())
        laps.lap("record")
        parts = {f"{part}_ms": ms for part, ms in laps.take().items()}
        stats = RoundStats(len(proposal.draft), len(result.accepted_tokens), proposal.draft_ms, result.verify_ms,
                           resolution.issued, resolution.hit, resolution.wasted, resolution.hidden_ms, idle_ms, **parts)
        count_parts(gen.request.speculation, stats)
        spans.end_round(stats, result, len(new_tokens))
        return GenerationChunk(gen.request.request_id or gen.session_id, tuple(new_tokens), delta, gen.finish, stats,
                               gen.request.sampling.seed, spans.trace_id)

    def _proposer(self, gen: Generation, policy: DraftPolicy, branch: bool) -> Proposer:
        spec = gen.request.speculation
        template = ProposeRequest(gen.session_id, (), 0, spec.width, gen.request.sampling, tenant=gen.request.tenant,
                                  stop_confidence=STOP_CONFIDENCE if spec.adaptive == "on" else 0.0)
        free = self.drafters.get("ngram") if spec.drafter == "hybrid" and spec.adaptive == "on" else None

        def suffices(proposal: ProposeResult, draft_len: int) -> bool:
            return policy.suffices(proposal, draft_len, self._load.active, branch)

        return Proposer(self.drafters.get(spec.drafter), spec.drafter, template, free,
                        spec.draft_len * FREE_DRAFT_FACTOR, suffices if free is not None else None,
                        lambda: policy.drafting(self._load.active))

    def _branch(self, spec: SpeculationOptions) -> bool:
        """Whether a generation runs the branch schedule: asked for, with a drafter, and under adaptive
        control not where a model's pre-drafts would take the verifier's cores (shared_cores; the free
        n-gram drafter issues none)."""
        if spec.schedule != "branch" or self.drafters.get(spec.drafter) is None:
            return False
        return not (self.shared_cores and spec.adaptive == "on" and spec.drafter not in FREE_DRAFTERS)

    def _schedule(self, gen: Generation, proposer: Proposer, branch: bool) -> Schedule:
        spec = gen.request.speculation
        if not branch:
            return Sequential(self.verifier, proposer, self._pool)
        shared = self._predictor_state.setdefault((spec.drafter, spec.predictor), new_shared(spec.predictor))
        return Branch(self.verifier, proposer, new_predictor(spec.predictor, shared), self._pool,
                      self.info.eos_token_ids)

    def _policy(self, spec: SpeculationOptions) -> DraftPolicy:
        if spec.adaptive == "on" and self.drafters.get(spec.drafter) is not None:
            return AdaptivePolicy(self._adaptive, spec, self._gate(spec.drafter))
        return FixedPolicy(spec)

    def _gate(self, kind: str) -> SpeculationGate:
        with self._gates_lock:
            if kind not in self._gates:
                self._gates[kind] = SpeculationGate(kind)
            return self._gates[kind]

    def _release(self, session_id: str, drafter: Drafter | None) -> None:
        with deadline_scope(None), cancel_scope(None):  # releasing is cleanup: it runs after the client left too
            self.observer.released(session_id)
            for peer in (self.verifier, drafter):
                if peer is None:
                    continue
                try:
                    peer.release(session_id)
                except Exception as err:  # the session expires by TTL / LRU on the peer anyway
                    log.warning("release failed", extra={"session_id": session_id, "error": str(err)})


class Laps:
    """Where a generation's wall time goes, part by part (ROUND_PARTS): lap(part) adds the time since
    the previous lap to part, and the thread's CPU time meanwhile to the orchestrator's hop of that
    name (specpipe.runtime.cpu); take() hands a round's parts over and starts the next round's."""

    def __init__(self):
        self._last = time.perf_counter()
        self._ms = dict.fromkeys(ROUND_PARTS, 0.0)
        cpu.start_laps()

    def lap(self, part: str) -> float:
        now = time.perf_counter()
        self._ms[part] += (now - self._last) * 1e3
        self._last = now
        cpu.lap("orchestrator", part)
        return now

    def move(self, source: str, target: str, ms: float) -> None:
        """Count ms of what source measured as target's (at most all of it)."""
        ms = min(ms, self._ms[source])
        self._ms[source] -= ms
        self._ms[target] += ms

    def take(self) -> dict[str, float]:
        taken, self._ms = self._ms, dict.fromkeys(ROUND_PARTS, 0.0)
        return taken


def finished_fields(gen: Generation) -> dict[str, object]:
    """A finished generation's log line: the request id, its sessions and what it gave (the line carries
    its trace and span ids where the generation is traced: specpipe.runtime.logs)."""
    return {"request_id": gen.request.request_id or gen.session_id, "session_id": gen.session_id,
            "prompt_tokens": len(gen.request.prompt_ids), "output_tokens": len(gen.output),
            "finish_reason": gen.finish, "drafter": gen.request.speculation.drafter}


def check_same_vocab(kind: str, drafter: Drafter, fingerprint: str) -> None:
    """Drafts must use the verifier's vocabulary; an unreachable drafter is checked on first use."""
    try:
        info = drafter.info()
    except SpecpipeError as err:
        log.warning("drafter unreachable at start", extra={"drafter": kind, "error": str(err)})
        return
    if info.vocab_fingerprint != fingerprint:
        raise FailedPrecondition(
            f"drafter {kind!r} ({info.model_name}) does not share the verifier's vocabulary"
        )

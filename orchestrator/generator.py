"""The generation loop: draft -> verify -> emit, written once against the Drafter and Verifier
protocols, so the embedded default and the distributed deployment run the same code.

Only the verifier's tokens are emitted: each round emits the accepted draft tokens and the
correction. A failing drafter costs speed, never correctness: the round goes on without a draft.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Mapping, Sequence

from specpipe import metrics
from specpipe.ngram import SUFFIX_TOKENS, verifier_branches
from specpipe.errors import Aborted, FailedPrecondition, InvalidArgument, SpecpipeError
from specpipe.protocols import Drafter, NgramCache, Verifier
from specpipe.sampling import check_sampling
from specpipe.trees import common_prefix, first_path_nodes, select, tried_children
from specpipe.types import (
    ADAPTIVE, ALL_HYPOTHESES, DRAFTER_KINDS, EMPTY_DRAFT, PREDICTORS, SCHEDULES, GenerationChunk, GenerationRequest,
    ProposeResult, RoundStats, SpeculationOptions,
)
from specpipe.verification import check_token_ids
from orchestrator.adaptive import AdaptiveController, SharedModels
from orchestrator.branch import NO_SPECULATION, BranchScheduler, Resolution, picked
from orchestrator.predictors import Hypothesis, new_predictor, new_shared
from orchestrator.stops import FINISH_STOP, find_stop, first_finish, streamable

log = logging.getLogger("specpipe.orchestrator")


class Generator:
    def __init__(
        self,
        tokenizer,
        verifier: Verifier,
        drafters: Mapping[str, Drafter],
        defaults: SpeculationOptions = SpeculationOptions(),
        cache: NgramCache | None = None,
        learn_global: bool = True,
    ):
        self.tokenizer = tokenizer
        self.verifier = verifier
        self.drafters = dict(drafters)
        self.defaults = defaults
        self.cache = cache  # the n-gram store: the orchestrator forwards every confirmed token to it
        self.learn_global = learn_global  # finished outputs go to the store's global (corpus) table
        self.info = verifier.info()
        self._eos = set(self.info.eos_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=128, thread_name_prefix="specpipe-branch")  # verify + pre-drafts
        self._predictor_state: dict[tuple[str, str], object] = {}  # (drafter, predictor) -> state shared by sessions
        self._adaptive = SharedModels()  # cost lines and acceptance rates that adaptive sessions learn together
        self._active = 0                 # generations running now: they share the verifier (adaptive load)
        self._active_lock = threading.Lock()
        for kind, drafter in self.drafters.items():
            check_same_vocab(kind, drafter, self.info.vocab_fingerprint)

    def encode(
        self,
        prompt: str | None = None,
        messages: Sequence[tuple[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> tuple[int, ...]:
        """Prompt token ids from exactly one of: raw text, chat messages (chat template), token ids."""
        if sum(x is not None for x in (prompt, messages, token_ids)) != 1:
            raise InvalidArgument("give exactly one of prompt, messages or token_ids")
        if token_ids is not None:
            return tuple(token_ids)
        if messages is not None:
            if not messages or not any(content for _, content in messages):
                raise InvalidArgument("messages are empty")
            if getattr(self.tokenizer, "chat_template", None):
                chat = [{"role": role, "content": content} for role, content in messages]
                ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
                return tuple(ids["input_ids"] if isinstance(ids, Mapping) else ids)
            prompt = "\n".join(content for _, content in messages)  # a base model: plain text
        if not prompt:
            raise InvalidArgument("prompt is empty")
        return tuple(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def validate(self, request: GenerationRequest) -> None:
        check_token_ids(request.prompt_ids, self.info.vocab_size, "prompt")
        check_sampling(request.sampling)
        if request.max_new_tokens <= 0:
            raise InvalidArgument(f"max_new_tokens must be > 0, got {request.max_new_tokens}")
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

    def generate(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """Validate now, then stream chunks; closing the iterator releases the sessions."""
        self.validate(request)
        # Sessions are per generation: two requests that share a request_id must not share a KV cache.
        session_id = f"{request.request_id or 'req'}-{uuid.uuid4().hex[:16]}"
        return self._rounds(request, session_id)

    def _rounds(self, request: GenerationRequest, session_id: str) -> Iterator[GenerationChunk]:
        spec = request.speculation
        drafter = self.drafters.get(spec.drafter)
        context = list(request.prompt_ids)
        self._cache_call("update", session_id, context, 0)
        output: list[int] = []
        sent_text = ""
        finish = ""
        branch = self._branch_scheduler(spec, drafter, session_id, request.sampling)
        adaptive = self._controller(spec) if drafter is not None else None
        epoch = 0  # bumped on every rollback: rejected draft tokens (sequential), dropped pre-drafts (branch)

        def next_draft_len(emitted: int) -> int:  # draft only what can still be emitted; the correction takes one
            k = adaptive.draft_len(self._active, branch is not None) if adaptive else spec.draft_len
            return min(k, request.max_new_tokens - emitted - 1)

        def hypothesis_draft_len(h: Hypothesis) -> int:  # 0: the generation would end with that outcome
            ends = bool(self._eos.intersection(h.accepted)) or h.correction in self._eos
            return 0 if ends else next_draft_len(len(output) + len(h.accepted) + 1)

        def hypotheses(in_flight: ProposeResult) -> int:  # pre-drafts that fit in the in-flight round's verify
            if adaptive is None:
                return spec.hypotheses
            return adaptive.hypotheses(len(first_path_nodes(in_flight.draft)), self._active)

        with self._active_lock:
            self._active += 1
        try:
            if branch is None:
                self.verifier.prefill(session_id, request.prompt_ids)
                proposal = self._propose(drafter, spec, session_id, context, next_draft_len(0), request, epoch)
            else:  # the first draft (and the drafter's own prefill) runs while the verifier prefills
                prefilling = self._pool.submit(self.verifier.prefill, session_id, request.prompt_ids)
                proposal = self._propose(drafter, spec, session_id, context, next_draft_len(0), request, epoch)
                prefilling.result()
            resolution, idle_since = NO_SPECULATION, None
            while True:
                round_start = time.perf_counter()
                idle_ms = (round_start - idle_since) * 1e3 if idle_since is not None else 0.0
                as_drafted = proposal
                if adaptive:
                    proposal = self._trim(adaptive, spec, as_drafted)
                if branch is None:
                    result = self.verifier.verify(session_id, len(context), proposal.draft, request.sampling)
                    epoch += len(result.accepted_tokens) < len(as_drafted.draft)
                else:
                    verifying = self._pool.submit(self.verifier.verify, session_id, len(context), proposal.draft,
                                                  request.sampling)
                    branch.speculate(context, proposal, hypotheses(proposal), hypothesis_draft_len)
                    result = verifying.result()
                verify_end = idle_since = time.perf_counter()
                self._record(session_id, context, proposal, result)
                if adaptive:
                    self._observe(adaptive, spec, proposal, result, (verify_end - round_start) * 1e3,
                                  len(first_path_nodes(as_drafted.draft)))

                count, finish = first_finish(result.emitted, len(output), request.max_new_tokens, self.info.eos_token_ids)
                new_tokens = list(result.emitted[:count])
                text, new_tokens, stopped = self._decode(output, new_tokens, request.stop, len(sent_text))
                finish = FINISH_STOP if stopped else finish
                output.extend(new_tokens)
                delta = text[len(sent_text):] if finish else streamable(text, request.stop)[len(sent_text):]
                sent_text += delta
                count_round(spec, proposal, result, len(new_tokens), resolution.hidden_ms, idle_ms)
                metrics.ROUND_MS.labels(drafter=spec.drafter).observe((time.perf_counter() - round_start) * 1e3)
                yield GenerationChunk(
                    request_id=request.request_id or session_id,
                    token_ids=tuple(new_tokens),
                    text=delta,
                    finish_reason=finish,
                    round=RoundStats(len(proposal.draft), len(result.accepted_tokens), proposal.draft_ms,
                                     result.verify_ms, resolution.issued, resolution.hit, resolution.wasted,
                                     resolution.hidden_ms, idle_ms),
                )
                if finish:
                    break
                context.extend(result.emitted)
                if branch is not None:  # this round's pre-drafts: one may be the next draft
                    resolution = branch.resolve(proposal, result, round_start, verify_end)
                    count_prediction(spec, resolution)
                    epoch = branch.epoch
                    if adaptive and resolution.issued:
                        adaptive.observe_prediction(resolution.proposal is not None)
                proposal = resolution.proposal or self._propose(
                    drafter, spec, session_id, context, next_draft_len(len(output)), request, epoch)
            if self.learn_global and output:
                self._cache_call("update_global", output)
            metrics.GENERATIONS.labels(finish_reason=finish).inc()
        finally:
            with self._active_lock:
                self._active -= 1
            if branch is not None:
                branch.close()
            self._release(session_id, drafter)

    def _branch_scheduler(self, spec: SpeculationOptions, drafter, session_id: str, sampling) -> BranchScheduler | None:
        if spec.schedule != "branch" or drafter is None:
            return None
        shared = self._predictor_state.setdefault((spec.drafter, spec.predictor), new_shared(spec.predictor))
        return BranchScheduler(self._pool, drafter, new_predictor(spec.predictor, shared), session_id, spec.width,
                               sampling, on_error=lambda err: note_draft_error(spec.drafter, session_id, err))

    def _trim(self, adaptive: AdaptiveController, spec: SpeculationOptions, proposal: ProposeResult) -> ProposeResult:
        """The draft without the nodes whose expected acceptance does not pay for verifying them."""
        nodes = adaptive.keep(proposal.draft.parents, node_sources(proposal), proposal.draft_ms, self._active)
        if len(nodes) == len(proposal.draft):
            return proposal
        metrics.TRIMMED_DRAFT_TOKENS.labels(drafter=spec.drafter).inc(len(proposal.draft) - len(nodes))
        return picked(proposal, select(proposal.draft, nodes), nodes)

    def _observe(self, adaptive: AdaptiveController, spec: SpeculationOptions, proposal: ProposeResult,
                 result, call_ms: float, drafted: int) -> None:
        """drafted: the main chain's length as drafted (proposal's draft may be trimmed)."""
        chain, sources = first_path_nodes(proposal.draft), node_sources(proposal)
        alternatives = [(depth, rank, hit) for _, depth, rank, hit in
                        tried_children(proposal.draft.parents, result.accepted_nodes) if rank]
        adaptive.observe(len(chain), common_prefix(chain, result.accepted_nodes), result.verify_ms, proposal.draft_ms,
                         result.entropy, call_ms, sources=[sources[n] for n in chain],
                         draft_tokens=drafted, nodes=len(proposal.draft), alternatives=alternatives)
        metrics.ADAPTIVE_DRAFT_LEN.labels(drafter=spec.drafter).observe(len(chain))
        fit = self._adaptive.verify.line()
        if fit is not None:
            metrics.VERIFY_COST_MS.labels(term="fixed").set(fit[0])
            metrics.VERIFY_COST_MS.labels(term="per_token").set(fit[1])

    def _controller(self, spec: SpeculationOptions) -> AdaptiveController | None:
        if spec.adaptive != "on":
            return None
        m_max = spec.draft_len + 1 if spec.hypotheses == ALL_HYPOTHESES else spec.hypotheses
        return AdaptiveController(self._adaptive, spec.drafter, spec.draft_len, m_max)

    def _propose(self, drafter, spec, session_id, context, draft_len, request, epoch) -> ProposeResult:
        if drafter is None or draft_len <= 0:
            return ProposeResult(EMPTY_DRAFT, 0.0)
        try:
            return drafter.propose(session_id, context, draft_len, spec.width, request.sampling, epoch)
        except Exception as err:  # a failing drafter slows generation down, never breaks it
            note_draft_error(spec.drafter, session_id, err)
            return ProposeResult(EMPTY_DRAFT, 0.0)

    def _decode(self, output: list[int], new_tokens: list[int], stop: Sequence[str], sent: int) -> tuple[str, list[int], bool]:
        """Full output text after the new tokens; with a stop string, cut text and tokens at it."""
        text = self.tokenizer.decode(output + new_tokens, skip_special_tokens=True)
        if not stop or find_stop(text, stop, sent) < 0:
            return text, new_tokens, False
        for n in range(1, len(new_tokens) + 1):  # the first token that completes a stop string
            text = self.tokenizer.decode(output + new_tokens[:n], skip_special_tokens=True)
            at = find_stop(text, stop, sent)
            if at >= 0:
                return text[:at], new_tokens[:n], True
        raise AssertionError("unreachable: the stop string was in the full text")

    def _record(self, session_id: str, context: list[int], proposal: ProposeResult, result) -> None:
        """Forward a round to the n-gram store: the confirmed tokens to the session's context table,
        the verifier's argmax after each rejected draft node to its verifier table."""
        start = max(0, len(context) - SUFFIX_TOKENS)  # the prefixes of the new tokens
        self._cache_call("update", session_id, [*context[start:], *result.emitted], len(context) - start)
        if len(proposal.draft):
            branches = verifier_branches(context[start:], proposal.draft, result.accepted_nodes, result.node_argmax)
            if branches:
                self._cache_call("record_branches", session_id, branches)

    def _cache_call(self, call: str, *args) -> None:
        """A store that is down or slow costs drafts, never the generation."""
        if self.cache is None:
            return
        try:
            getattr(self.cache, call)(*args)
        except Exception as err:
            metrics.CACHE_FAILURES.labels(call=call).inc()
            log.warning("n-gram store call failed", extra={"call": call, "error": str(err)})

    def _release(self, session_id: str, drafter: Drafter | None) -> None:
        self._cache_call("release", session_id)
        for peer in (self.verifier, drafter):
            if peer is None:
                continue
            try:
                peer.release(session_id)
            except Exception as err:  # the session expires by TTL / LRU on the peer anyway
                log.warning("release failed", extra={"session_id": session_id, "error": str(err)})


def note_draft_error(drafter: str, session_id: str, err: Exception) -> None:
    if isinstance(err, Aborted):  # a dropped hypothesis, stopped by the drafter on purpose
        return
    metrics.DRAFT_FAILURES.labels(drafter=drafter).inc()
    log.warning("drafter failed, verifying without that draft", extra={"session_id": session_id, "error": str(err)})


def count_round(spec: SpeculationOptions, proposal: ProposeResult, result, emitted: int, hidden_ms: float,
                idle_ms: float) -> None:
    labels = {"drafter": spec.drafter}
    count_sources(spec.drafter, proposal, result.accepted_nodes)
    metrics.ROUNDS.labels(**labels).inc()
    metrics.DRAFTED_TOKENS.labels(**labels).inc(len(proposal.draft))
    metrics.ACCEPTED_TOKENS.labels(**labels).inc(len(result.accepted_tokens))
    metrics.EMITTED_TOKENS.labels(**labels).inc(emitted)
    metrics.DRAFT_TIME_MS.labels(**labels).inc(proposal.draft_ms)
    metrics.HIDDEN_DRAFT_MS.labels(**labels).inc(hidden_ms)
    metrics.VERIFIER_IDLE_MS.labels(drafter=spec.drafter, schedule=spec.schedule).inc(idle_ms)


def count_prediction(spec: SpeculationOptions, resolution: Resolution) -> None:
    if not resolution.issued:
        return
    labels = {"drafter": spec.drafter, "predictor": spec.predictor}
    metrics.HYPOTHESES.labels(**labels).inc(resolution.issued)
    (metrics.PREDICTION_HITS if resolution.hit else metrics.PREDICTION_MISSES).labels(**labels).inc()
    metrics.WASTED_DRAFT_TOKENS.labels(drafter=spec.drafter).inc(resolution.wasted)


def node_sources(proposal: ProposeResult) -> tuple[str, ...]:
    """The source of each draft node (DRAFT_SOURCES)."""
    return proposal.sources or ("model",) * len(proposal.draft)


def count_sources(drafter: str, proposal: ProposeResult, accepted_nodes: Sequence[int]) -> None:
    sources = node_sources(proposal)
    for source in sources:
        metrics.SOURCE_DRAFTED.labels(drafter=drafter, source=source).inc()
    for node in accepted_nodes:
        metrics.SOURCE_ACCEPTED.labels(drafter=drafter, source=sources[node]).inc()


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

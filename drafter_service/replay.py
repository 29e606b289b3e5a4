"""A model drafter that answers from a replay transcript (docs/pipeline.md, "Replay"): the small model's
drafts at another device's speed, with the real model's agreement with the verifier.

Behind a replayed verifier every context a session drafts after is a recorded prompt and a prefix of
its greedy continuation, and the transcript's drafter table holds the small model's two likeliest
tokens and their probabilities at each position of that continuation (teacher-forced: what it would
draft there). A greedy chain from the context's end takes the likeliest token at each position: up to
and including its first token off the continuation it is the live drafter's chain. What the live
drafter drafts after that token no table holds; the table's tokens at the next positions stand in
(never accepted, as the live ones would not be), so a chain is as long as the live one: draft_len
tokens, or up to a token below the request's stop_confidence (after the first token off the
continuation, the table's confidences there stand in for the live drafter's). Each node carries its
confidence and runner-up, and a tree of width 2 adds the runner-up at the first BRANCH_LEVELS levels,
as the live drafter's.

Its forwards run through the drafter's scheduler, batched with every session's and held to the
curve: the context since the session's last draft (in chunks), then a token per depth, as the live
drafter feeds them. Greedy requests of width <= DRAFT_TOP on the recorded prompts only
(FAILED_PRECONDITION otherwise).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Generator, Sequence

from drafter_service.drafting import BRANCH_LEVELS, check_proposal
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.transcript import DRAFT_TOP, Entry, Transcript, replayed
from specpipe.core.trees import common_prefix, first_path_nodes
from specpipe.core.types import ROOT, Draft, ModelInfo, ProposeRequest, ProposeResult
from specpipe.engine.costmodel import ClockedForward, ForwardCurve
from specpipe.engine.scheduler import Scheduler, Step, Work
from specpipe.runtime import metrics


class TokenCache:
    """A replayed session's cache: the tokens a KV cache would hold."""

    def __init__(self, entry: Entry, tokens: list[int] | None = None):
        self.entry = entry
        self.tokens: list[int] = tokens if tokens is not None else []

    @property
    def length(self) -> int:
        return len(self.tokens)


def fed_forward(segments: Sequence) -> list[None]:
    """A batched forward's contract, computing nothing: each session's cache takes its tokens (the
    drafts come from the table)."""
    for segment in segments:
        segment.kv.tokens.extend(segment.token_ids)
    return [None] * len(segments)


def table_draft(entry: Entry, emitted: int, draft_len: int, width: int, stop_confidence: float) -> Draft:
    """The greedy draft of up to draft_len levels after the prompt and the continuation's first emitted
    tokens, from the drafter's table (the module docstring)."""
    top, p = entry.draft_top, entry.draft_p
    tokens: list[int] = []
    parents: list[int] = []
    confidence: list[float] = []
    runner_up: list[int] = []
    runner_up_confidence: list[float] = []

    def add(token: int, parent: int, prob: float, other: int, other_prob: float) -> int:
        tokens.append(token)
        parents.append(parent)
        confidence.append(prob)
        runner_up.append(other)
        runner_up_confidence.append(other_prob)
        return len(tokens) - 1

    parent = ROOT
    for depth, position in enumerate(range(emitted, min(emitted + draft_len, len(top)))):
        (first, second), (p_first, p_second) = top[position][:2], p[position][:2]
        chain_parent, parent = parent, add(first, parent, p_first, second, p_second)
        if width > 1 and depth < BRANCH_LEVELS:
            add(second, chain_parent, p_second, -1, 0.0)
        if p_first < stop_confidence:
            break
    return Draft(tuple(tokens), tuple(parents), confidence=tuple(confidence), runner_up=tuple(runner_up),
                 runner_up_confidence=tuple(runner_up_confidence))


def feeds(context: Sequence[int], cached: int, chain: Sequence[int], chunk: int) -> Generator[Step, object, None]:
    """The steps a live drafter feeds for a draft whose main chain is chain: the context past its cache,
    in chunks, then each chain token but the last."""
    for start in range(cached, len(context), chunk):
        yield Step(tuple(context[start:start + chunk]), logit_rows=1)
    for token in chain[:-1]:
        yield Step((token,), logit_rows=1)


class TranscriptDrafter:
    """specpipe.core.protocols.Drafter answering from a transcript's drafter table, batched by the
    drafter's scheduler, each forward held to curve where one is given."""

    def __init__(self, transcript: Transcript, curve: ForwardCurve | None = None, max_sessions: int = 256,
                 batch: BatchConfig | None = None):
        if transcript.drafter is None or not all(e.draft_top for e in transcript.entries):
            raise InvalidArgument("this replay transcript holds no drafter table: record it again with "
                                  "`specpipe transcript record` (a preset with a small model) to replay the drafter")
        self.transcript = transcript
        forward = fed_forward if curve is None else ClockedForward(fed_forward, curve)
        # the scheduler steers prompt chunks by an attention weight: the verifier's stands in for the drafter's
        self._scheduler = Scheduler(None, batch or BatchConfig(max_queue=256), "drafter", forward,
                                    attention=transcript.attention, group=curve.group if curve is not None else None)
        self._info = replayed(transcript.drafter)
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, TokenCache] = OrderedDict()  # LRU
        self._lock = threading.Lock()

    def info(self) -> ModelInfo:
        return self._info

    def propose(self, request: ProposeRequest) -> ProposeResult:
        check_proposal(request, self._info.vocab_size)
        if not request.sampling.greedy:
            raise FailedPrecondition("the replayed drafter drafts greedy requests only (its table holds the model's "
                                     "likeliest tokens); send temperature 0")
        if request.width > DRAFT_TOP:
            raise FailedPrecondition(f"the replayed drafter drafts trees of width <= {DRAFT_TOP} (its table holds "
                                     f"the model's {DRAFT_TOP} likeliest tokens), got {request.width}")
        start = time.perf_counter()
        context = request.context
        cache = self._checkout(request.session_id, context)
        entry = cache.entry
        draft = table_draft(entry, len(context) - len(entry.prompt_ids), request.draft_len, request.width,
                            request.stop_confidence)
        chain = [draft.tokens[n] for n in first_path_nodes(draft)]
        steps = feeds(context, cache.length, chain, self._scheduler.config.prefill_chunk)
        self._scheduler.run(Work(cache, steps))  # type: ignore[arg-type]  # a replayed slot: the tokens it would hold
        with self._lock:
            self._sessions.pop(request.session_id, None)
            self._sessions[request.session_id] = cache  # what the next proposal starts from, most recently used last
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        draft_ms = (time.perf_counter() - start) * 1e3
        if request.draft_len:
            metrics.DRAFT_MS.labels(drafter="model").observe(draft_ms)
        return ProposeResult(draft, draft_ms)

    def _checkout(self, session_id: str, context: Sequence[int]) -> TokenCache:
        """A cache for this proposal: the session's last one's tokens up to their common prefix with
        context (all but its last token), so that proposals of one session in flight together (the
        branch schedule's pre-drafts) each feed their own."""
        with self._lock:
            last = self._sessions.get(session_id)
        if last is None:
            return TokenCache(self.transcript.entry_of_context(context))
        cached = min(common_prefix(last.tokens, context), len(context) - 1)
        return TokenCache(last.entry, last.tokens[:cached])

    def release(self, session_id: str) -> bool:
        with self._lock:
            return self._sessions.pop(session_id, None) is not None

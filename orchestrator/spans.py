"""A generation's trace (docs/observability.md): the generation span, a span per round, and in each
round the hops (draft, verify, detokenize; the store's calls, off the round's path). The spans of the
hops themselves come from the traced protocols (specpipe.runtime.traced) and the services; here are
the generation's and the rounds', and the scopes that make a round the parent of what runs in it.

UNTRACED stands in for the trace of every generation that is not traced (tracing off, or not
sampled): its methods do nothing and make nothing, so the generation loop reads the same either way.
A scope is never held across a yield: the loop's code between two yields runs in one."""

from __future__ import annotations

import contextlib
from typing import Any

from specpipe.core.types import GenerationRequest, RoundStats, VerifyResult
from specpipe.runtime import tracing


class Untraced:
    """The trace of a generation that is not traced."""

    trace_id = ""
    round: Any = None  # the round in progress (a span), None between rounds

    def in_generation(self) -> contextlib.AbstractContextManager[Any]:
        return tracing.NULL

    def in_round(self) -> contextlib.AbstractContextManager[Any]:
        return tracing.NULL

    def begin_round(self) -> None:
        pass

    def detokenize(self) -> contextlib.AbstractContextManager[Any]:
        """The round's detokenizing (and stop strings) as a span."""
        return tracing.NULL

    def end_round(self, stats: RoundStats, result: VerifyResult, emitted: int) -> None:
        pass

    def exemplar(self) -> dict[str, str] | None:
        return None

    def end(self, finish: str, output_tokens: int, error: BaseException | None = None) -> None:
        pass


UNTRACED = Untraced()


class Traced(Untraced):
    def __init__(self, generation: Any):
        self.generation = generation
        self.trace_id = tracing.trace_id(generation)
        self.rounds = 0

    @staticmethod
    def begin(request: GenerationRequest, session_id: str, traceparent: str = "") -> Untraced:
        """The trace of a new generation where tracing is on and it is sampled, else UNTRACED. Its parent:
        the client's traceparent, else the calling context (a trace begins here, at --trace-ratio)."""
        if not tracing.ACTIVE:
            return UNTRACED
        span = tracing.start("generation", tracing.remote(traceparent), {
            "specpipe.request_id": request.request_id or session_id, "specpipe.session_id": session_id,
            "specpipe.prompt_tokens": len(request.prompt_ids), "specpipe.max_new_tokens": request.max_new_tokens,
            "specpipe.drafter": request.speculation.drafter, "specpipe.schedule": request.speculation.schedule},
            kind="server")
        if not span.is_recording():  # not sampled: nothing more is made for it
            return UNTRACED
        return Traced(span)

    def in_generation(self) -> contextlib.AbstractContextManager[Any]:
        return tracing.scope(self.generation)

    def in_round(self) -> contextlib.AbstractContextManager[Any]:
        return tracing.scope(self.round if self.round is not None else self.generation)

    def detokenize(self) -> contextlib.AbstractContextManager[Any]:
        return tracing.child_of(self.round, "detokenize")

    def begin_round(self) -> None:
        self.rounds += 1
        self.round = tracing.start("round", self.generation, {"specpipe.round": self.rounds})

    def end_round(self, stats: RoundStats, result: VerifyResult, emitted: int) -> None:
        if self.round is None:
            return
        self.round.set_attributes({
            "specpipe.drafted": stats.drafted, "specpipe.accepted": stats.accepted, "specpipe.emitted": emitted,
            "specpipe.hypotheses": stats.hypotheses, "specpipe.hit": stats.hit, "specpipe.wasted": stats.wasted,
            "specpipe.draft_ms": stats.draft_ms, "specpipe.verify_ms": stats.verify_ms,
            "specpipe.batch.sessions": result.batch_sessions, "specpipe.batch.tokens": result.batch_tokens})
        self.round.end()
        self.round = None

    def exemplar(self) -> dict[str, str] | None:
        return {"trace_id": self.trace_id}

    def end(self, finish: str, output_tokens: int, error: BaseException | None = None) -> None:
        if self.round is not None:
            self.round.end()
            self.round = None
        self.generation.set_attributes({"specpipe.finish_reason": finish, "specpipe.output_tokens": output_tokens,
                                        "specpipe.rounds": self.rounds})
        if error is not None:
            self.generation.record_exception(error)
            self.generation.set_status(tracing.error_status(error))
        self.generation.end()

"""The one request path of the public APIs, the gRPC Generation service (orchestrator/servicer.py)
and the OpenAI-compatible HTTP API (orchestrator/openai_api.py): validate -> admission -> deadline ->
encode -> generate -> observe. The front ends only translate their request into a GenerateInput and a
GenerationRequest, and the chunks into their answer (docs/http-api.md lists where they differ).

- validate (accept): the input's rules (orchestrator/inputs.py) and the generator's rules
  (Generator.validate: caps, sampling ranges, speculation, tenant), before any work; a refusal names
  its field (SpecpipeError.field).
- admission (admit, admit_async): a slot, or RESOURCE_EXHAUSTED (orchestrator/admission.py).
- deadline, encode, generate, observe (run): every internal call ends by the request's deadline and
  is cancelled with it; the time to first token counts the wait for a slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from orchestrator.admission import Admission, Ticket
from orchestrator.generator import Generator
from orchestrator.inputs import check_input
from specpipe.core.errors import SpecpipeError
from specpipe.core.types import GenerationChunk, GenerationRequest, SpeculationOptions
from specpipe.runtime import metrics
from specpipe.runtime.lifecycle import Cancellation, cancel_scope, deadline_scope
from specpipe.serving.convert import GenerateInput

# A request every generator accepts: the start of check_request's walk (token 0 is in every vocabulary).
PASSING = GenerationRequest((0,), 1, speculation=SpeculationOptions(drafter="none"))


@dataclass(frozen=True)
class Call:
    """A request accepted by the rules, on its way through the path."""

    source: GenerateInput
    request: GenerationRequest             # prompt_ids: the token ids given, else filled in by encoding
    arrived: float                         # time.perf_counter() at arrival
    deadline: float | None = None          # time.monotonic() by which everything ends; None: none
    cancellation: Cancellation | None = None  # set when the client goes away
    fit_window: bool = False               # max_new_tokens was not given: at most the room the prompt leaves
    traceparent: str = ""                  # the client's W3C trace context (metadata, header): the trace's parent

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def encoded(self, prompt_ids: tuple[int, ...], max_context: int) -> GenerationRequest:
        request = replace(self.request, prompt_ids=tuple(prompt_ids))
        if not self.fit_window:
            return request
        room = max(1, max_context - len(prompt_ids))
        return replace(request, max_new_tokens=min(request.max_new_tokens, room),
                       min_new_tokens=min(request.min_new_tokens, room))


class RequestPath:
    def __init__(self, generator: Generator, admission: Admission | None = None):
        self.generator = generator
        self.admission = admission or Admission()

    @property
    def longest_answer(self) -> int:
        """max_new_tokens of a request that gives none and fits the window (fit_window)."""
        return max(1, min(self.generator.limits.max_new_tokens, self.generator.info.max_context - 1))

    def accept(self, source: GenerateInput, request: GenerationRequest, time_left_s: float | None = None,
               cancellation: Cancellation | None = None, fit_window: bool = False, traceparent: str = "") -> Call:
        """The request if the rules take it (before any work), else the refusal naming its field.
        traceparent: the client's (gRPC metadata, the HTTP header), the parent of its generation's trace."""
        arrived = time.perf_counter()
        check_input(source.prompt, source.messages, source.token_ids, self.generator.limits)
        given = source.token_ids  # checked with the request; text is checked as the placeholder PASSING has
        request = replace(request, prompt_ids=PASSING.prompt_ids if given is None else tuple(given))
        check_request(self.generator.validate, request)
        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        return Call(source, request, arrived, deadline, cancellation, fit_window, traceparent)

    def admit(self, call: Call) -> Ticket:
        """A slot, waiting on this thread (a gRPC stream) no longer than the deadline."""
        return self.admission.admit(call.time_left(), call.cancellation)

    async def admit_async(self, call: Call) -> Ticket:
        """A slot, waiting on the event loop (an HTTP request) no longer than the deadline."""
        return await self.admission.admit_async(call.time_left())

    def run(self, call: Call, ticket: Ticket,
            encoded: Callable[[GenerationRequest], object] = lambda request: None) -> Iterator[GenerationChunk]:
        """Encode and generate within the deadline, holding ticket's slot; the chunks, observed. Closing
        the iterator ends the generation after its current round and releases its sessions.
        encoded: told the request once its prompt is encoded, before any chunk."""
        with ticket, deadline_scope(call.time_left()), cancel_scope(call.cancellation):
            prompt_ids = self.generator.encode(**call.source.encode_kwargs())
            request = call.encoded(prompt_ids, self.generator.info.max_context)
            check_request(self.generator.validate, request)  # the prompt's length, now that it is known
            encoded(request)
            chunks = self.generator.generate(request, call.traceparent)
            try:
                yield from observe_latency(chunks, call.arrived)
            finally:
                chunks.close()  # type: ignore[attr-defined]  # Generator.generate is a generator, annotated Iterator


def check_request(validate: Callable[[GenerationRequest], None], request: GenerationRequest) -> None:
    """request against the rules (validate: Generator.validate); a refusal names its field
    (SpecpipeError.field: the rule's own, else field_at_fault's)."""
    try:
        validate(request)
    except SpecpipeError as err:
        err.field = err.field or field_at_fault(validate, request, str(err))
        raise


def field_at_fault(validate: Callable[[GenerationRequest], None], request: GenerationRequest,
                   message: str) -> str | None:
    """The field (its dotted name: "sampling.top_k") whose value makes request fail with message:
    starting from a request that passes, each field of request in turn takes its value; the one that
    brings the message is at fault (one that brings another is left at its passing value)."""
    checked = PASSING
    for path in FIELD_PATHS:
        candidate = _with(checked, path, _get(request, path))
        try:
            validate(candidate)
        except SpecpipeError as failure:
            if str(failure) == message:
                return ".".join(path)
            continue
        checked = candidate
    return None


def _field_paths() -> tuple[tuple[str, ...], ...]:
    """Every field of a GenerationRequest, those of its nested options one by one: ("prompt_ids",),
    ..., ("sampling", "temperature"), ..."""
    paths: list[tuple[str, ...]] = []
    for field in fields(GenerationRequest):
        value = getattr(PASSING, field.name)
        paths += [(field.name, sub.name) for sub in fields(value)] if is_dataclass(value) else [(field.name,)]
    return tuple(paths)


FIELD_PATHS = _field_paths()


def _get(value: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        value = getattr(value, name)
    return value


def _with(value: Any, path: tuple[str, ...], new: Any) -> Any:
    if len(path) == 1:
        return replace(value, **{path[0]: new})
    return replace(value, **{path[0]: _with(getattr(value, path[0]), path[1:], new)})


def observe_latency(chunks: Iterator[GenerationChunk], start: float) -> Iterator[GenerationChunk]:
    """The chunks, with the time to first token and the inter-token latency observed (both APIs), a
    traced generation's with its trace as their exemplar."""
    last = start
    for i, chunk in enumerate(chunks):
        now = time.perf_counter()
        exemplar = {"trace_id": chunk.trace_id} if chunk.trace_id else None
        if i == 0:
            metrics.TTFT_MS.observe((now - last) * 1e3, exemplar)
        else:  # a chunk of n tokens: n gaps of the round's time / n each
            for _ in chunk.token_ids:
                metrics.INTER_TOKEN_MS.observe((now - last) * 1e3 / len(chunk.token_ids), exemplar)
        last = now
        yield chunk

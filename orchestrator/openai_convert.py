"""Pure translations between the OpenAI-compatible API's models (orchestrator/openai_protocol.py) and
the request path's values: a request becomes a GenerateInput and a GenerationRequest (as a gRPC
request does in specpipe/serving/convert.py), chunks become answers, and a refusal's field becomes the
request's own name for it (the OpenAI error's `param`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from orchestrator.openai_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Delta,
    FinishReason,
    Sampling,
    Usage,
)
from specpipe.core.errors import InvalidArgument
from specpipe.core.types import (
    ALL_HYPOTHESES,
    GenerationRequest,
    SamplingParams,
    SpeculationOptions,
)
from specpipe.serving.convert import GenerateInput

FINISH: dict[str, FinishReason] = {"eos": "stop", "stop": "stop", "length": "length"}  # specpipe's -> the API's
DEFAULT_COMPLETION_TOKENS = 16  # the API's default for /v1/completions
TOP_K_OFF = -1  # vLLM's "off", besides 0


@dataclass(frozen=True)
class Translated:
    source: GenerateInput
    request: GenerationRequest
    fit_window: bool = False  # no length given: the room the prompt leaves (chat)


def completion_request(body: CompletionRequest, defaults: SpeculationOptions, tenant: str,
                       request_id: str) -> Translated:
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        source = GenerateInput(prompt=prompt)
    elif all(isinstance(t, int) for t in prompt):
        source = GenerateInput(token_ids=tuple(t for t in prompt if isinstance(t, int)))
    else:
        raise InvalidArgument("a batch of prompts is not supported: send one prompt per request", field="prompt")
    max_new = DEFAULT_COMPLETION_TOKENS if body.max_tokens is None else body.max_tokens
    return Translated(source, generation(body, max_new, defaults, tenant, request_id))


def chat_request(body: ChatCompletionRequest, defaults: SpeculationOptions, tenant: str, request_id: str,
                 longest_answer: int) -> Translated:
    """longest_answer: max_new_tokens when the request gives no length (then cut to the window's room)."""
    messages = tuple((m.role, m.content if isinstance(m.content, str) else "".join(p.text for p in m.content))
                     for m in body.messages)
    given = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_new = longest_answer if given is None else given
    return Translated(GenerateInput(messages=messages), generation(body, max_new, defaults, tenant, request_id),
                      fit_window=given is None)


def generation(body: Sampling, max_new: int, defaults: SpeculationOptions, tenant: str,
               request_id: str) -> GenerationRequest:
    """ignore_eos asks for max_tokens whatever the model ends with."""
    if body.stream_options is not None and not body.stream:
        raise InvalidArgument("stream_options is only allowed with stream: true", field="stream_options")
    top_k = 0 if body.top_k in (None, TOP_K_OFF) else body.top_k
    sampling = SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                              top_p=1.0 if body.top_p is None else body.top_p, top_k=top_k, seed=body.seed or 0)
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    min_new = max_new if body.ignore_eos else body.min_tokens or 0
    return GenerationRequest((), max_new, request_id, tuple(s for s in stop if s), sampling,
                             speculation(body, defaults), tenant, min_new)


def speculation(body: Sampling, defaults: SpeculationOptions) -> SpeculationOptions:
    given = {f.name: getattr(body, f.name) for f in fields(SpeculationOptions) if getattr(body, f.name) is not None}
    if given.get("hypotheses") == "all":
        given["hypotheses"] = ALL_HYPOTHESES
    return replace(defaults, **given)


def param_of(field: str | None, body: Sampling) -> str | None:
    """The request's name of a GenerationRequest field (SpecpipeError.field)."""
    if field is None or field == "request_id":
        return None
    chat = isinstance(body, ChatCompletionRequest)
    if field in ("prompt_ids", "prompt", "token_ids"):
        return "messages" if chat else "prompt"
    if field == "max_new_tokens":
        return "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
    if field == "min_new_tokens":
        return "min_tokens" if body.min_tokens is not None or not body.ignore_eos else "ignore_eos"
    if field == "tenant":
        return "user"
    return field.split(".", 1)[-1] if field.startswith(("sampling.", "speculation.")) else field


# --- answers ------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens)


@dataclass(frozen=True)
class Answer:
    """What every answer of one request carries."""

    id: str
    created: int  # the request's arrival, in seconds since the epoch
    model: str
    chat: bool

    def head(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.model}


def whole(answer: Answer, text: str, finish: FinishReason | None,
          counts: tuple[int, int]) -> ChatCompletionResponse | CompletionResponse:
    if answer.chat:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)
        return ChatCompletionResponse(**answer.head(), usage=usage(*counts), choices=[choice])
    return CompletionResponse(**answer.head(), usage=usage(*counts),
                              choices=[CompletionChoice(text=text, finish_reason=finish)])


def event(answer: Answer, text: str | None, finish: FinishReason | None, first: bool = False,
          counts: tuple[int, int] | None = None) -> ChatCompletionChunk | CompletionResponse:
    """One streamed event; text None: the last event's (its finish reason only); counts: the usage
    so far (continuous usage stats), else none (left out of the JSON)."""
    so_far = usage(*counts) if counts is not None else None
    if answer.chat:
        delta = Delta(role="assistant" if first else None, content=text)
        return ChatCompletionChunk(**answer.head(), usage=so_far,
                                   choices=[ChatChunkChoice(delta=delta, finish_reason=finish)])
    return CompletionResponse(**answer.head(), usage=so_far,
                              choices=[CompletionChoice(text=text or "", finish_reason=finish)])


def usage_event(answer: Answer, counts: tuple[int, int]) -> ChatCompletionChunk | CompletionResponse:
    """The last event with include_usage: the usage, no choices."""
    cls = ChatCompletionChunk if answer.chat else CompletionResponse
    return cls(**answer.head(), choices=[], usage=usage(*counts))

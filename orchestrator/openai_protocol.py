"""The OpenAI-compatible API's requests and responses as typed models (pydantic, after vLLM's
entrypoints/openai/protocol.py): the schema at /openapi.json, the validation errors and the answers
come from these definitions. docs/http-api.md says what each field does.

What the API has and specpipe does not do (n > 1, logprobs, tools, penalties, ...) is typed as its
neutral value only (`n: 1`, `presence_penalty: 0`, `tools: []`), so a client that sends the neutral
value works and any other value is refused naming the field, never ignored. A request with a field
the API does not have is refused too; the speculation options are extra fields of the gRPC request's
names (SpeculationOptions)."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from orchestrator.inputs import CHAT_ROLES
from specpipe.core.types import SpeculationOptions


class Neutral:
    """Marks a field of a feature specpipe does not have: only its neutral value is taken."""


NEUTRAL = Neutral()
Role = Literal[CHAT_ROLES]  # type: ignore[valid-type]
Zero = Annotated[float, Field(ge=0, le=0)]  # a penalty at its neutral value
Empty = Annotated[list[Any], Field(max_length=0)]


class Strict(BaseModel):
    """Types as sent: no "5" for 5, no true for 1.0; a field the API does not have is an error."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = Field(None, description="a last event with usage and no choices")
    continuous_usage_stats: bool | None = Field(None, description="vLLM's: usage so far in every event")


def _speculation_model() -> type[Strict]:
    """specpipe's speculation options, the gRPC request's SpeculationOptions field for field (absent: the
    server's defaults); hypotheses also takes "all"."""
    hints = get_type_hints(SpeculationOptions)
    options: dict[str, Any] = {f.name: (hints[f.name] | None, None) for f in fields(SpeculationOptions)}
    options["hypotheses"] = (int | Literal["all"] | None, None)
    return create_model("Speculation", __base__=Strict, **options)


Speculation = _speculation_model()


class Sampling(Speculation):  # type: ignore[misc, valid-type]
    """The fields both endpoints share."""

    model: str = Field(description="the id GET /v1/models lists")
    max_tokens: int | None = Field(None, description="the answer's length at most")
    temperature: float | None = Field(None, description="1 when absent; 0 is greedy (the verifier's own output)")
    top_p: float | None = Field(None, description="nucleus mass in (0, 1]")
    top_k: int | None = Field(None, description="-1 or 0: off")
    seed: int | None = Field(None, description="fixes a sampled answer; 0 or absent: a fresh one")
    stop: str | list[str] | None = Field(None, description="a string or a list of strings: the answer ends before it")
    stream: bool | None = Field(None, description="server-sent events, data: [DONE] last")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="the tenant, unless the x-specpipe-tenant header names one")
    cache_salt: str | None = Field(None, min_length=1, description="vLLM's: requests with the same tenant and salt "
                                   "learn and draft only among themselves")
    ignore_eos: bool | None = Field(None, description="generate max_tokens whatever the model ends with")
    min_tokens: int | None = Field(None, description="an end of text before this many tokens does not end the answer")
    # neutral values only: what clients and benchmarks send by default
    n: Annotated[Literal[1] | None, NEUTRAL] = None
    best_of: Annotated[Literal[1] | None, NEUTRAL] = None
    presence_penalty: Annotated[Zero | None, NEUTRAL] = None
    frequency_penalty: Annotated[Zero | None, NEUTRAL] = None
    logit_bias: Annotated[Annotated[dict[str, float], Field(max_length=0)] | None, NEUTRAL] = None
    repetition_penalty: Annotated[Literal[1] | None, NEUTRAL] = None
    min_p: Annotated[Zero | None, NEUTRAL] = None
    use_beam_search: Annotated[Literal[False] | None, NEUTRAL] = None
    length_penalty: Annotated[Literal[1] | None, NEUTRAL] = None
    skip_special_tokens: Annotated[Literal[True] | None, NEUTRAL] = None
    include_stop_str_in_output: Annotated[Literal[False] | None, NEUTRAL] = None
    spaces_between_special_tokens: Annotated[Literal[True] | None, NEUTRAL] = None
    stop_token_ids: Annotated[Empty | None, NEUTRAL] = None
    prompt_logprobs: Annotated[Literal[0] | None, NEUTRAL] = None


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="a string (no chat template) or a list of token ids; a batch of one is taken")
    logprobs: Annotated[Literal[0, False] | None, NEUTRAL] = None
    echo: Annotated[Literal[False] | None, NEUTRAL] = None
    suffix: Annotated[Literal[""] | None, NEUTRAL] = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """Keys clients echo back from earlier answers (refusal, audio, ...) are ignored; tool calls are refused."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Role = Field(description="developer is system")
    content: str | list[TextPart] = Field(description="a string or text parts: text, never control tokens")
    name: str | None = Field(None, description="accepted; the chat template has no place for it")
    tool_calls: Annotated[Empty | None, NEUTRAL] = None
    function_call: Annotated[None, NEUTRAL] = None


class ResponseFormat(Strict):
    type: Literal["text"]


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, description="as max_tokens; absent (both): the room left in "
                                              "the context")
    logprobs: Annotated[Literal[False] | None, NEUTRAL] = None
    top_logprobs: Annotated[Literal[0] | None, NEUTRAL] = None
    tools: Annotated[Empty | None, NEUTRAL] = None
    tool_choice: Annotated[Literal["none"] | None, NEUTRAL] = None
    functions: Annotated[Empty | None, NEUTRAL] = None
    function_call: Annotated[Literal["none"] | None, NEUTRAL] = None
    response_format: Annotated[ResponseFormat | None, NEUTRAL] = None
    parallel_tool_calls: bool | None = None


# --- responses ----------------------------------------------------------------------------------

FinishReason = Literal["stop", "length"]


def absent_when_none(description: str | None = None) -> Any:
    """A field left out of the JSON while it is None (a delta's role and content, a stream event's usage)."""
    return Field(None, exclude_if=lambda value: value is None, description=description)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(BaseModel):
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReason | None


class Answer(BaseModel):
    """What an answer and each of its events carry."""

    id: str
    created: int  # the request's arrival, in seconds since the epoch
    model: str


class CompletionChoice(Choice):
    text: str


class CompletionResponse(Answer):  # also each event of a streamed completion
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = absent_when_none("in a stream: with continuous_usage_stats, or the last event's")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(Choice):
    message: AssistantMessage


class ChatCompletionResponse(Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = absent_when_none("the first event's")
    content: str | None = absent_when_none()


class ChatChunkChoice(Choice):
    delta: Delta


class ChatCompletionChunk(Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = absent_when_none("with continuous_usage_stats, or the last event's")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specpipe"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "draining"]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo

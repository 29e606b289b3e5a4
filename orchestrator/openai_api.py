"""The OpenAI-compatible HTTP API of the orchestrator (docs/http-api.md): /v1/completions,
/v1/chat/completions (server-sent events when streaming), /v1/models and /health, beside the gRPC
Generation API and as thin as its servicer: a request becomes the same GenerationRequest, its
chunks the same tokens and text.

What the API has and specpipe does not do (n > 1, logprobs, tools, penalties, ...) is refused with a
400 in the OpenAI error shape naming the field, never ignored. The speculation options are extra body
fields of the gRPC request's names (drafter, draft_len, width, schedule, predictor, hypotheses,
adaptive). A client that goes away mid-stream ends its generation after the current round, which
releases the verifier's and the drafter's sessions (as on gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchestrator.admission import Admission
from orchestrator.generator import Generator
from orchestrator.servicer import observe_latency
from specpipe.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    SpecpipeError,
    Unauthenticated,
    Unavailable,
)
from specpipe.core.tenancy import TENANT_METADATA, check_tenant, salted_tenant
from specpipe.core.types import ALL_HYPOTHESES, GenerationChunk, GenerationRequest, SamplingParams, SpeculationOptions

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # specpipe's finish reasons -> the API's
SPECULATION_FIELDS = ("drafter", "draft_len", "width", "schedule", "predictor", "hypotheses", "adaptive")
# vLLM's sampling extensions that serving benchmarks send at their neutral values (refused otherwise)
VLLM_FIELDS = {"repetition_penalty", "min_p", "use_beam_search", "length_penalty", "skip_special_tokens",
               "include_stop_str_in_output", "spaces_between_special_tokens", "stop_token_ids", "prompt_logprobs"}
COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "stream_options",
                 "user", "n", "best_of", "logprobs", "ignore_eos", "min_tokens", "cache_salt", *SPECULATION_FIELDS,
                 *VLLM_FIELDS}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "suffix", "presence_penalty", "frequency_penalty", "logit_bias"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "presence_penalty",
                               "frequency_penalty", "logit_bias", "tools", "tool_choice", "functions",
                               "function_call", "response_format", "parallel_tool_calls"}
# field -> the values accepted where specpipe does not implement the feature (None: absent)
NEUTRAL = {"n": (None, 1), "best_of": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0),
           "echo": (None, False), "suffix": (None, ""), "presence_penalty": (None, 0, 0.0),
           "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "tools": (None, []),
           "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
           "response_format": (None, {"type": "text"}), "parallel_tool_calls": (None, False, True),
           "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0), "use_beam_search": (None, False),
           "length_penalty": (None, 1, 1.0), "skip_special_tokens": (None, True),
           "include_stop_str_in_output": (None, False), "spaces_between_special_tokens": (None, True),
           "stop_token_ids": (None, []), "prompt_logprobs": (None, 0)}
RETRY_AFTER_S = 1
DEFAULT_COMPLETION_TOKENS = 16  # the API's default for /v1/completions


class ApiError(Exception):
    """An error response: HTTP status, the OpenAI error type, the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def from_specpipe(err: SpecpipeError) -> ApiError:
    """specpipe's errors as the statuses an OpenAI client expects."""
    if isinstance(err, InvalidArgument):
        return ApiError(400, str(err), param_of(str(err)))
    if isinstance(err, FailedPrecondition):
        return ApiError(400, str(err), param_of(str(err)))
    if isinstance(err, ResourceExhausted):
        return ApiError(429, str(err), kind="rate_limit_exceeded", headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(err, Unauthenticated):
        return ApiError(401, str(err), kind="authentication_error")
    if isinstance(err, Unavailable):
        return ApiError(503, str(err), kind="service_unavailable")
    if isinstance(err, DeadlineExceeded):
        return ApiError(504, str(err), kind="timeout")
    return ApiError(500, str(err), kind="internal_error")


def param_of(message: str) -> str | None:
    """The request field an error message of specpipe's validation is about."""
    for needle, param in (("max_new_tokens", "max_tokens"), ("min_new_tokens", "min_tokens"), ("stop", "stop"),
                          ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                          ("prompt", "prompt"), ("messages", "messages"), ("tenant", "user"),
                          *((name, name) for name in SPECULATION_FIELDS)):
        if needle in message:
            return param
    return None


# --- requests -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ApiRequest:
    """A parsed request: what to encode, the generation, and how to answer."""

    chat: bool
    encode: dict                 # Generator.encode keywords
    generation: GenerationRequest  # prompt_ids filled in after encoding
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): usage in every event


def _type(body: Mapping, name: str, kinds, what: str):
    value = body.get(name)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in _as_tuple(kinds)):
        raise ApiError(400, f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def _as_tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _check_fields(body: Mapping, allowed: set[str]) -> None:
    for name in body:
        if name not in allowed:
            raise ApiError(400, f"unknown field {name!r}", name)
    for name, accepted in NEUTRAL.items():
        if name in body and body[name] not in accepted:
            raise ApiError(400, f"{name}={json.dumps(body[name])[:80]} is not supported by specpipe", name)


def _stop(body: Mapping) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise ApiError(400, "stop must be a string or a list of strings", "stop")


def _sampling(body: Mapping) -> SamplingParams:
    temperature = _type(body, "temperature", (int, float), "a number")
    top_p = _type(body, "top_p", (int, float), "a number")
    top_k = _type(body, "top_k", int, "an integer")
    seed = _type(body, "seed", int, "an integer")
    if temperature is not None and not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature must be in [0, 2], got {temperature}", "temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}", "top_p")
    return SamplingParams(temperature=1.0 if temperature is None else float(temperature),
                          top_p=1.0 if top_p is None else float(top_p),
                          top_k=0 if top_k is None or top_k < 0 else top_k,  # -1: off, as vLLM
                          seed=seed or 0)


def _speculation(body: Mapping, defaults: SpeculationOptions) -> SpeculationOptions:
    values = {}
    for name in SPECULATION_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if name == "hypotheses" and value == "all":
            value = ALL_HYPOTHESES
        kind = int if name in ("draft_len", "width", "hypotheses") else str
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ApiError(400, f"{name} must be {'an integer' if kind is int else 'a string'}", name)
        values[name] = value
    return replace(defaults, **values)


def _lengths(body: Mapping, max_tokens: int | None, default: int) -> tuple[int, int]:
    """(max_new_tokens, min_new_tokens): ignore_eos asks for max_tokens whatever the model ends with."""
    max_new = default if max_tokens is None else max_tokens
    if max_new < 1:
        raise ApiError(400, f"max_tokens must be >= 1, got {max_new}", "max_tokens")
    min_new = _type(body, "min_tokens", int, "an integer") or 0
    if min_new < 0 or min_new > max_new:
        raise ApiError(400, f"min_tokens must be in [0, max_tokens], got {min_new}", "min_tokens")
    if _type(body, "ignore_eos", bool, "true or false"):
        min_new = max_new
    return max_new, min_new


def _stream_options(body: Mapping, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats)."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError(400, "stream_options takes include_usage and continuous_usage_stats", "stream_options")
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def _common(body: Mapping, model_id: str) -> tuple[bool, tuple[bool, bool]]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required (GET /v1/models lists it)", "model")
    if model != model_id:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {model_id!r}", "model",
                       code="model_not_found")
    stream = _type(body, "stream", bool, "true or false") or False
    return stream, _stream_options(body, stream)


def parse_completion(body: Mapping, model_id: str, defaults: SpeculationOptions, tenant: str) -> ApiRequest:
    _check_fields(body, COMPLETION_FIELDS)
    stream, usage_options = _common(body, model_id)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        encode = {"prompt": prompt}
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        encode = {"token_ids": tuple(prompt)}
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "a batch of prompts is not supported: send one prompt per request", "prompt")
    else:
        raise ApiError(400, "prompt must be a string or a list of token ids", "prompt")
    max_tokens = _type(body, "max_tokens", int, "an integer")
    max_new, min_new = _lengths(body, max_tokens, DEFAULT_COMPLETION_TOKENS)
    generation = GenerationRequest((), max_new, request_id=f"cmpl-{uuid.uuid4().hex[:24]}", stop=_stop(body),
                                   sampling=_sampling(body), speculation=_speculation(body, defaults),
                                   tenant=tenant, min_new_tokens=min_new)
    return ApiRequest(False, encode, generation, stream, *usage_options)


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts", "messages")


def parse_chat(body: Mapping, model_id: str, defaults: SpeculationOptions, tenant: str,
               max_new_tokens: int) -> ApiRequest:
    """max_new_tokens: the answer's length when the request gives none (the server's cap)."""
    _check_fields(body, CHAT_FIELDS)
    stream, usage_options = _common(body, model_id)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a role", "messages")
        if message["role"] not in ("system", "user", "assistant", "developer"):
            raise ApiError(400, f"messages[{i}].role {message['role']!r} is not supported (system, user, assistant)",
                           "messages")
        chat.append(("system" if message["role"] == "developer" else message["role"],
                     _message_text(message.get("content"), i)))
    max_tokens = _type(body, "max_completion_tokens", int, "an integer")
    if max_tokens is None:
        max_tokens = _type(body, "max_tokens", int, "an integer")
    max_new, min_new = _lengths(body, max_tokens, max_new_tokens)
    generation = GenerationRequest((), max_new, request_id=f"chatcmpl-{uuid.uuid4().hex[:24]}", stop=_stop(body),
                                   sampling=_sampling(body), speculation=_speculation(body, defaults),
                                   tenant=tenant, min_new_tokens=min_new)
    return ApiRequest(True, {"messages": tuple(chat)}, generation, stream, *usage_options)


def tenant_of(headers: Mapping[str, str], body: Mapping) -> str:
    """The tenant (docs/security.md): the x-specpipe-tenant header, as on gRPC, else the body's user;
    with vLLM's cache_salt, a tenant of its own within it (salted_tenant)."""
    tenant = headers.get(TENANT_METADATA)
    if tenant is None:
        tenant = body.get("user") or ""
        if not isinstance(tenant, str):
            raise ApiError(400, "user must be a string", "user")
    try:
        check_tenant(tenant)
    except InvalidArgument as err:
        raise ApiError(400, str(err), "user") from None
    salt = body.get("cache_salt")
    if salt is None:
        return tenant
    if not isinstance(salt, str) or not salt:
        raise ApiError(400, "cache_salt must be a non-empty string", "cache_salt")
    return salted_tenant(tenant, salt)


# --- responses ----------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(request: ApiRequest, model_id: str, created: int, text: str, finish: str | None,
             counts: tuple[int, int]) -> dict:
    """The whole (non-streamed) answer."""
    if request.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": request.generation.request_id, "object": "chat.completion" if request.chat else "text_completion",
            "created": created, "model": model_id, "choices": [choice], "usage": usage(*counts)}


def chunk(request: ApiRequest, model_id: str, created: int, text: str | None, finish: str | None,
          first: bool = False, counts: tuple[int, int] | None = None) -> dict:
    """One streamed event; text None: the last event's (only its finish reason); counts: the usage so
    far, with continuous usage stats."""
    if request.chat:
        delta = {} if text is None else {"content": text}
        if first:
            delta = {"role": "assistant", **delta}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    event = {"id": request.generation.request_id,
             "object": "chat.completion.chunk" if request.chat else "text_completion",
             "created": created, "model": model_id, "choices": [choice]}
    if request.continuous_usage and counts is not None:
        event["usage"] = usage(*counts)
    return event


def usage_chunk(request: ApiRequest, model_id: str, created: int, counts: tuple[int, int]) -> dict:
    return {"id": request.generation.request_id,
            "object": "chat.completion.chunk" if request.chat else "text_completion",
            "created": created, "model": model_id, "choices": [], "usage": usage(*counts)}


def sse(event: dict | str) -> bytes:
    return f"data: {event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)}\n\n".encode()


# --- the generation, on a thread of its own -----------------------------------------------------

class Pump:
    """Runs a generation's rounds on a thread of its own and hands the chunks to the event loop; stop()
    ends it after the current round and closes it there, which releases its sessions."""

    _END = object()

    def __init__(self, chunks: Iterator[GenerationChunk], release: Callable[[], None]):
        self._chunks, self._release = chunks, release
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="specpipe-http-generate", daemon=True).start()

    def _run(self) -> None:
        error = None
        try:
            for piece in self._chunks:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, piece)
                if self._stop.is_set():
                    break
        except BaseException as err:  # re-raised on the event loop
            error = err
        finally:
            with contextlib.suppress(Exception):
                self._chunks.close()
            self._release()
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (self._END, error))

    def stop(self) -> None:
        self._stop.set()

    async def __aiter__(self):
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, tuple) and item and item[0] is self._END:
                    if item[1] is not None:
                        raise item[1]
                    return
                yield item
        finally:
            self._stop.set()  # the client went away, or the response ended: no round after this one


# --- the application ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ApiConfig:
    model_id: str                      # what /v1/models lists and requests must name
    max_context: int                   # the verifier's context window
    auth_token: str | None = None      # a bearer token the requests must carry
    max_request_bytes: int = 8 << 20   # a larger body: 413


class OpenAIApi:
    """The endpoints over one generator and admission. route() answers any Starlette request (what
    FastAPI's catch-all route hands it here, and what Ray Serve's HTTP proxy hands the Ray
    orchestrator deployment)."""

    def __init__(self, generator: Generator, admission: Admission, config: ApiConfig,
                 draining: Callable[[], bool] = lambda: False):
        self.generator, self.admission, self.config, self.draining = generator, admission, config, draining
        self.created = int(time.time())

    async def route(self, request: Request) -> Response:
        try:
            if request.url.path == "/health" and request.method == "GET":
                return self.health()
            self.authorize(request)
            if request.url.path == "/v1/models" and request.method == "GET":
                return JSONResponse(self.models())
            if request.url.path in ("/v1/completions", "/v1/chat/completions") and request.method == "POST":
                return await self.generate(request, chat=request.url.path == "/v1/chat/completions")
            raise ApiError(404, f"no {request.method} {request.url.path} here (/v1/completions, /v1/chat/completions, "
                           "/v1/models, /health)", kind="not_found")
        except ApiError as err:
            return self.error(err)
        except SpecpipeError as err:
            return self.error(from_specpipe(err))

    @staticmethod
    def error(err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    def health(self) -> JSONResponse:
        return JSONResponse({"status": "draining"} if self.draining() else {"status": "ok"},
                            status_code=503 if self.draining() else 200)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.config.model_id, "object": "model", "created": self.created,
                                            "owned_by": "specpipe", "max_model_len": self.config.max_context}]}

    def authorize(self, request: Request) -> None:
        if self.config.auth_token is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.config.auth_token.encode()
        ):
            raise ApiError(401, "a valid bearer token is required (Authorization: Bearer <token>)",
                           kind="authentication_error", code="invalid_api_key")

    async def body_of(self, request: Request) -> dict:
        raw = await request.body()
        if len(raw) > self.config.max_request_bytes:
            raise ApiError(413, f"the request body has {len(raw)} bytes (max {self.config.max_request_bytes})")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    async def generate(self, request: Request, chat: bool) -> Response:
        generator, config = self.generator, self.config
        if self.draining():
            raise ApiError(
                503, "this replica is draining (shutting down); retry on another", kind="service_unavailable"
            )
        body = await self.body_of(request)
        tenant = tenant_of(request.headers, body)
        parsed = (parse_chat(body, config.model_id, generator.defaults, tenant, generator.limits.max_new_tokens)
                  if chat else parse_completion(body, config.model_id, generator.defaults, tenant))
        prompt_ids = await asyncio.to_thread(generator.encode, **parsed.encode)
        generation = replace(parsed.generation, prompt_ids=tuple(prompt_ids))
        if chat and "max_completion_tokens" not in body and "max_tokens" not in body:  # the room that is left
            room = config.max_context - len(prompt_ids)
            generation = replace(generation, max_new_tokens=max(1, min(generation.max_new_tokens, room)),
                                 min_new_tokens=min(generation.min_new_tokens, max(1, room)))
        start = time.perf_counter()
        slot = contextlib.ExitStack()
        await asyncio.to_thread(slot.enter_context, self.admission.slot())  # 429 when full, before any work
        try:
            chunks = generator.generate(generation)  # validates now
        except BaseException:
            slot.close()
            raise
        pump = Pump(observe_latency(chunks, start), slot.close)
        if parsed.stream:
            return StreamingResponse(self.stream_events(parsed, generation, pump), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        text, tokens, finish = [], 0, None
        async for piece in pump:
            text.append(piece.text)
            tokens += len(piece.token_ids)
            finish = FINISH.get(piece.finish_reason, finish)
        return JSONResponse(response(parsed, config.model_id, self.created, "".join(text), finish,
                                     (len(generation.prompt_ids), tokens)))

    async def stream_events(self, parsed: ApiRequest, generation: GenerationRequest, pump: Pump):
        model, created = self.config.model_id, self.created
        tokens, first, prompt = 0, True, len(generation.prompt_ids)
        try:
            async for piece in pump:
                tokens += len(piece.token_ids)
                finish = FINISH.get(piece.finish_reason)
                if piece.text or first or (parsed.continuous_usage and piece.token_ids):
                    yield sse(chunk(parsed, model, created, piece.text, None, first, (prompt, tokens)))
                    first = False
                if finish is not None:
                    yield sse(chunk(parsed, model, created, None, finish, counts=(prompt, tokens)))
        except SpecpipeError as err:  # after the headers went out: the error as the stream's last event
            yield sse(from_specpipe(err).body())
        if parsed.include_usage:
            yield sse(usage_chunk(parsed, model, created, (prompt, tokens)))
        yield sse("[DONE]")


def create_app(generator: Generator, admission: Admission, config: ApiConfig,
               draining: Callable[[], bool] = lambda: False) -> FastAPI:
    """The FastAPI application (served by uvicorn: specpipe.serving.http): every path to OpenAIApi.route."""
    api = OpenAIApi(generator, admission, config, draining)
    app = FastAPI(title="specpipe", docs_url=None, redoc_url=None, openapi_url=None)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def route(request: Request):
        return await api.route(request)

    return app

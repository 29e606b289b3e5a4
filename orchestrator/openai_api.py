"""The OpenAI-compatible HTTP API of the orchestrator (docs/http-api.md): FastAPI routes for
/v1/completions, /v1/chat/completions (server-sent events when streaming), /v1/models and /health,
the generated schema at /openapi.json, every error in the OpenAI shape. A request goes through the
one request path the gRPC servicer uses (orchestrator/request_path.py); this module only translates
(orchestrator/openai_convert.py) and streams.

The wait for a slot is on the event loop, so a queued request holds no thread and counts in the
queue gRPC streams wait in. A client that goes away (queued, streaming or not) ends its generation
after the current round and cancels its internal calls; that is one log line."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import reprlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from orchestrator import openai_convert as convert
from orchestrator.admission import RETRY_AFTER_S
from orchestrator.openai_protocol import (
    NEUTRAL,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    Sampling,
)
from orchestrator.request_path import RequestPath
from specpipe.config.limits import DEFAULT_HTTP, DEFAULT_LIMITS
from specpipe.core.errors import SpecpipeError
from specpipe.core.tenancy import TENANT_METADATA, salted_tenant, tenant_from_metadata
from specpipe.core.types import GenerationChunk, GenerationRequest
from specpipe.runtime.lifecycle import Cancellation
from specpipe.runtime.tracing import TRACEPARENT
from specpipe.serving.streams import ThreadStream

log = logging.getLogger("specpipe.http")

STATUS = {  # a SpecpipeError's code -> (HTTP status, the OpenAI error type)
    "INVALID_ARGUMENT": (400, "invalid_request_error"), "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_exceeded"), "UNAUTHENTICATED": (401, "authentication_error"),
    "UNAVAILABLE": (503, "service_unavailable"), "DEADLINE_EXCEEDED": (504, "timeout"),
}
# the statuses every generation route may answer; "default" as well, so FastAPI documents no 422 (errors are 400s)
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in ("400", "401", "404", "408", "413", "429", "503", "504", "default")}


class ApiError(HTTPException):
    """An answer in the OpenAI error shape: the status, the error type, the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(status, message, dict(headers or {}))
        self.message, self.param, self.kind, self.code = message, param, kind, code

    def response(self) -> JSONResponse:
        body = ErrorResponse(error=ErrorInfo(message=self.message, type=self.kind, param=self.param, code=self.code))
        return JSONResponse(body.model_dump(), self.status_code, self.headers)


def from_specpipe(err: SpecpipeError, body: Sampling | None = None) -> ApiError:
    """specpipe's errors as the statuses an OpenAI client expects, param the request's name of the field."""
    status, kind = STATUS.get(err.code, (500, "internal_error"))
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
    param = convert.param_of(err.field, body) if body is not None else err.field
    return ApiError(status, str(err), param, kind, headers=headers)


class ClientGone(Exception):
    """The client disconnected while its request was waiting or generating."""


@dataclass(frozen=True)
class ApiConfig:
    model_id: str                                                # what /v1/models lists and requests must name
    auth_token: str | None = None                                # a bearer token the requests must carry
    max_request_bytes: int = DEFAULT_LIMITS.max_request_bytes    # a larger body: 413, unread
    request_timeout_s: float = DEFAULT_HTTP.request_timeout_s    # a request's deadline; 0: none


class OpenAIApi:
    """The endpoints over one request path (a generator and its admission)."""

    def __init__(self, path: RequestPath, config: ApiConfig, draining: Callable[[], bool] = lambda: False):
        self.path, self.config, self.draining = path, config, draining
        self.started = int(time.time())

    def health(self) -> JSONResponse:
        draining = self.draining()
        return JSONResponse(Health(status="draining" if draining else "ok").model_dump(), 503 if draining else 200)

    def models(self) -> ModelList:
        info = self.path.generator.info
        card = ModelCard(id=self.config.model_id, created=self.started, max_model_len=info.max_context)
        return ModelList(data=[card])

    def authorize(self, request: Request) -> None:
        if self.config.auth_token is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        expected = self.config.auth_token.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise ApiError(401, "a valid bearer token is required (Authorization: Bearer <token>)",
                           kind="authentication_error", code="invalid_api_key")

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        def translate(tenant: str, request_id: str) -> convert.Translated:
            return convert.completion_request(body, self.path.generator.defaults, tenant, request_id)

        return await self.generate(request, body, translate, "cmpl")

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        def translate(tenant: str, request_id: str) -> convert.Translated:
            return convert.chat_request(body, self.path.generator.defaults, tenant, request_id,
                                        self.path.longest_answer)

        return await self.generate(request, body, translate, "chatcmpl")

    async def generate(self, request: Request, body: Sampling, translate: Callable[[str, str], convert.Translated],
                       kind: str) -> Response:
        """validate -> admission (on the event loop) -> the path's run on a thread of its own -> the answer.
        translate(tenant, request_id): the request as the path's (openai_convert)."""
        answer = convert.Answer(f"{kind}-{uuid.uuid4().hex[:24]}", int(time.time()), self.config.model_id,
                                kind == "chatcmpl")
        if self.draining():
            raise ApiError(503, "this replica is draining (shutting down); retry on another",
                           kind="service_unavailable")
        check_model(body, self.config.model_id)
        cancellation = Cancellation()  # set when the client goes away
        try:
            translated = translate(tenant_of(request.headers, body), answer.id)
            call = self.path.accept(translated.source, translated.request, self.config.request_timeout_s or None,
                                    cancellation, translated.fit_window, request.headers.get(TRACEPARENT, ""))
            ticket = await until_gone(request, self.path.admit_async(call))
        except SpecpipeError as err:
            raise from_specpipe(err, body) from None
        except ClientGone:
            return gone(answer, "queued")
        encoded: list[GenerationRequest] = []  # the request once its prompt is encoded (for usage)
        stream = ThreadStream(self.path.run(call, ticket, encoded.append), ticket.release,
                              name="specpipe-http-generate")
        return await self.respond(request, body, answer, stream, cancellation, encoded)

    async def respond(self, request: Request, body: Sampling, answer: convert.Answer, stream: ThreadStream,
                      cancellation: Cancellation, encoded: list[GenerationRequest]) -> Response:
        """The answer: the first chunk is awaited before the status goes out, so a refusal found while
        encoding (or a peer that fails the prefill) gets its own status, streamed or not."""
        chunks = aiter(stream)
        try:
            first = await until_gone(request, anext(chunks))
            if body.stream:
                events = self.events(answer, body, prepend(first, chunks), encoded, cancellation)
                return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            whole = await until_gone(request, collect(answer, prepend(first, chunks), encoded))
            return JSONResponse(whole.model_dump())
        except SpecpipeError as err:
            raise from_specpipe(err, body) from None
        except ClientGone:
            cancellation.cancel()
            stream.stop()
            return gone(answer, "generating")

    async def events(self, answer: convert.Answer, body: Sampling, chunks: AsyncIterator,
                     encoded: list[GenerationRequest], cancellation: Cancellation) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed answer; an error after the headers is its last event."""
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        tokens, opening = 0, True
        try:
            async for piece in chunks:
                tokens += len(piece.token_ids)
                counts = (len(encoded[0].prompt_ids), tokens) if continuous else None
                if piece.text or opening or (continuous and piece.token_ids):
                    yield sse(convert.event(answer, piece.text, None, opening, counts))
                    opening = False
                if piece.finish_reason in convert.FINISH:
                    yield sse(convert.event(answer, None, convert.FINISH[piece.finish_reason], counts=counts))
        except SpecpipeError as err:
            yield sse(bytes(from_specpipe(err, body).response().body).decode())
        except (asyncio.CancelledError, GeneratorExit):  # the client went away: stop the internal calls too
            cancellation.cancel()
            log_gone(answer, "streaming")
            raise
        if include_usage:
            yield sse(convert.usage_event(answer, (len(encoded[0].prompt_ids), tokens)))
        yield sse("[DONE]")


async def prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


async def collect(answer: convert.Answer, chunks: AsyncIterator[GenerationChunk],
                  encoded: list[GenerationRequest]) -> ChatCompletionResponse | CompletionResponse:
    """The whole answer of a non-streamed request."""
    text, tokens, finish = [], 0, None
    async for piece in chunks:
        text.append(piece.text)
        tokens += len(piece.token_ids)
        finish = convert.FINISH.get(piece.finish_reason, finish)
    return convert.whole(answer, "".join(text), finish, (len(encoded[0].prompt_ids), tokens))


def sse(event: BaseModel | str) -> bytes:
    data = event if isinstance(event, str) else event.model_dump_json()
    return f"data: {data}\n\n".encode()


def check_model(body: Sampling, model_id: str) -> None:
    if body.model != model_id:
        raise ApiError(404, f"the model {body.model[:80]!r} does not exist; this server serves {model_id!r}", "model",
                       code="model_not_found")


def tenant_of(headers: Headers, body: Sampling) -> str:
    """The tenant (docs/security.md): the x-specpipe-tenant header (at most one, as on gRPC), else the
    body's user; with vLLM's cache_salt, a tenant of its own within it (salted_tenant)."""
    given = [(key, value) for key, value in headers.items() if key == TENANT_METADATA]
    try:
        tenant = tenant_from_metadata(given) if given else tenant_from_metadata([(TENANT_METADATA, body.user or "")])
    except SpecpipeError as err:
        raise ApiError(400, str(err), TENANT_METADATA if given else "user") from None
    return tenant if body.cache_salt is None else salted_tenant(tenant, body.cache_salt)


async def until_gone(request: Request, work: Awaitable[Any]) -> Any:
    """work's result, or ClientGone (work cancelled) if the client disconnects first."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (the body read, what else comes is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def log_gone(answer: convert.Answer, phase: str) -> None:
    """An expected disconnect: one structured line, no traceback."""
    log.info("client went away", extra={"request_id": answer.id, "phase": phase})


def gone(answer: convert.Answer, phase: str) -> Response:
    log_gone(answer, phase)
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it


# --- the application ----------------------------------------------------------------------------

class JsonBody(Request):
    """A body read as JSON whatever its Content-Type says (curl -d says a form), by pydantic's strict
    parser: no lone surrogates, no NaN, at most 200 levels of nesting (a 400, never a RecursionError)."""

    def __init__(self, scope: Any, receive: Any):
        super().__init__(scope, receive)
        raw = [(key, value) for key, value in scope["headers"] if key != b"content-type"]
        self._headers = Headers(raw=[*raw, (b"content-type", b"application/json")])

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = pydantic_core.from_json(await self.body(), allow_inf_nan=False)
            except ValueError as err:
                raise ApiError(400, f"the request body is not valid JSON: {err}") from None
        return self._json


class BodyCap:
    """ASGI middleware: a body over max_bytes is refused with a 413 in the OpenAI shape, at once when its
    Content-Length says so (before any byte is read), else as soon as the bytes read pass it; the
    connection closes, so the rest is never read. (Starlette's RequestBodyLimitMiddleware answers
    such a request in plain text, whatever the application's error handler says.)"""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self.too_large().response()(scope, receive, send)
        seen = 0

        async def capped_receive() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if seen > self.max_bytes:
                raise self.too_large()  # while the application reads the body: its error handler answers
            return message

        await self.app(scope, capped_receive, send)

    def too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.max_bytes} bytes (--limit-request-bytes)",
                        headers={"Connection": "close"})


class JsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonBody(request.scope, request.receive))

        return route


def create_app(path: RequestPath, config: ApiConfig, draining: Callable[[], bool] = lambda: False) -> FastAPI:
    """The FastAPI application (served by uvicorn: specpipe.serving.http; on Ray by Serve's HTTP proxy)."""
    api = OpenAIApi(path, config, draining)
    app = FastAPI(title="specpipe", summary="The OpenAI-compatible API of a lossless speculative-decoding service",
                  version="1", docs_url=None, redoc_url=None)
    app.router.route_class = JsonRoute
    app.add_middleware(BodyCap, max_bytes=config.max_request_bytes)
    auth = [Depends(api.authorize)]
    streamed: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/event-stream": {}}, "description": "the answer, or its events (stream)"}}
    app.add_api_route("/health", api.health, methods=["GET"], response_model=Health, responses={503: {"model": Health}})
    app.add_api_route("/v1/models", api.models, methods=["GET"], dependencies=auth, response_model=ModelList,
                      responses=ERRORS)
    app.add_api_route("/v1/completions", api.completions, methods=["POST"], dependencies=auth,
                      response_model=CompletionResponse, responses={**ERRORS, **streamed})
    app.add_api_route("/v1/chat/completions", api.chat, methods=["POST"], dependencies=auth,
                      response_model=ChatCompletionResponse, responses={**ERRORS, **streamed})
    app.add_exception_handler(HTTPException, http_error())
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(SpecpipeError, lambda request, err: from_specpipe(err).response())
    app.add_exception_handler(Exception, internal_error)
    return app


def http_error() -> Callable[[Request, Exception], Coroutine[Any, Any, JSONResponse]]:
    """Starlette's own statuses (404, 405, ...) and ApiError, in the OpenAI error shape."""
    async def handler(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        if isinstance(err, ApiError):
            return err.response()
        headers = dict(err.headers or {})
        message = {404: f"no {request.method} {request.url.path} here (/v1/completions, /v1/chat/completions, "
                        "/v1/models, /health, /openapi.json)",
                   405: f"{request.method} is not allowed on {request.url.path} (allowed: {headers.get('Allow', '')})",
                   }.get(err.status_code, str(err.detail))
        if err.status_code == 408:
            headers["Connection"] = "close"  # the rest of the body is not read
        return ApiError(err.status_code, message, headers=headers).response()

    return handler


async def validation_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    model = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}.get(request.url.path)
    return refusal(err.errors(), model).response()


def refusal(errors: Sequence[Any], model: type[BaseModel] | None) -> ApiError:
    """A pydantic validation error as the OpenAI error: the first error's field as param."""
    first = errors[0]
    where = list(first["loc"][1:]) if first["loc"][:1] == ("body",) else list(first["loc"])
    param = param_name(where)
    if param is None:
        return ApiError(400, "the request body must be a JSON object")
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"{param}: the API has no such field", param)
    field = model.model_fields.get(where[0]) if model is not None else None
    if field is not None and NEUTRAL in field.metadata:  # the whole field is what specpipe lacks
        if len(where) == 1:
            return ApiError(400, f"{param}={SHORT.repr(first.get('input'))} is not supported by specpipe", param)
        return ApiError(400, f"{where[0]} is not supported by specpipe ({param}: {first['msg']})", str(where[0]))
    if field is not None and field.description and sum(param_name(list(e["loc"][1:])) == param for e in errors) > 1:
        return ApiError(400, f"{param}: expected {field.description}", param)  # no member of a union fits
    return ApiError(400, f"{param}: {first['msg']}", param)


UNION_TAGS = frozenset(("str", "int", "float", "bool", "dict", "list", "none"))


def _short_repr() -> reprlib.Repr:
    """A value shown in a message: at most a few items and 60 characters of a string."""
    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlist, short.maxdict, short.maxlevel = 60, 60, 4, 4, 2
    return short


SHORT = _short_repr()


def param_name(loc: list[Any]) -> str | None:
    """("messages", 0, "role") -> "messages[0].role"; pydantic's union member tags ("str", "list[int]") end it."""
    if not loc:
        return None
    name = str(loc[0])[:120]
    for part in loc[1:]:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.isidentifier() and part not in UNION_TAGS and not part[0].isupper():
            name += f".{part}"
        else:
            break
    return name


async def internal_error(request: Request, err: Exception) -> JSONResponse:
    """A bug: logged with its traceback (by the server), answered in the OpenAI shape."""
    return ApiError(500, f"internal error: {type(err).__name__}", kind="internal_error").response()

"""OpenAI-compatible routes, and the request and response shapes they speak.

Requests are parsed by hand (size-capped body, then pydantic in strict mode) so that
every bad input, malformed JSON included, gets the OpenAI error shape
{"error": {"message", "type", "param", "code"}} with a fitting status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..constraints import Constraint, ConstraintError
from ..generate import GenerationConfig
from ..sampling import SamplingConfig
from .metrics import CountRequests, Metrics
from .worker import Job, QueueFull, Worker


@dataclass
class Settings:
    model_name: str  # the id clients pass as "model"
    k: int | str = "auto"  # draft tokens per round, or "auto"
    k_max: int = 8  # the most drafts "auto" proposes in a round
    policy: object | None = None  # one adaptive controller for all requests (keeps its measurements)
    api_key: str | None = None
    max_queue: int = 16  # requests waiting for the model; one more gets 429
    queue_timeout: float = 120.0  # seconds a request may wait for the model
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024  # cap on max_tokens per request, and its default


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


# ---- requests ---------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Request(_Strict):
    model_config = ConfigDict(strict=True, extra="allow")  # extras are checked by name below
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None  # None: OpenAI's default, 1
    top_p: float | None = None
    top_k: int | None = None  # an extension: 0 = off
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int]


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None


# OpenAI parameters we cannot honour, accepted only at a value that asks for nothing.
NEUTRAL = {
    "n": (None, 1), "best_of": (None, 1), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "parallel_tool_calls": (None, True, False),
    "metadata": (None, {}), "store": (None, False), "service_tier": (None, "auto", "default"),
}


def parse(model: type[_Request], data) -> _Request:
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    unsupported = sorted(name for name, value in (request.model_extra or {}).items()
                         if name not in NEUTRAL or not any(_asks_nothing(value, v) for v in NEUTRAL[name]))
    if unsupported:
        raise APIError(400, f"unsupported parameter(s): {', '.join(unsupported)} (specsample serves one "
                       "completion per request: no n > 1, logprobs, penalties or tools)",
                       param=unsupported[0], code="unsupported_parameter")
    return request


def _asks_nothing(value, neutral) -> bool:
    if isinstance(value, bool) or isinstance(neutral, bool):  # True == 1, but "n": true is no count
        return value is neutral
    return value == neutral  # 0.0 == 0


def _validation_error(e: ValidationError) -> APIError:
    error = e.errors()[0]
    # Union members add their type to the location ("content", "str"); drop those.
    loc = [str(p) for p in error["loc"] if isinstance(p, int) or p.isidentifier() and p not in {"str", "int", "float"}]
    param = ".".join(loc) or None
    if error["type"] == "missing":
        return APIError(400, f"missing required parameter: {param}", param=param, code="missing_required_parameter")
    return APIError(400, f"{param}: {error['msg']}" if param else error["msg"], param=param, code="invalid_type")


def _check_range(name: str, value, low, high, low_open: bool = False) -> None:
    if value is None:
        return
    if value < low or value == low and low_open or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise APIError(400, f"{name} must be in {interval}, got {value}", param=name, code="invalid_value")


# OpenAI takes 4; the HumanEval completion protocol needs 5, and vLLM and llama-server
# set no limit. Each stop string is searched in the text after every round.
MAX_STOP_STRINGS = 16


def generation_config(request: _Request, max_tokens: int | None, settings: Settings) -> GenerationConfig:
    """The request's settings; max_new_tokens is fitted to the prompt later."""
    _check_range("temperature", request.temperature, 0, 2)
    _check_range("top_p", request.top_p, 0, 1, low_open=True)
    _check_range("top_k", request.top_k, 0, 1 << 31)
    _check_range("max_tokens", max_tokens, 1, settings.max_tokens)
    _check_range("seed", request.seed, -(1 << 63), (1 << 64) - 1)  # what torch's manual_seed takes
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if len(stop) > MAX_STOP_STRINGS or not all(stop):
        raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop",
                       code="invalid_value")
    sampling = SamplingConfig(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=request.top_k or 0, top_p=1.0 if request.top_p is None else request.top_p,
    )
    return GenerationConfig(max_new_tokens=max_tokens or settings.max_tokens, k=settings.k, k_max=settings.k_max,
                            sampling=sampling, seed=request.seed, stop_strings=tuple(stop),
                            constraint=response_constraint(request.response_format))


def response_constraint(response_format: ResponseFormat | None) -> Constraint | None:
    """OpenAI's response_format: text, any JSON object, or JSON under a schema. The
    output always follows the schema; `strict` (default false, as OpenAI's) says
    whether schema keywords the grammar engine does not implement are refused."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Constraint.json_object()
    spec = response_format.json_schema
    if spec is None:
        raise APIError(400, "response_format.json_schema is required when the type is json_schema",
                       param="response_format.json_schema", code="missing_required_parameter")
    try:
        return Constraint.json_schema(spec.schema_ or {"type": "object"}, strict=bool(spec.strict))
    except ConstraintError as e:
        raise APIError(400, f"response_format.json_schema.schema: {e}", param="response_format.json_schema.schema",
                       code="invalid_value") from None


def _draft_reserve(config: GenerationConfig) -> int:
    # Positions a round may score past the emitted text (stream() checks the same).
    return (config.k if isinstance(config.k, int) else config.k_max) + 1


def fit_context(config: GenerationConfig, requested: int | None, prompt_len: int, context: int, param: str) -> None:
    """Default max_tokens to what fits; a prompt or max_tokens that cannot fit is a 400."""
    reserve = _draft_reserve(config)
    room = context - prompt_len - reserve
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens, but this model's context of {context} tokens "
                       f"takes prompts of at most {context - reserve - 1}", param=param, code="context_length_exceeded")
    if requested is not None and requested > room:
        raise APIError(400, f"max_tokens {requested} does not fit: the prompt has {prompt_len} tokens, which leaves "
                       f"room for {room} in this model's context of {context} tokens",
                       param="max_tokens", code="context_length_exceeded")
    config.max_new_tokens = min(room, config.max_new_tokens)


def completion_prompt(request: CompletionRequest, target) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):  # token ids
        if not all(0 <= t < target.vocab_size for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {target.vocab_size})", param="prompt")
        return list(prompt)
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
        prompt = prompt[0]
    ids = target.tokenizer.encode(prompt) if prompt else []
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    return ids


def chat_prompt(request: ChatRequest, target) -> list[int]:
    messages = [{"role": "system" if m.role == "developer" else m.role,
                 "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
                for m in request.messages]
    try:
        return target.tokenizer.chat_messages(messages)
    except ValueError as e:  # no chat template
        raise APIError(400, f"{e}; use /v1/completions", param="messages") from None


# ---- responses --------------------------------------------------------------------

FINISH_REASONS = {"length": "length", "eos": "stop", "stop_string": "stop", "grammar": "stop"}


class Reply:
    """The OpenAI shapes of one answer: chat or text completion, whole or in chunks."""

    def __init__(self, chat: bool, model: str, prompt_len: int, drafter_name: str | None):
        self.chat, self.model, self.prompt_len, self.drafter_name = chat, model, prompt_len, drafter_name
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _wrap(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False) -> dict:
        if not self.chat:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            return self._wrap("text_completion", [choice])
        delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
        return self._wrap("chat.completion.chunk", [{"index": 0, "delta": delta, "logprobs": None,
                                                     "finish_reason": finish_reason}])

    def usage_chunk(self, result) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._wrap(obj, [], usage=self.usage(result))

    def whole(self, result) -> dict:
        finish = FINISH_REASONS[result.stop_reason]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        return self._wrap("chat.completion" if self.chat else "text_completion", [choice], usage=self.usage(result))

    def usage(self, result) -> dict:
        n = len(result.token_ids)
        # An extension: this request's speculative statistics (acceptance rate, tokens
        # per target call, accepted-per-round histogram, time split).
        speculative = {"drafter": self.drafter_name, **result.stats.as_dict()}
        return {"prompt_tokens": self.prompt_len, "completion_tokens": n, "total_tokens": self.prompt_len + n,
                "speculative": speculative}


# ---- the app ----------------------------------------------------------------------

@dataclass
class Server:
    target: object  # a Backend with a tokenizer
    make_drafter: object  # SamplingConfig -> Drafter | None
    drafter_name: str | None
    settings: Settings
    worker: Worker
    metrics: Metrics


async def read_json(request: Request, limit: int):
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > limit:
        raise APIError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
    body = bytearray()
    async for part in request.stream():  # chunked bodies have no length: count as they come
        body += part
        if len(body) > limit:
            raise APIError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _generation_error(e: Exception) -> APIError:
    if isinstance(e, ValueError):  # stream()'s own checks: context, vocabularies
        return APIError(400, str(e))
    return APIError(500, f"generation failed: {type(e).__name__}", type="server_error")


async def completions(request: Request) -> Response:
    return await _answer(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _answer(request, chat=True)


async def _answer(request: Request, chat: bool) -> Response:
    arrived = time.monotonic()
    server: Server = request.app.state.server
    settings = server.settings
    body = parse(ChatRequest if chat else CompletionRequest, await read_json(request, settings.max_body_bytes))
    if body.model != settings.model_name:
        raise APIError(404, f"model {body.model!r} not found; this server serves {settings.model_name!r}",
                       param="model", code="model_not_found")
    requested = body.max_tokens
    if chat and body.max_completion_tokens is not None:
        requested = body.max_completion_tokens
    try:
        config = generation_config(body, requested, settings)
    except ValueError as e:
        raise APIError(400, str(e)) from None
    # Tokenizing a long prompt takes a while: off the loop, like generation.
    ids = await run_in_threadpool(chat_prompt if chat else completion_prompt, body, server.target)
    fit_context(config, requested, len(ids), server.target.context_length, "messages" if chat else "prompt")

    job = Job(ids, config, lambda: server.make_drafter(config.sampling), asyncio.get_running_loop())
    try:
        server.worker.submit(job)
    except QueueFull:
        raise APIError(429, f"the server is busy: {settings.max_queue} requests are waiting; retry later",
                       type="rate_limit_error", code="queue_full") from None
    reply = Reply(chat, settings.model_name, len(ids), server.drafter_name)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        await _wait_for_model(server, job, arrived)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return EventSourceResponse(_events(server, job, reply, arrived, include_usage), sep="\n", ping=15)
        return JSONResponse(reply.whole(await _collect(server, job, arrived)))
    finally:
        # A stream's disconnects are sse-starlette's to notice from here on.
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    job.cancel()


async def _wait_for_model(server: Server, job: Job, arrived: float) -> None:
    timeout = server.settings.queue_timeout
    try:
        kind, value = await asyncio.wait_for(job.events.get(), timeout)
    except asyncio.TimeoutError:
        job.cancel()  # the worker skips it
        server.metrics.cancelled.inc()
        raise APIError(503, f"timed out after {timeout:g} s waiting for the model; retry later",
                       type="server_error", code="queue_timeout") from None
    except asyncio.CancelledError:
        job.cancel()
        raise
    if kind == "error":
        raise _generation_error(value)
    if kind == "cancelled":
        server.metrics.cancelled.inc()
        raise APIError(499, "client disconnected")
    server.metrics.queue_wait_seconds.observe(time.monotonic() - arrived)


async def _collect(server: Server, job: Job, arrived: float):
    first = True
    while True:
        kind, value = await job.events.get()
        if kind == "chunk" and first:
            server.metrics.first_token_seconds.observe(time.monotonic() - arrived)
            first = False
        elif kind == "done":
            server.metrics.finished(len(job.prompt_ids), value.stats)
            return value
        elif kind == "error":
            raise _generation_error(value)
        elif kind == "cancelled":  # the client is gone: nobody reads this
            server.metrics.cancelled.inc()
            raise APIError(499, "client disconnected")


async def _events(server: Server, job: Job, reply: Reply, arrived: float, include_usage: bool):
    ended = False
    try:
        if reply.chat:
            yield {"data": json.dumps(reply.chunk(role=True))}
        first = True
        while True:
            kind, value = await job.events.get()
            if kind == "chunk" and value.text:
                if first:
                    server.metrics.first_token_seconds.observe(time.monotonic() - arrived)
                    first = False
                yield {"data": json.dumps(reply.chunk(value.text))}
            elif kind == "done":
                ended = True
                server.metrics.finished(len(job.prompt_ids), value.stats)
                yield {"data": json.dumps(reply.chunk(finish_reason=FINISH_REASONS[value.stop_reason]))}
                if include_usage:
                    yield {"data": json.dumps(reply.usage_chunk(value))}
                break
            elif kind == "error":
                ended = True
                yield {"data": json.dumps(_generation_error(value).body())}
                break
            elif kind == "cancelled":
                break
        yield {"data": "[DONE]"}
    finally:
        # On a disconnect sse-starlette cancels this generator: the worker stops at
        # the next round. Once the generation ended this is a no-op.
        job.cancel()
        if not ended:
            server.metrics.cancelled.inc()


async def list_models(request: Request) -> Response:
    server: Server = request.app.state.server
    model = {"id": server.settings.model_name, "object": "model", "created": 0, "owned_by": "specsample"}
    return JSONResponse({"object": "list", "data": [model]})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(request.app.state.server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


class RequireKey:
    """ASGI middleware: every path but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app, key: str):
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # constant time
                error = APIError(401, "a valid API key is required: Authorization: Bearer <key>",
                                 code="invalid_api_key")
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)


async def _api_error(request: Request, e: APIError) -> Response:
    return e.response()


async def _http_error(request: Request, e: HTTPException) -> Response:
    return APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()


async def _internal_error(request: Request, e: Exception) -> Response:
    return APIError(500, f"internal error: {type(e).__name__}", type="server_error").response()


def create_app(target, make_drafter, drafter_name: str | None, settings: Settings) -> Starlette:
    """make_drafter(sampling) -> a Drafter or None (autoregressive), built per request."""
    if target.tokenizer is None:
        raise ValueError(f"{target.name} has no tokenizer; the server needs one")
    worker = Worker(target, settings.max_queue, settings.policy)
    server = Server(target, make_drafter, drafter_name, settings, worker,
                    Metrics(queue_depth=lambda: worker.depth))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    if settings.api_key:
        app.add_middleware(RequireKey, key=settings.api_key)
    app.add_middleware(CountRequests, metrics=server.metrics, endpoints={r.path for r in routes})  # outermost
    app.state.server = server
    return app

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
import dataclasses
import time
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

from ..backends.base import ChatTemplateError
from ..constraints import Constraint, ConstraintError
from ..generate import GenerationConfig
from ..logprobs import MAX_TOP
from ..sampling import SamplingConfig
from .metrics import CountRequests, Metrics
from .replies import FINISH_REASONS, Choice, Reply
from .worker import Job, QueueFull, Task, Worker


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
    verifier: str = "auto"  # GenerationConfig.verifier for every request


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
    min_p: float | None = None  # an extension (vLLM's): 0 = off
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # an extension (vLLM's): 1 = off
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    logprobs_mode: Literal["raw", "processed"] | None = None  # an extension; see logprobs.py
    user: str | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None  # alternatives per token, up to 20
    echo: bool = False


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


# OpenAI parameters we cannot honour, accepted only at a value that asks for nothing.
NEUTRAL = {
    "best_of": (None, 1), "suffix": (None, ""),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
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
        raise APIError(400, f"unsupported parameter(s): {', '.join(unsupported)} (specsample serves plain-text "
                       "completions: no tools, suffix or best_of; see docs/serve.md)",
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


MAX_CHOICES = 32  # prompts x n in one request; they take turns on the model like separate requests
MAX_LOGIT_BIAS = 300  # OpenAI's limit


def generation_config(request: _Request, max_tokens: int | None, settings: Settings,
                      vocab_size: int) -> GenerationConfig | None:
    """The request's settings; max_new_tokens is fitted to the prompt later. None:
    nothing to generate (echo with max_tokens 0: the prompt is only scored)."""
    echo = getattr(request, "echo", False)
    _check_range("temperature", request.temperature, 0, 2)
    _check_range("top_p", request.top_p, 0, 1, low_open=True)
    _check_range("top_k", request.top_k, 0, 1 << 31)
    _check_range("min_p", request.min_p, 0, 1)
    _check_range("presence_penalty", request.presence_penalty, -2, 2)
    _check_range("frequency_penalty", request.frequency_penalty, -2, 2)
    _check_range("repetition_penalty", request.repetition_penalty, 0, 10, low_open=True)
    _check_range("max_tokens", max_tokens, 0 if echo else 1, settings.max_tokens)
    _check_range("seed", request.seed, -(1 << 63), (1 << 64) - 1)  # what torch's manual_seed takes
    _check_range("n", request.n, 1, MAX_CHOICES)
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if len(stop) > MAX_STOP_STRINGS or not all(stop):
        raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop",
                       code="invalid_value")
    sampling = SamplingConfig(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=request.top_k or 0, top_p=1.0 if request.top_p is None else request.top_p,
        min_p=request.min_p or 0.0, presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
        logit_bias=logit_bias(request.logit_bias, vocab_size),
    )
    if max_tokens == 0:
        return None
    return GenerationConfig(max_new_tokens=max_tokens or settings.max_tokens, k=settings.k, k_max=settings.k_max,
                            sampling=sampling, seed=request.seed, stop_strings=tuple(stop), verifier=settings.verifier,
                            logprobs=requested_logprobs(request), logprobs_mode=request.logprobs_mode or "raw",
                            constraint=response_constraint(request.response_format))


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    if not bias:
        return {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}",
                       param="logit_bias", code="invalid_value")
    out = {}
    for key, value in bias.items():
        if not key.isdigit() or int(key) >= vocab_size or not -100 <= value <= 100:
            raise APIError(400, f"logit_bias maps token ids in [0, {vocab_size}) to biases in [-100, 100], "
                           f"got {key!r}: {value}", param="logit_bias", code="invalid_value")
        out[int(key)] = value
    return out


def requested_logprobs(request: _Request) -> int | None:
    """Alternatives per token, or None when no log-probabilities are asked for."""
    if isinstance(request, CompletionRequest):
        _check_range("logprobs", request.logprobs, 0, MAX_TOP)
        return request.logprobs
    _check_range("top_logprobs", request.top_logprobs, 0, MAX_TOP)
    if request.top_logprobs and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return (request.top_logprobs or 0) if request.logprobs else None


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


def fit_context(config: GenerationConfig | None, requested: int | None, prompt_len: int, context: int,
                param: str) -> None:
    """Default max_tokens to what fits; a prompt or max_tokens that cannot fit is a 400."""
    if config is None:  # scoring alone
        if prompt_len > context:
            raise APIError(400, f"the prompt has {prompt_len} tokens, but this model's context takes at most "
                           f"{context}", param=param, code="context_length_exceeded")
        return
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


def completion_prompts(request: CompletionRequest, target) -> list[tuple[list[int], str | None]]:
    """Each prompt's token ids, and its text when it came as text (for echo)."""
    prompt = request.prompt
    if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
        prompts = [prompt]  # one text, or one list of token ids
    else:
        prompts = prompt
    if not prompts:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(prompts) > MAX_CHOICES:
        raise APIError(400, f"at most {MAX_CHOICES} prompts per request, got {len(prompts)}", param="prompt")
    out = []
    for p in prompts:
        if isinstance(p, list):  # token ids
            if not p or not all(0 <= t < target.vocab_size for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {target.vocab_size}), at least one",
                               param="prompt")
            out.append((list(p), None))
            continue
        ids = target.tokenizer.encode(p) if p else []
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        out.append((ids, p))
    return out


def chat_prompt(request: ChatRequest, target) -> list[int]:
    messages = [{"role": "system" if m.role == "developer" else m.role,
                 "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
                for m in request.messages]
    try:
        return target.tokenizer.chat_messages(messages)
    except ChatTemplateError as e:  # the template refused these messages (raise_exception)
        raise APIError(400, str(e), param="messages") from None
    except ValueError as e:  # no chat template
        raise APIError(400, f"{e}; use /v1/completions", param="messages") from None


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


def _generation_error(e: Exception, started: bool) -> APIError:
    """Before the first round, a ValueError is stream()'s verdict on the request
    (context, vocabularies); once generation runs, any failure is the engine's."""
    if isinstance(e, ValueError) and not started:
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
        config = generation_config(body, requested, settings, server.target.vocab_size)
        logprobs = requested_logprobs(body)
    except ValueError as e:
        raise APIError(400, str(e)) from None
    # Tokenizing a long prompt takes a while: off the loop, like generation.
    if chat:
        prompts = [(await run_in_threadpool(chat_prompt, body, server.target), None)]
    else:
        prompts = await run_in_threadpool(completion_prompts, body, server.target)
    n = body.n or 1
    if len(prompts) * n > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x n = {n} asks for more than {MAX_CHOICES} choices",
                       param="n", code="invalid_value")
    echo = not chat and body.echo
    tasks, echoes = [], {}
    for p, (ids, text) in enumerate(prompts):
        fitted = None if config is None else dataclasses.replace(config)
        fit_context(fitted, requested, len(ids), server.target.context_length, "messages" if chat else "prompt")
        for i in range(n):
            index = p * n + i
            # n samples of one prompt: seeds seed, seed + 1, ... (each one reproducible alone)
            seeded = None if fitted is None else dataclasses.replace(fitted, seed=_nth_seed(body.seed, i))
            tasks.append(Task(index, ids, seeded, logprobs if echo and logprobs is not None else None))
            if echo:
                echoes[index] = ids, text
    sampling = config.sampling if config is not None else None
    job = Job(tasks, lambda: server.make_drafter(sampling), asyncio.get_running_loop())
    try:
        server.worker.submit(job)
    except QueueFull:
        raise APIError(429, f"the server is busy: {settings.max_queue} requests are waiting; retry later",
                       type="rate_limit_error", code="queue_full") from None
    reply = Reply(chat, settings.model_name, sum(len(ids) for ids, _ in prompts), server.drafter_name,
                  server.target.tokenizer, logprobs)
    answer = Answer(reply, echoes, server.target.tokenizer)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        await _wait_for_model(server, job, arrived)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return EventSourceResponse(_events(server, job, answer, arrived, include_usage), sep="\n", ping=15)
        await _collect(server, job, answer, arrived)
        return JSONResponse(reply.whole(answer.whole, answer.results))
    finally:
        # A stream's disconnects are sse-starlette's to notice from here on.
        watcher.cancel()


def _nth_seed(seed: int | None, i: int) -> int | None:
    if seed is None:
        return None
    return seed + i if seed + i < 1 << 64 else seed - i


class Answer:
    """Turns the worker's events into choices: each event's part, and the whole so far."""

    def __init__(self, reply: Reply, echoes: dict, tokenizer):
        self.reply, self.echoes, self.tokenizer = reply, echoes, tokenizer
        self.whole: dict[int, Choice] = {}
        self.results: dict = {}

    def part(self, kind: str, value) -> Choice | None:
        """The new part of a choice an event brings, or None."""
        index, payload = value
        whole = self.whole.setdefault(index, Choice(index))
        part = Choice(index)
        if index in self.echoes and not whole.text and not whole.entries:  # the prompt comes first
            ids, text = self.echoes.pop(index)
            part.text = text if text is not None else self.tokenizer.decode(ids)
            if kind == "prompt":
                part.entries = list(zip(ids, payload))
        if kind == "chunk":
            part.text += payload.text
            if payload.logprobs is not None:
                part.entries += list(zip(payload.token_ids, payload.logprobs))
        elif kind == "result":
            self.results[index] = payload
        whole.text += part.text
        whole.entries += part.entries
        return part if part.text or part.entries else None


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
    if kind == "error":  # from stream()'s checks: nothing ran yet
        raise _generation_error(value, started=False)
    if kind == "cancelled":
        server.metrics.cancelled.inc()
        raise APIError(499, "client disconnected")
    server.metrics.queue_wait_seconds.observe(time.monotonic() - arrived)


async def _collect(server: Server, job: Job, answer: Answer, arrived: float) -> None:
    first = True
    while True:
        kind, value = await job.events.get()
        if kind == "chunk" and first:
            server.metrics.first_token_seconds.observe(time.monotonic() - arrived)
            first = False
        if kind in ("prompt", "chunk", "result"):
            answer.part(kind, value)
            if kind == "result":
                server.metrics.finished(len(job.tasks[0].prompt_ids), value[1].stats)
        elif kind == "done":
            return
        elif kind == "error":
            raise _generation_error(value, started=True)
        elif kind == "cancelled":  # the client is gone: nobody reads this
            server.metrics.cancelled.inc()
            raise APIError(499, "client disconnected")


async def _events(server: Server, job: Job, answer: Answer, arrived: float, include_usage: bool):
    reply, ended, first, begun = answer.reply, False, True, set()
    try:
        while True:
            kind, value = await job.events.get()
            if kind in ("prompt", "chunk", "result"):
                index = value[0]
                if reply.chat and index not in begun:
                    yield {"data": json.dumps(reply.chunk(Choice(index), role=True))}
                begun.add(index)
                part = answer.part(kind, value)
                if part is not None:
                    if first and kind == "chunk":
                        server.metrics.first_token_seconds.observe(time.monotonic() - arrived)
                        first = False
                    yield {"data": json.dumps(reply.chunk(part))}
                if kind == "result":
                    server.metrics.finished(len(job.tasks[0].prompt_ids), value[1].stats)
                    finish = FINISH_REASONS[value[1].stop_reason]
                    yield {"data": json.dumps(reply.chunk(Choice(index), finish_reason=finish))}
            elif kind == "done":
                ended = True
                if include_usage:
                    yield {"data": json.dumps(reply.usage_chunk(answer.results))}
                break
            elif kind == "error":
                ended = True
                yield {"data": json.dumps(_generation_error(value, started=True).body())}
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


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True  # accepted for vLLM's clients; this tokenizer adds none


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


async def tokenize(request: Request) -> Response:
    """vLLM's /tokenize, which evaluation harnesses use to count context tokens
    exactly as the server will (lm-evaluation-harness's remote tokenizer)."""
    server: Server = request.app.state.server
    try:
        body = TokenizeRequest.model_validate(await read_json(request, server.settings.max_body_bytes))
    except ValidationError as e:
        raise _validation_error(e) from None
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give one of prompt or messages", param="prompt")
    if body.messages is not None:
        ids = await run_in_threadpool(chat_prompt, body, server.target)
    else:
        ids = await run_in_threadpool(server.target.tokenizer.encode, body.prompt)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": server.target.context_length})


async def detokenize(request: Request) -> Response:
    server: Server = request.app.state.server
    try:
        body = DetokenizeRequest.model_validate(await read_json(request, server.settings.max_body_bytes))
    except ValidationError as e:
        raise _validation_error(e) from None
    if not all(0 <= t < server.target.vocab_size for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {server.target.vocab_size})", param="tokens")
    return JSONResponse({"prompt": await run_in_threadpool(server.target.tokenizer.decode, body.tokens)})


async def tokenizer_info(request: Request) -> Response:
    server: Server = request.app.state.server
    # No token text here: special tokens decode to nothing in our tokenizers, and a
    # client that needs the end-of-text token gets the ids from the model's answers.
    return JSONResponse({"eos_token": None, "bos_token": None, "pad_token": None,
                         "chat_template": getattr(server.target, "chat_template", None),
                         "model_max_length": server.target.context_length})


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
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
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

"""The OpenAI request shapes, and reading a body into one.

Requests are parsed by hand (size-capped body, then pydantic in strict mode) so that
every bad input, malformed JSON included, gets the OpenAI error shape with a fitting
status.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.requests import ClientDisconnect, Request

from .doors import log, require_json
from .errors import APIError, ClientGone


# vLLM's cache_salt: a slot's cache is reused only between requests with the same salt.
Salt = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class MessageToolCall(_Strict):
    """A call an earlier assistant turn made, sent back with the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: only an assistant turn that made tool calls
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant turn's
    tool_call_id: str | None = None  # a tool turn's: the call it answers


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments object; None: no arguments
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


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


class GenerationRequest(_Strict):
    """What completions and chat completions share."""

    model_config = ConfigDict(strict=True, extra="allow")  # extras are checked by name in parse
    # The served model's id; absent or "" is the one model served, as llama-server takes
    # it (llama.vim sends "model": "" with its default config).
    model: str | None = None
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
    # llama-server's: score only what the request's slot does not hold already of its
    # prompt (GenerationConfig.cache_prompt); None: the server's default (--cache-prompt).
    cache_prompt: bool | None = None
    # vLLM's: a slot's cache is reused only between requests with the same salt, so a
    # client cannot learn from cached_tokens (or timing) what another's prompt holds.
    cache_salt: Salt | None = None


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None  # alternatives per token, up to 20
    echo: bool = False
    suffix: str | None = None  # non-empty: a fill-in-the-middle prompt (fim.py)


MAX_EXTRA_CHUNKS = 256  # /infill's input_extra
# OpenAI's limit on a chat's messages ("array too long ... maximum length 2048"); llama-server
# and vLLM set none. The bound comes before any tokenizing: 20,000 one-letter messages
# held the shared tokenizer thread for 42 s (chat.py says where that time went).
MAX_MESSAGES = 2048


class ExtraChunk(_Strict):
    filename: str = "tmp"  # llama-server's default name
    text: str = ""
    time: list[float] | float | None = None  # llama.vim's: when it took the chunk (read by nobody, as in llama-server)


class EditorFields(_Strict):
    """llama-server's fields that editors send (serve/editor.py): llama.vim's /infill
    requests, and its instruction requests to /v1/chat/completions."""

    model_config = ConfigDict(strict=True, extra="allow")  # as GenerationRequest's, which it joins

    n_predict: int | None = None  # llama-server's max_tokens (-1: as many as fit; 0: the prompt only, a warm-up)
    id_slot: int | None = None  # the slot to run on: a hint; the worker takes a free one
    n_indent: int | None = None  # lines after the first indented at least this much, or the text ends
    t_max_prompt_ms: int | None = None  # accepted, as llama-server accepts it: it sets no limit either
    t_max_predict_ms: int | None = None  # after this long, end at the next newline
    samplers: list[str] | str | None = None  # llama.cpp's sampler names in order, or its letter codes ("kpi")
    response_fields: list[str] | None = None  # /infill's answer fields to send ("timings/prompt_n": nested)


class InfillRequest(GenerationRequest, EditorFields):
    """llama-server's /infill: the text around the cursor, other files as context, and
    its name for max_tokens (n_predict, -1: as many as fit)."""

    input_prefix: str = ""
    input_suffix: str = ""
    # llama.vim sends its ring of chunks (16 by default); the bound comes before any
    # tokenizing, so a body of 340,000 empty chunks is a 400 at once.
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)
    prompt: str = ""  # typed after input_prefix (llama-server's place for it)


class ChatRequest(GenerationRequest, EditorFields):
    """OpenAI's chat, with llama-server's editor fields (llama.vim's instruction requests:
    samplers, n_predict 0 warm-ups; response_fields is taken and, as llama-server does on
    this route, not applied)."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # None: auto with tools
    parallel_tool_calls: bool | None = None  # None: true, as OpenAI's default


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, max_length=MAX_MESSAGES)
    tools: list[ToolDef] | None = None  # with messages: counted as the chat template writes them in
    add_special_tokens: bool = True  # accepted for vLLM's clients; this tokenizer adds none


class EraseRequest(_Strict):
    """`/slots/N?action=erase`'s body, which may be empty: the salt whose cache to erase."""

    cache_salt: Salt | None = None  # None: the unsalted requests' cache


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


# OpenAI parameters we cannot honour, accepted only at a value that asks for nothing
# (tools and tool_choice are chat's own fields: on completions they ask for nothing).
NEUTRAL = {
    "best_of": (None, 1),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "parallel_tool_calls": (None, True, False),
    "metadata": (None, {}), "store": (None, False), "service_tier": (None, "auto", "default"),
}

Model = TypeVar("Model", bound=_Strict)


async def read_request(request: Request, model: type[Model], limit: int, timeout: float,
                       empty_ok: bool = False) -> Model:
    """The body, at most `limit` bytes of JSON arriving within `timeout` seconds, as
    `model` (an empty body as {} if `empty_ok`); unknown parameters are refused unless
    NEUTRAL allows their value."""
    data = await read_json(request, limit, timeout, empty_ok)
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        parsed = model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    unsupported = sorted(name for name, value in (parsed.model_extra or {}).items()
                         if name not in NEUTRAL or not any(_asks_nothing(value, v) for v in NEUTRAL[name]))
    if unsupported:
        raise APIError(400, f"unsupported parameter(s): {', '.join(unsupported)} (see docs/serve.md for what "
                       "each endpoint takes)",
                       param=unsupported[0], code="unsupported_parameter")
    return parsed


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


async def read_json(request: Request, limit: int, timeout: float, empty_ok: bool = False):
    require_json(request)
    length = request.headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()) or int(length) > limit:
        raise APIError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
    try:
        # One deadline for the whole body: a client trickling a byte at a time must
        # not hold a connection (and a place under the connection limit) for ever.
        body = await asyncio.wait_for(_read_body(request, limit), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s",
                       code="request_timeout") from None
    except ClientDisconnect:
        client = request.client
        log.info("%s left before sending all of its request body", f"{client.host}:{client.port}" if client else "a client")
        raise ClientGone() from None
    if empty_ok and not body.strip():
        return {}
    try:
        data = json.loads(body, parse_constant=_no_constants, parse_float=_finite)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    if _may_hold_surrogates(body):
        _refuse_lone_surrogates(data)
    return data


_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a pair into one character: any left is alone


def _may_hold_surrogates(body: bytearray) -> bool:
    """Cheap, on bytes: a lone surrogate comes from a \\ud800-\\udfff escape, from raw
    surrogate bytes (which json.loads decodes with surrogatepass), or from a UTF-16 or
    UTF-32 body (which json.loads detects, NULs and all)."""
    return not body.isascii() or b"\x00" in body or _ESCAPED_SURROGATE.search(body) is not None


def _refuse_lone_surrogates(data) -> None:
    """A 400 naming a string (or key) that holds a lone UTF-16 surrogate, which
    JSON can spell but no UTF-8 text holds: every text field, once, before a tokenizer
    or a template sees it."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # in C: the walk below only when one is there
        return
    except UnicodeEncodeError:
        pass
    stack = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                # A key may hold it too: the name goes back escaped, as an answer holds no surrogate.
                param = ".".join(str(p).encode("utf-8", "backslashreplace").decode() for p in path) or None
                raise APIError(400, f"{param or 'the body'}: the text holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                               "escape without its pair), which is no Unicode character", param=param,
                               code="invalid_value")
        elif isinstance(value, dict):
            stack += [(path + (k,), k) for k in value] + [(path + (k,), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(path + (i,), v) for i, v in enumerate(value)]


async def _read_body(request: Request, limit: int) -> bytearray:
    body = bytearray()
    async for part in request.stream():  # chunked bodies have no length: count as they come
        body += part
        if len(body) > limit:
            raise APIError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
    return body


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    """A number too large for a double (1e999) would become inf, which no parameter
    takes and a schema's JSON cannot be written back with."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range (larger than a double holds)")
    return value

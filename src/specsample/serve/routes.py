"""The routes. A completion's path: read and check the request (schemas, request_config),
tokenize its prompts off the loop, queue one task per choice for the worker, then
follow the worker's events (one consumer, Follower) into a whole reply or a stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio.to_thread
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .doors import log, require_json
from .editor import editor_config
from .errors import APIError, ClientGone, ending_error, shutting_down, target_lost
from .events import Ended, Finished, Generated
from .replies import FINISH_REASONS, Answer, Choice, InfillReply, Reply
from .request_config import (chat_prompt, chat_prompts, completion_prompts, infill_prompts, plan, response_headers,
                             make_choices)
from .schemas import (ChatRequest, CompletionRequest, DetokenizeRequest, EraseRequest, GenerationRequest,
                      InfillRequest, TokenizeRequest, read_request)
from .settings import SHUTDOWN_SECONDS, Server
from .tool_requests import tool_plan
from .worker import QueuedRequest, QueueFull, ShuttingDown, SlotBusy, TargetLost


async def completions(request: Request) -> Response:
    return await _answer(request, CompletionRequest)


async def chat_completions(request: Request) -> Response:
    return await _answer(request, ChatRequest)


async def infill(request: Request) -> Response:
    """llama-server's /infill: a fill-in-the-middle prompt, answered in its shape."""
    return await _answer(request, InfillRequest)


# request kind -> its prompts (ids, text for echo), and the parameter a prompt too long for the context is
KINDS = {CompletionRequest: (completion_prompts, "prompt"), ChatRequest: (chat_prompts, "messages"),
         InfillRequest: (infill_prompts, "input_prefix")}


async def _answer(request: Request, kind: type[GenerationRequest]) -> Response:
    arrived = time.monotonic()
    server: Server = request.app.state.server
    body = await read_request(request, kind, server.settings.max_body_bytes, server.settings.body_timeout)
    # Set when the client leaves: it stops the prompt's tokenizing between pieces, and
    # then the job (its `cancelled`).
    left = threading.Event()
    watcher = asyncio.create_task(_cancel_on_disconnect(request, left))
    try:
        return await _answer_body(request, kind, body, left, arrived)
    finally:
        # A stream's disconnects are sse-starlette's to notice from here on.
        watcher.cancel()


async def _answer_body(request: Request, kind: type[GenerationRequest], body: GenerationRequest,
                       left: threading.Event, arrived: float) -> Response:
    server: Server = request.app.state.server
    settings = server.settings
    chat = kind is ChatRequest
    if body.model and body.model != settings.model_name:  # none or "": the one model served
        raise APIError(404, f"model {body.model!r} not found; this server serves {settings.model_name!r}",
                       param="model", code="model_not_found")
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    if kind is InfillRequest and include_usage:
        raise APIError(400, "/infill's last streamed object carries the counts: no stream_options",
                       param="stream_options", code="unsupported_parameter")
    tools = await off_the_loop(server, tool_plan, body, server.target) if chat else None
    asked = plan(body, settings, server.target.vocab_size, tools)
    if kind is not CompletionRequest:  # llama.vim's samplers and text rules, on /infill and chat
        asked.config = editor_config(body, asked.config, server.target)
    make_prompts, param = KINDS[kind]
    prompts = await off_the_loop(server, make_prompts, body, server.target, left.is_set)
    choices = make_choices(asked, prompts, server.target.context_length, param)
    sampling = asked.config.sampling if asked.config is not None else None
    job = QueuedRequest(choices, lambda draft: server.make_drafter(sampling, draft, body.cache_salt),
                        asyncio.get_running_loop(), cancelled=left, cache_salt=body.cache_salt)
    try:
        server.worker.submit(job)
    except QueueFull:
        raise APIError(429, f"the server is busy: {settings.max_queue} requests are waiting; retry later",
                       type="rate_limit_error", code="queue_full") from None
    except TargetLost as e:
        raise target_lost(e) from None
    except ShuttingDown as e:
        raise shutting_down(e) from None
    prompt_tokens = sum(len(ids) for ids, _ in prompts)
    if kind is InfillRequest:
        reply = InfillReply(settings.model_name, prompt_tokens, server.drafter_name, body.response_fields)
    else:
        reply = Reply(chat, settings.model_name, prompt_tokens, server.drafter_name, server.target.tokenizer,
                      asked.logprobs, *((tools.format, tools.names) if tools is not None else ()),
                      choices_per_prompt=asked.n)
    echoes = {task.index: prompts[task.index // asked.n] for task in choices} if asked.echo else {}
    follower = Follower(server, job, Answer(echoes, server.target.tokenizer), arrived)
    await follower.started()
    if body.stream:
        # A client that stops reading is dropped by the connection's send deadline
        # (connections.py), which the stream hears as a disconnect. On shutdown
        # sse-starlette would cut the stream at once: it waits for the worker's cut,
        # which ends it with an error event and [DONE].
        return EventSourceResponse(_stream(follower, reply, include_usage), sep="\n", ping=15,
                                   shutdown_grace_period=SHUTDOWN_SECONDS + 1, headers=response_headers(asked))
    async for _ in follower.steps():
        pass
    return JSONResponse(reply.whole(follower.answer.whole, follower.answer.results), headers=response_headers(asked))


async def off_the_loop(server: Server, tokenizing, *args):
    """Tokenizing a long prompt takes a while: off the loop, but in a few threads only
    (server.tokenizing), so that a flood of prompts cannot take the worker's cores."""
    return await anyio.to_thread.run_sync(tokenizing, *args, limiter=server.tokenizing)


async def _cancel_on_disconnect(request: Request, left: threading.Event) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    left.set()


@dataclass
class Step:
    """What one event adds to a choice: its new part, and its finish reason once it ended."""

    index: int
    part: Choice | None
    finish_reason: str | None = None


class Follower:
    """The one consumer of a job's events, for the whole reply and the stream alike: it
    keeps the answer and the metrics, and raises the APIError a job's end means."""

    def __init__(self, server: Server, job: QueuedRequest, answer: Answer, arrived: float):
        self.server, self.job, self.answer, self.arrived = server, job, answer, arrived
        self._prompts = {task.index: task.prompt_ids for task in job.choices}  # a batch's prompts differ in length

    async def started(self) -> None:
        """Wait for the worker to take the job, at most the queue timeout."""
        timeout = self.server.settings.queue_timeout
        try:
            event = await asyncio.wait_for(self.job.events.get(), timeout)
        except asyncio.TimeoutError:
            self.job.cancel()  # the worker skips it
            self.server.metrics.cancelled.inc()
            raise APIError(503, f"timed out after {timeout:g} s waiting for the model; retry later",
                           type="server_error", code="queue_timeout") from None
        except asyncio.CancelledError:
            self.job.cancel()
            raise
        if isinstance(event, Ended):  # refused, failed or cancelled before it started
            self._end(event)
        self.server.metrics.queue_wait_seconds.observe(time.monotonic() - self.arrived)

    async def steps(self) -> AsyncIterator[Step]:
        """Each choice's progress until the job ends; raises if it did not finish."""
        first = True
        while not isinstance(event := await self.job.events.get(), Ended):
            if isinstance(event, Generated) and first:
                self.server.metrics.first_token_seconds.observe(time.monotonic() - self.arrived)
                first = False
            step = Step(event.index, self.answer.part(event))
            if isinstance(event, Finished):
                self.server.metrics.finished(len(self._prompts[event.index]), event.result.stats)
                step.finish_reason = FINISH_REASONS[event.result.stop_reason]
            yield step
        self._end(event)

    def _end(self, ended: Ended) -> None:
        error = ending_error(ended)
        if isinstance(error, ClientGone):
            self.server.metrics.cancelled.inc()
        if error is not None:
            raise error


async def _stream(follower: Follower, reply: Reply | InfillReply, include_usage: bool):
    """Server-sent events: each step as a chunk (a chat choice opens with its role),
    usage if asked for, an error if the job failed, then [DONE] (OpenAI's shapes)."""
    ended, begun = False, set()
    try:
        try:
            async for step in follower.steps():
                if reply.chat and step.index not in begun:
                    yield {"data": json.dumps(reply.chunk(Choice(step.index), role=True))}
                begun.add(step.index)
                if step.part is not None:
                    for chunk in reply.chunks(step.part):
                        yield {"data": json.dumps(chunk)}
                if step.finish_reason is not None:
                    for chunk in reply.end_chunks(step.index, step.finish_reason, follower.answer.results):
                        yield {"data": json.dumps(chunk)}
            ended = True
            if include_usage:
                yield {"data": json.dumps(reply.usage_chunk(follower.answer.results))}
        except ClientGone:  # counted by the follower; nobody reads what follows
            ended = True
        except APIError as e:
            ended = True
            yield {"data": json.dumps(e.body())}
        if reply.done_marker:
            yield {"data": "[DONE]"}
    finally:
        # On a disconnect sse-starlette cancels this generator: the worker stops at
        # the next round. Once the generation ended this is a no-op.
        follower.job.cancel()
        if not ended:
            follower.server.metrics.cancelled.inc()


# ---- the other routes ---------------------------------------------------------------

async def list_models(request: Request) -> Response:
    server: Server = request.app.state.server
    # max_model_len, as vLLM reports it: the tokens a prompt and its answer may take together
    # (--ctx-size), so that a client can trim its prompt before a 400 says so.
    model = {"id": server.settings.model_name, "object": "model", "created": 0, "owned_by": "specsample",
             "max_model_len": server.target.context_length}
    return JSONResponse({"object": "list", "data": [model]})


async def tokenize(request: Request) -> Response:
    """vLLM's /tokenize, which evaluation harnesses use to count context tokens
    exactly as the server will (lm-evaluation-harness's remote tokenizer)."""
    server: Server = request.app.state.server
    body = await read_request(request, TokenizeRequest, server.settings.max_body_bytes, server.settings.body_timeout)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give one of prompt or messages", param="prompt")
    if body.messages is not None:
        ids = await off_the_loop(server, chat_prompt, body, server.target)
    else:
        ids = await off_the_loop(server, server.target.tokenizer.encode, body.prompt)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": server.target.context_length})


async def detokenize(request: Request) -> Response:
    server: Server = request.app.state.server
    body = await read_request(request, DetokenizeRequest, server.settings.max_body_bytes, server.settings.body_timeout)
    if not all(0 <= t < server.target.vocab_size for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {server.target.vocab_size})", param="tokens")
    return JSONResponse({"prompt": await off_the_loop(server, server.target.tokenizer.decode, body.tokens)})


async def tokenizer_info(request: Request) -> Response:
    server: Server = request.app.state.server
    # No token text here: special tokens decode to nothing in our tokenizers, and a
    # client that needs the end-of-text token gets the ids from the model's answers.
    return JSONResponse({"eos_token": None, "bos_token": None, "pad_token": None,
                         "chat_template": getattr(server.target, "chat_template", None),
                         "model_max_length": server.target.context_length})


async def health(request: Request) -> Response:
    lost = request.app.state.server.worker.lost
    if lost is not None:  # a load balancer stops sending requests here
        return target_lost(lost).response()
    return JSONResponse({"status": "ok"})


async def slot_action(request: Request) -> Response:
    """llama-server's `POST /slots/N?action=erase`: slot N forgets the prompt and answer
    its cache holds (cache_prompt), so that the next request there is scored from
    scratch; what benchmarks send between loads of the same prompts. The other actions
    (save, restore) are llama-server's slot files, which this server has none of. Its
    body may be empty, or give the `cache_salt` whose cache to erase: a slot filled
    under another salt is left as it is and reported as holding nothing."""
    server: Server = request.app.state.server
    # The body must be declared JSON even when empty: a cross-site page may POST
    # text/plain (or nothing) here without asking, and would erase a keyless server's slots.
    require_json(request)
    seq = request.path_params["slot"]
    action = request.query_params.get("action")
    if action != "erase":
        raise APIError(400, f"action {action!r}: this server's slots take only action=erase", param="action")
    body = await read_request(request, EraseRequest, server.settings.max_body_bytes, server.settings.body_timeout,
                              empty_ok=True)
    try:
        done = server.worker.erase(seq, body.cache_salt)
    except ValueError as e:
        raise APIError(400, str(e), param="id_slot") from e
    except TargetLost as e:
        raise target_lost(e) from e
    except ShuttingDown as e:
        raise shutting_down(e) from e
    try:
        erased = await asyncio.wrap_future(done)
    except SlotBusy as e:
        raise APIError(409, str(e), param="id_slot") from e
    except TargetLost as e:  # lost before the worker came to it
        raise target_lost(e) from e
    except ShuttingDown as e:  # stopped before the worker came to it
        raise shutting_down(e) from e
    return JSONResponse({"id_slot": seq, "n_erased": erased})


async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(request.app.state.server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

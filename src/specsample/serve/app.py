"""The app: routes, the doors (Host, API key), error handlers, and the worker's lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backends.base import Backend
from ..decoding.drafters import Drafter
from ..decoding.sampling import SamplingConfig
from ..policy.make import as_policy
from . import routes
from .connections import SHUT_DOWN
from .doors import CheckHost, RequireKey
from .errors import APIError
from .metrics import CountRequests, Metrics
from .settings import Server, Settings
from .worker import Worker


async def _api_error(request: Request, e: APIError) -> Response:
    return e.response()


async def _http_error(request: Request, e: HTTPException) -> Response:
    return APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()


async def _internal_error(request: Request, e: Exception) -> Response:
    return APIError(500, f"internal error: {type(e).__name__}", type="server_error").response()


def create_app(target: Backend, make_drafter: Callable[[SamplingConfig, Backend | None, str | None], Drafter | None],
               drafter_name: str | None, settings: Settings, draft: Backend | None = None) -> Starlette:
    """make_drafter(sampling, draft_slot, cache_salt) -> a Drafter or None
    (autoregressive), built per request on its slot of `draft` (None: the drafter's own
    model), drafting from text served under the request's cache_salt alone. For
    settings.parallel > 1, target and draft hold that many sequences."""
    if target.tokenizer is None:
        raise ValueError(f"{target.name} has no tokenizer; the server needs one")
    metrics = Metrics()
    # A shorthand ("auto", K) becomes the policy now, where the models are known: the loop takes it ready.
    policy = as_policy(settings.policy, target, draft, drafts=drafter_name is not None, parallel=settings.parallel)
    worker = Worker(target, settings.max_queue, policy, draft, settings.parallel, on_call=metrics.call,
                    prompt_cache_bytes=settings.prompt_cache_mib << 20)
    metrics.watch(worker)
    server = Server(target, make_drafter, drafter_name, settings, worker, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.tokenizing = anyio.CapacityLimiter(settings.tokenizer_threads)  # needs the running loop
        worker.start()
        try:
            yield {SHUT_DOWN: worker.shut_down}  # for connections.py, as uvicorn begins to shut down
        finally:
            worker.stop()

    paths = [
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/infill", routes.infill, methods=["POST"]),
        Route("/v1/models", routes.list_models, methods=["GET"]),
        Route("/tokenize", routes.tokenize, methods=["POST"]),
        Route("/detokenize", routes.detokenize, methods=["POST"]),
        Route("/tokenizer_info", routes.tokenizer_info, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/slots/{slot:int}", routes.slot_action, methods=["POST"]),
    ]
    app = Starlette(routes=paths, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    if settings.api_key is not None:
        app.add_middleware(RequireKey, key=settings.api_key)
    if settings.allowed_hosts is not None and "*" not in settings.allowed_hosts:
        app.add_middleware(CheckHost, allowed=settings.allowed_hosts)  # before the key: a rebound page learns nothing
    app.add_middleware(CountRequests, metrics=server.metrics, endpoints={r.path for r in paths})  # outermost
    app.state.server = server
    return app

"""`specsample serve`: parse, load the models, run uvicorn. The web stack is imported
only when the command runs."""

from __future__ import annotations

import argparse
import math
import os

from ..app.arguments import (UsageError, add_draft_length_arguments, add_model_arguments, add_trace_argument,
                             check_trace, model_options)
from ..app.assemble import assemble
from ..decoding.generate import VERIFIERS
from ..policy.calibrate import slots_that_pay
from ..policy.config import CALIBRATION
from ..policy.make import check_draft_length
from ..policy.trace import traced
from .prompt_cache import DEFAULT_MIB


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the models over an OpenAI-compatible HTTP API")
    add_model_arguments(p)
    add_draft_length_arguments(p)
    p.add_argument("--autoregressive", action="store_true", help="serve the target alone (the baseline)")
    p.add_argument("--verifier", choices=VERIFIERS, default="auto",
                   help="auto (default): coupled sampling for requests with a seed, so the seed fixes the text "
                        "whatever drafts it; block verification otherwise (block, rejection: that rule always; "
                        "docs/verification.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECSAMPLE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SPECSAMPLE_API_KEY; none if unset)")
    p.add_argument("--parallel", default="auto", metavar="N",
                   help="requests generated at once, in one target call per round (continuous batching); the rest "
                        "wait in the queue (default auto: as many as the target's measured cost curve says pay on "
                        "this machine, up to 8, said at start-up)")
    p.add_argument("--cache-prompt", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the start of a prompt that a slot's cache holds already (a chat's earlier turns, an "
                        "agent's instructions, an editor's file): only the rest is scored, as llama-server's "
                        "cache_prompt (on there too); a request's own cache_prompt field wins. With llama.cpp's "
                        "default kernels the reused rows were computed in other calls than a fresh prefill's, so a "
                        "greedy or seeded answer can part from the same request served fresh where two tokens nearly "
                        "tie; --no-cache-prompt scores every prompt whole, and with --batch-invariant reuse changes "
                        "nothing (default on)")
    p.add_argument("--prompt-cache-mib", type=int, default=DEFAULT_MIB, metavar="N",
                   help="host memory, in MiB, for the texts slots held before a request replaced them (a "
                        "conversation's, when a side request takes its slot): a later request that starts with more "
                        "of one than its slot holds gets it back and scores only the rest; least recently used "
                        f"first out; llama.cpp and hf targets (default {DEFAULT_MIB}; 0: none)")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait for the model; more get 429")
    p.add_argument("--queue-timeout", type=float, default=120.0, help="seconds a request may wait (default 120)")
    p.add_argument("--max-tokens", type=int, default=1024, help="cap on a request's max_tokens, and its default")
    p.add_argument("--max-request-tokens", type=int, default=None,
                   help="cap on one request's tokens: every choice's max_tokens (n x prompts) plus the prompt tokens "
                        "echo scores; more gets 400, as a request's choices hold one slot in turn and a large one "
                        "holds it long (default 8 x --max-tokens: eight full-length choices)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="cap on a request body (default 1 MiB)")
    add_door_arguments(p)
    add_trace_argument(p, " of every request (a batch's round: one line), flushed as it is written")
    p.set_defaults(func=cmd_serve)


def add_door_arguments(p) -> None:
    """Who may connect, and for how long (docs/serve.md, "Security")."""
    p.add_argument("--allowed-hosts", metavar="NAMES",
                   help="comma-separated Host names served besides loopback ones, '*' for any (default: on a "
                        "loopback bind, loopback names only; otherwise any)")
    p.add_argument("--max-connections", type=int, default=100,
                   help="open connections (and requests) at once; more get 503 (default 100)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds an idle connection stays open between requests, and one answered before its "
                        "request's body arrived (default 5)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a request's headers may take to arrive, from the connection's opening or its first "
                        "byte after an answer; then the connection is closed (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may take to arrive; then 408 (default 30)")
    p.add_argument("--send-timeout", type=float, default=30.0,
                   help="seconds a client may take to make room for what of an answer the socket buffers cannot hold "
                        "(a stream it stopped reading); then it is dropped (default 30)")


def door_settings(args) -> dict:
    """The door flags, checked, as Settings fields (the uvicorn ones are read by cmd_serve)."""
    from .doors import is_loopback
    from .settings import check_api_key
    try:
        check_api_key(args.api_key)  # before the models load
    except ValueError as e:
        raise UsageError(f"{e} (--api-key or $SPECSAMPLE_API_KEY)") from None
    for name in ("max_connections", "keep_alive_timeout", "header_timeout", "body_timeout", "send_timeout"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be positive and finite, got {value}")
    if args.allowed_hosts is not None:
        hosts = tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
        if not hosts:
            raise UsageError("--allowed-hosts is empty: name the hosts, or '*' for any")
        allowed = None if "*" in hosts else hosts
    else:
        allowed = () if is_loopback(args.host) else None  # a public bind is reached by names we cannot know
    return dict(allowed_hosts=allowed, body_timeout=args.body_timeout)


MOST_SLOTS = CALIBRATION.most_slots  # what --parallel auto loads the models for, and chooses among


def parse_parallel(value: str) -> int | None:
    """--parallel: a count of slots, or None for auto."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--parallel must be 'auto' or a number of requests, got {value!r}") from None
    if n < 1:
        raise UsageError(f"--parallel must be at least 1, got {n}")
    return n


def cmd_serve(args) -> int:
    for name in ("max_queue", "max_tokens", "max_body_bytes", "queue_timeout"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):  # NaN fails both; inf would wait forever
            raise UsageError(f"--{name.replace('_', '-')} must be positive and finite, got {value}")
    if args.prompt_cache_mib < 0:
        raise UsageError(f"--prompt-cache-mib must be at least 0 (0: none), got {args.prompt_cache_mib}")
    if args.max_request_tokens is not None and args.max_request_tokens < 1:
        raise UsageError(f"--max-request-tokens must be positive, got {args.max_request_tokens}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    check_draft_length(args.k, args.k_max)  # a bad -k fails now, not on every request
    check_trace(args)
    doors = door_settings(args)
    import uvicorn

    from ..backends.rpc import joined, parse_workers
    from . import connections, recovery
    from .app import create_app
    from .settings import SHUTDOWN_SECONDS, Settings

    parallel = parse_parallel(args.parallel)
    # Drafters are built per request, with the request's own sampling.
    models = assemble(model_options(args), drafting=not args.autoregressive, sequences=parallel or MOST_SLOTS)
    policy = models.policy(args.k, args.k_max, parallel or MOST_SLOTS)
    if parallel is None:
        costs = models.target_costs(MOST_SLOTS)
        parallel = min(slots_that_pay(costs, MOST_SLOTS), models.target.sequences)
        curve = ", ".join(f"{n}: {costs(n) / costs(1):.2f}x" for n in (2, 4, MOST_SLOTS))
        print(f"specsample serve: --parallel auto: {parallel} request(s) at once (a target call of n tokens costs, "
              f"against one: {curve})", flush=True)
    settings = Settings(model_name=models.target.name, parallel=parallel, policy=policy, api_key=args.api_key,
                        max_queue=args.max_queue, queue_timeout=args.queue_timeout, max_body_bytes=args.max_body_bytes,
                        max_tokens=args.max_tokens, max_request_tokens=args.max_request_tokens,
                        verifier=args.verifier, cache_prompt=args.cache_prompt,
                        prompt_cache_mib=args.prompt_cache_mib, **doors)
    app = create_app(models.target, models.drafter, models.drafter_name, settings, models.draft)
    options = dict(host=args.host, port=args.port, log_level="info", limit_concurrency=args.max_connections,
                   timeout_keep_alive=args.keep_alive_timeout, http=connections.protocol(args.header_timeout, args.send_timeout),
                   # uvicorn waits for every open connection by default, so a slow client or an idle
                   # socket held a SIGTERM off for good: requests get SHUTDOWN_SECONDS, then end
                   # with a 503 (connections.py); what still runs a second later is cancelled.
                   timeout_graceful_shutdown=SHUTDOWN_SECONDS + 1)
    workers = joined(parse_workers(args.target_rpc) if args.target_rpc else None,
                     parse_workers(args.draft_rpc) if getattr(args, "draft_rpc", None) else None)
    with traced(policy, args.trace):
        if workers is not None:  # on a socket that a reload after a lost worker keeps
            recovery.run(app, workers, **options)
        else:
            uvicorn.run(app, **options)
    return 0

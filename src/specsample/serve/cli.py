"""`specsample serve`: parse, load the models, run uvicorn. The web stack is imported
only when the command runs."""

from __future__ import annotations

import math
import os

from ..arguments import UsageError, add_draft_length_arguments, add_model_arguments, model_options
from ..assemble import assemble
from ..generate import VERIFIERS, GenerationConfig


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the models over an OpenAI-compatible HTTP API")
    add_model_arguments(p)
    add_draft_length_arguments(p)
    p.add_argument("--autoregressive", action="store_true", help="serve the target alone (the baseline)")
    p.add_argument("--verifier", choices=VERIFIERS, default="auto",
                   help="auto (default): coupled sampling for requests with a seed, so the seed fixes the text "
                        "whatever drafts it; rejection sampling otherwise")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECSAMPLE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SPECSAMPLE_API_KEY; none if unset)")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait for the model; more get 429")
    p.add_argument("--queue-timeout", type=float, default=120.0, help="seconds a request may wait (default 120)")
    p.add_argument("--max-tokens", type=int, default=1024, help="cap on a request's max_tokens, and its default")
    p.add_argument("--max-request-tokens", type=int, default=None,
                   help="cap on one request's tokens: every choice's max_tokens (n x prompts) plus the prompt tokens "
                        "echo scores; more gets 400, as one worker serves requests in turn and a large one holds "
                        "everyone else (default 8 x --max-tokens: eight full-length choices)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="cap on a request body (default 1 MiB)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    for name in ("max_queue", "max_tokens", "max_body_bytes", "queue_timeout"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):  # NaN fails both; inf would wait forever
            raise UsageError(f"--{name.replace('_', '-')} must be positive and finite, got {value}")
    if args.max_request_tokens is not None and args.max_request_tokens < 1:
        raise UsageError(f"--max-request-tokens must be positive, got {args.max_request_tokens}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    GenerationConfig(k=args.k, k_max=args.k_max)  # a bad -k fails now, not on every request
    import uvicorn

    from .app import create_app
    from .settings import Settings

    # Drafters are built per request, with the request's own sampling.
    models = assemble(model_options(args), drafting=not args.autoregressive)
    settings = Settings(model_name=models.target.name, k=args.k, k_max=args.k_max,
                        policy=models.policy(args.k, args.k_max), api_key=args.api_key, max_queue=args.max_queue,
                        queue_timeout=args.queue_timeout, max_body_bytes=args.max_body_bytes,
                        max_tokens=args.max_tokens, max_request_tokens=args.max_request_tokens,
                        verifier=args.verifier)
    app = create_app(models.target, models.drafter, models.drafter_name, settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0

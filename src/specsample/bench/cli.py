"""The `bench` subcommand: its parser, and the run its options ask for: per sequence
(sequence_run.py) or --serve (serve_run.py), with --neighbour's busy processes and
--rpc-delay-ms's relays around it. The options and what they name are options.py's."""

from __future__ import annotations

import contextlib
import sys

from ..app.arguments import UsageError
from . import sequence_run, serve_run
from .options import BENCH_CONTEXT, add_bench_arguments, resolve_options


def add_bench_parser(subparsers) -> None:
    b = subparsers.add_parser("bench", help="measure speedups, acceptance and parity against peers",
                              description="Reproduce the speculative sampling measurements on your models and hardware.")
    add_bench_arguments(b)
    b.set_defaults(func=cmd_bench, ctx_size=BENCH_CONTEXT)


def cmd_bench(args) -> int:
    args = resolve_options(args)
    with delayed_workers(args):
        return bench_command(args)


@contextlib.contextmanager
def delayed_workers(args):
    """--rpc-delay-ms: a relay in front of each --target-rpc and --draft-rpc worker for
    the whole run, its round trip measured and printed; the models then reach the
    workers through them."""
    delay = args.rpc_delay_ms
    if delay is None:
        yield
        return
    flags = [f for f in ("target_rpc", "draft_rpc") if getattr(args, f, None)]
    if not flags:
        raise UsageError("--rpc-delay-ms delays the messages to --target-rpc or --draft-rpc workers; none is named")
    if delay < 0:
        raise UsageError(f"--rpc-delay-ms must be >= 0, got {delay:g}")
    from ..backends.rpc import parse_workers
    from .relay import DelayRelay

    try:
        named = {f: parse_workers(getattr(args, f)).endpoints for f in flags}
    except ValueError as e:
        raise UsageError(str(e)) from None
    originals = {f: getattr(args, f) for f in flags}
    with contextlib.ExitStack() as stack:
        relays = {e: stack.enter_context(DelayRelay(e, delay / 1000)) for e in dict.fromkeys(sum(named.values(), ()))}
        print(f"specsample: bench: the workers through relays delaying each message {delay:g} ms one way "
              f"({', '.join(f'{w} via {r.endpoint}' for w, r in relays.items())})", file=sys.stderr, flush=True)
        for f, endpoints in named.items():
            setattr(args, f, ",".join(relays[e].endpoint for e in endpoints))
        try:
            yield
        finally:
            for f, value in originals.items():
                setattr(args, f, value)


def bench_command(args) -> int:
    from .neighbour import busy_neighbours

    if args.neighbour < 0:
        raise UsageError(f"--neighbour must be >= 0, got {args.neighbour}")
    with busy_neighbours(args.neighbour):
        return serve_run.run(args) if args.serve else sequence_run.run(args)

"""The `bench` subcommand: its parser, and the run its options ask for: per sequence
(sequence_run.py) or --serve (serve_run.py). The options and what they name are
options.py's; research options (relays, neighbours, budgets, parity, peers) are
benchmarks/bench.py's, on top of these."""

from __future__ import annotations

from . import sequence_run, serve_run
from .options import BENCH_CONTEXT, add_bench_arguments, resolve_options


def add_bench_parser(subparsers) -> None:
    b = subparsers.add_parser("bench", help="measure speedups against plain decoding, or endpoints under load",
                              description="Time speculative decoding on your models, hardware and prompts.")
    add_bench_arguments(b)
    b.set_defaults(func=cmd_bench, ctx_size=BENCH_CONTEXT)


def cmd_bench(args) -> int:
    args = resolve_options(args)
    return serve_run.run(args) if args.serve else sequence_run.run(args)

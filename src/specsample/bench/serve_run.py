"""The serving benchmark (`specsample bench serve --url`, or `bench --serve --url`):
each endpoint --url names loaded by concurrent streaming clients, then serve.md and
its records."""

from __future__ import annotations

import os
import sys
from functools import partial

from ..app.arguments import UsageError
from .endpoints import check_tasks, parse_endpoints, run_endpoints
from .load import Load
from .options import bench_config, command_line, machine_line, serve_clients
from .report import keep_partial, start_partial, write_serve_report
from .serve_summary import serve_sections
from .tasks import load_task

API_KEY_VARIABLE = "SPECSAMPLE_API_KEY"


def run(args) -> int:
    """`bench serve --url`: the same loads against endpoints already running; no model
    is loaded here, the prompts go out as text (endpoints.py). Servers started by the
    bench itself are the research bench's (python -m benchmarks.bench --serve)."""
    if not args.url:
        raise UsageError("bench serve measures the endpoints you run: give --url [NAME=]URL for each (servers the bench "
                         "starts itself: python -m benchmarks.bench --serve, from the checkout)")
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)
    endpoints = parse_endpoints(args.url)
    baseline = args.baseline or endpoints[0].name
    if baseline not in [e.name for e in endpoints]:
        raise UsageError(f"--baseline {baseline!r} is none of the endpoints: {', '.join(e.name for e in endpoints)}")
    clients = serve_clients(args)
    prompts = {t: load_task(t, config.prompt_count(t)) for t in config.tasks}
    check_tasks(prompts)
    start_partial(args.out)
    load = Load(prompts, config.settings, clients, config.new_tokens, args.repeats)
    records, notes = run_endpoints(endpoints, load, api_key=args.api_key or os.environ.get(API_KEY_VARIABLE, "none"),
                                   model_name=args.model_name, keep=partial(keep_partial, args.out, None))
    machine = "the client's (each endpoint runs on its own): " + machine_line("none here", args, load_at_start)
    sections, printed = serve_sections(records, baseline=baseline)
    write_serve_report(args.out, records, sections, command=command_line(args), machine=machine, notes=notes)
    print(printed)
    print(f"specsample: wrote {args.out}/serve.jsonl and serve.md", file=sys.stderr)
    return 0

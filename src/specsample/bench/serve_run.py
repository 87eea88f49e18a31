"""The serving benchmark (`specsample bench serve`, or `bench --serve`): each server
started in turn, or each endpoint --url names, loaded by concurrent streaming clients,
then serve.md and its records."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial

from ..app.arguments import UsageError, model_options
from ..app.assemble import assemble
from .endpoints import check_tasks, parse_endpoints, run_endpoints
from .options import (bench_config, check_remote_modes, command_line, draft_lengths, is_llamacpp, machine_line,
                      names, serve_argv, serve_axes, start_server, target_file, target_label, target_types)
from .report import keep_partial, start_partial, write_serve_report
from .runner import prepare
from .serve_summary import serve_sections
from .serving import DEFAULT_SERVE_FAMILIES, SERVE_FAMILIES, Load, run_serving, served_modes
from .tasks import TASKS, load_task

API_KEY_VARIABLE = "SPECSAMPLE_API_KEY"


def run(args) -> int:
    """Each server in turn under each --clients count of streaming clients, then serve.md."""
    if args.url:
        return run_urls(args)
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)
    if args.trace is not None:
        raise UsageError("bench --serve starts its servers in processes of their own: trace one with specsample serve "
                         "--trace FILE")
    if any(TASKS[t].held for t in config.tasks):
        raise UsageError("--serve sends plain requests: run tasks held to a grammar (structured, tools) without --serve")
    families = DEFAULT_SERVE_FAMILIES if args.modes == "auto" else names(args.modes, SERVE_FAMILIES, "--serve mode")
    check_remote_modes(args, families)
    ks, peer_ks = draft_lengths(args)
    clients, slots = serve_axes(args)
    types = target_types(args)
    # The first type's target, for its tokenizer (prompts go out as token ids) and file.
    target = assemble(replace(model_options(args), target_quant=types[0][1]), drafting=False).target
    prompts = prepare(target, config.tasks, {t: config.prompt_count(t) for t in config.tasks})
    files = [getattr(target, "path", None) if is_llamacpp(target) else None]
    files += [target_file(args, quant) if files[0] else None for _, quant in types[1:]]
    labels = [label or target_label(target, args) for label, _ in types]
    # Each slot holds one request: its context fits the longest prompt and answer.
    n_ctx = max(len(p.ids) for group in prompts.values() for p in group)
    n_ctx += max(config.new_tokens(t) for t in config.tasks) + max(ks + peer_ks) + 16
    del target  # the servers load their own copies; this process only sends requests

    load = Load(prompts, config.settings, clients, config.new_tokens, args.repeats)
    records, notes, splits = [], [], []
    start_partial(args.out)
    for (_, quant), label, gguf in zip(types, labels, files):
        if len(types) > 1:
            print(f"specsample: target {label}", file=sys.stderr, flush=True)
        llama_server = partial(start_server, args, ["llamacpp-spec"], n_ctx, max(peer_ks), gguf)
        got, run_notes, got_splits = run_serving(served_modes(families, ks, peer_ks), load, slots,
                                                 model_argv=serve_argv(args, quant, n_ctx),
                                                 llama_server=llama_server, keep=partial(keep_partial, args.out, label))
        records += [replace(r, target=label) for r in got]
        splits += [replace(s, target=label) for s in got_splits]
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
    machine = machine_line("gguf" if files[0] else args.dtype, args, load_at_start)
    sections, printed = serve_sections(records, splits)
    write_serve_report(args.out, records, sections, command=command_line(), machine=machine, notes=notes, splits=splits)
    print(printed)
    print(f"specsample: wrote {args.out}/serve.jsonl, calls.jsonl and serve.md", file=sys.stderr)
    return 0


def run_urls(args) -> int:
    """`bench serve --url`: the same loads against endpoints already running; no model
    is loaded here, the prompts go out as text (endpoints.py)."""
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)
    endpoints = parse_endpoints(args.url)
    baseline = args.baseline or endpoints[0].name
    if baseline not in [e.name for e in endpoints]:
        raise UsageError(f"--baseline {baseline!r} is none of the endpoints: {', '.join(e.name for e in endpoints)}")
    clients, _ = serve_axes(args)
    prompts = {t: load_task(t, config.prompt_count(t)) for t in config.tasks}
    check_tasks(prompts)
    start_partial(args.out)
    load = Load(prompts, config.settings, clients, config.new_tokens, args.repeats)
    records, notes = run_endpoints(endpoints, load, api_key=args.api_key or os.environ.get(API_KEY_VARIABLE, "none"),
                                   model_name=args.model_name, keep=partial(keep_partial, args.out, None))
    machine = "the client's (each endpoint runs on its own): " + machine_line("none here", args, load_at_start)
    sections, printed = serve_sections(records, baseline=baseline)
    write_serve_report(args.out, records, sections, command=command_line(), machine=machine, notes=notes)
    print(printed)
    print(f"specsample: wrote {args.out}/serve.jsonl and serve.md", file=sys.stderr)
    return 0

"""`python -m benchmarks.bench --serve`: each server started in turn (serving.py) under
each --clients count of streaming clients, then serve.md with, beside the bench's load
tables, our servers against llama-server and against one slot, and where our servers'
time went (calls.py)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial

from specsample.app.arguments import UsageError, model_options
from specsample.app.assemble import assemble
from specsample.bench.load import Load, LoadSummary
from specsample.bench.options import (bench_config, command_line, counts, draft_lengths, is_llamacpp, machine_line,
                                      names, serve_clients, target_label)
from specsample.bench.records import ServedRecord
from specsample.bench.report import keep_partial, start_partial, write_records, write_serve_report
from specsample.bench.runner import prepare
from specsample.bench.serve_summary import RATES, paired, pooled, serve_sections, spread, summaries
from specsample.bench.tables import cell, markdown_table
from specsample.bench.tasks import TASKS

from .calls import SPLIT_NOTE, split_table
from .native import start_server
from .peers import check_remote_modes
from .targets import target_types
from .serving import (DEFAULT_SERVE_FAMILIES, SERVE_FAMILIES, run_serving, serve_argv, served_modes, target_file,
                      traced_path)


def run(args) -> int:
    """Each server in turn under each --clients count of streaming clients, then serve.md."""
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)
    if any(TASKS[t].held for t in config.tasks):
        raise UsageError("--serve sends plain requests: run tasks held to a grammar (structured, tools) without --serve")
    families = DEFAULT_SERVE_FAMILIES if args.modes == "auto" else names(args.modes, SERVE_FAMILIES, "--serve mode")
    check_remote_modes(args, families)
    ks, peer_ks = draft_lengths(args)
    clients, slots = serve_clients(args), counts(args.slots, "--slots")
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
            print(f"benchmarks: target {label}", file=sys.stderr, flush=True)
        llama_server = partial(start_server, args, ["llamacpp-spec"], n_ctx, max(peer_ks), gguf)
        got, run_notes, got_splits = run_serving(served_modes(families, ks, peer_ks), load, slots,
                                                 model_argv=serve_argv(args, quant, n_ctx),
                                                 llama_server=llama_server, keep=partial(keep_partial, args.out, label),
                                                 trace=_traced(args.trace, label, len(types) > 1))
        records += [replace(r, target=label) for r in got]
        splits += [replace(s, target=label) for s in got_splits]
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
    machine = machine_line("gguf" if files[0] else args.dtype, args, load_at_start)
    sections, printed = started_sections(records, splits)
    write_serve_report(args.out, records, sections, command=command_line(args), machine=machine, notes=notes)
    if splits:  # calls.CallSplit, a line per load of our servers
        write_records(args.out / "calls.jsonl", splits)
    print(printed)
    print(f"benchmarks: wrote {args.out}/serve.jsonl, calls.jsonl and serve.md", file=sys.stderr)
    return 0


def _traced(trace, label: str, several: bool):
    """--trace for one target's servers (its folder made now: they open their files as
    they start): its name with the target's label where several run."""
    if trace is None:
        return None
    trace.parent.mkdir(parents=True, exist_ok=True)
    return traced_path(trace, label) if several else trace


def started_sections(records: list[ServedRecord], splits: list = ()) -> tuple[list[str], str]:
    """serve.md's sections for servers started here: our servers against the peers
    first, then the bench's load tables (serve_summary.serve_sections), then, with
    `splits`, where our servers' time went; and what the command line prints."""
    parts, printed = serve_sections(records)
    peers = peer_table(records)
    if peers:
        parts = ["## Summary: against llama-server, and against one slot", PEER_NOTE, peers] + parts
        printed = peers + "\n\n" + printed
    if splits:
        parts += ["## Where our servers' time went", SPLIT_NOTE, split_table(list(splits))]
    return parts, printed


def peer_table(records: list[ServedRecord]) -> str | None:
    """Each of our servers over llama-server -np N, over llama-server -np N -md at its best
    K, and over itself with one slot, under the same load (target, task, setting, slot
    count N, clients): tokens/s / decode tokens/s. None when there is nothing to compare."""
    families, ks = {r.mode: r.family for r in records}, {r.mode: r.k for r in records}
    rows = [["target", "task", "setting", "slots", "clients", "server", "÷ llama-server -np N",
             "÷ -np N -md (best K)", "÷ same server, 1 slot"]]
    for target in dict.fromkeys(r.target for r in records):
        by_key = summaries([r for r in records if r.target == target])
        for load in dict.fromkeys(key[:4] for key in by_key):
            task, setting, slots, clients = load
            here = {key[4]: s for key, s in by_key.items() if key[:4] == load}
            plain = next((s for mode, s in here.items() if families[mode] == "llamacpp-server"), None)
            spec = max((mode for mode in here if families[mode] == "llamacpp-spec"), default=None,
                       key=lambda mode: pooled(here[mode]).decode_tokens_per_second or 0.0)
            for mode, s in here.items():
                if families[mode].startswith("llamacpp"):
                    continue
                alone = by_key.get((task, setting, 1, clients, mode)) if slots != 1 else None
                versus = [_both(s, plain), _both(s, here.get(spec)), _both(s, alone)]
                if spec is not None and versus[1] != "–":
                    versus[1] += f" (K={ks[spec]})"
                if any(v != "–" for v in versus):
                    rows.append([cell(target, ""), task, setting, str(slots), str(clients), mode, *versus])
    return markdown_table(rows) if len(rows) > 1 else None


def _both(runs: list[LoadSummary], base: list[LoadSummary] | None) -> str:
    """"a / b": runs over base in tokens/s and in decode tokens/s, repeat by repeat
    (the median, and the range where there are several)."""
    if base is None:
        return "–"
    return " / ".join(spread(paired(runs, base, RATES[name][0]), ".2f") for name in ("tokens/s", "decode tokens/s"))


PEER_NOTE = (
    "Each of our servers over a peer under the same load (target file, task, setting, slots N and clients), as "
    "tokens/s (prefill included) / decode tokens/s (prefill left out; both defined under the load table): "
    "llama-server -np N is llama.cpp's plain continuous batching, -np N -md its speculation with the same draft file "
    "(the K of --peer-k with the best decode tokens/s), and 1 slot is the same server of ours with --parallel 1, "
    "decoding one request at a time, under the same clients. Above 1 we are faster. With --repeats, the median of "
    "the repeats' ratios, each repeat's against the peer's same repeat, their range in brackets."
)

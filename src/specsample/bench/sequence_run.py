"""The per-sequence benchmark (`specsample bench`): the models loaded once, each target
type in turn with its cost curve, every mode's runs interleaved, then the report."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial

from ..app.arguments import UsageError, model_options
from ..app.assemble import assemble
from .bandwidth import measure_read_bandwidth, weight_bytes
from .budget import TaskLoad, estimate_seconds, format_duration, trim_to_budget
from .costs import measure_cost_curve
from .modes import FAMILIES, OurMode, build_modes
from ..policy.trace import Trace
from .options import (bench_config, check_remote_modes, command_line, draft_lengths, is_llamacpp, machine_line,
                      names, start_server, target_label, target_types, threads)
from .records import Record
from .report import keep_partial, start_partial, write_report
from .runner import prepare, run_bench, run_parity, total_steps
from .servers import ServerUnavailable
from .summary import TargetRun


def run(args) -> int:
    """The per-sequence benchmark: every mode on every target type, then the report."""
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)  # validates before the slow model loads
    families = list(FAMILIES) if args.modes == "auto" else names(args.modes, FAMILIES, "mode")
    check_remote_modes(args, families)
    if args.trace is not None and "spec-auto" not in families:
        raise UsageError("--trace follows the spec-auto mode's decisions: run it (--modes)")
    ks, peer_ks = draft_lengths(args)
    types = target_types(args)
    options = model_options(args)
    models = assemble(replace(options, target_quant=types[0][1]), drafting=args.draft != "ngram")
    draft, target = models.draft, models.target
    del models  # each target type is loaded in turn; only the draft stays
    read_bandwidth = measure_read_bandwidth(threads(args))
    runs, notes = [], []
    engine = "gguf" if is_llamacpp(target) else args.dtype
    start_partial(args.out)
    trace = Trace(args.trace) if args.trace is not None else None
    for i, (label, quant) in enumerate(types):
        if target is None:
            target = assemble(replace(options, target_quant=quant), drafting=False).target
        label = label or target_label(target, args)
        if len(types) > 1:
            print(f"specsample: target {label}", file=sys.stderr, flush=True)
        kept = partial(keep_partial, args.out, label)
        if trace is not None:
            trace.tag = label
        records, curve, run_notes = _bench_target(args, config, families, ks, peer_ks, target, draft, i == 0, kept,
                                                  trace)
        gguf = getattr(target, "path", None)
        runs.append(TargetRun(label, [replace(r, target=label) for r in records], curve, weight_bytes(target, gguf)))
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
        target = None  # free it before the next type loads
    if trace is not None:
        trace.close()
    machine = machine_line(engine, args, load_at_start)
    table = write_report(args.out, runs, command=command_line(), machine=machine, notes=notes, plots=args.plots,
                         read_bandwidth=read_bandwidth)
    print(table)
    print(f"specsample: wrote {args.out}/records.jsonl and {args.out}/summary.md", file=sys.stderr)
    return 0


def _bench_target(args, config, families, ks, peer_ks, target, draft, parity: bool,
                  keep, trace=None) -> tuple[list[Record], object, list[str]]:
    """Every mode on one target type: its cost curve, then the interleaved runs."""
    counts = {t: config.prompt_count(t) for t in config.tasks}
    prompts = prepare(target, config.tasks, counts)
    parity_count = config.parity_prompts if parity else 0
    parity_prompts = prepare(target, ("humaneval",), {"humaneval": parity_count})["humaneval"] if parity_count else []
    longest = max(len(p.ids) for group in list(prompts.values()) + [parity_prompts] for p in group)
    most_tokens = max(config.new_tokens(t) for t in config.tasks + ("humaneval",))
    n_ctx = longest + most_tokens + max(ks + peer_ks + [args.k_max]) + 16
    if n_ctx > target.context_length:  # before the cost curve's minute, not at the first long prompt
        raise UsageError(f"these prompts and answers need {n_ctx} tokens of context, and the target was loaded with "
                         f"{target.context_length}: give --ctx-size {n_ctx} (or a smaller --max-new-tokens)")
    curve = _cost_curve(target, draft, prompts, max(ks) + 1 if "spec" in families else 1, args.cost_reps)
    gguf = getattr(target, "path", None) if is_llamacpp(target) else None
    try:
        server, no_server = start_server(args, families, n_ctx, max(ks + peer_ks), gguf, loaded_draft=draft), None
    except ServerUnavailable as e:
        server, no_server = None, str(e)
    try:
        modes, skipped = build_modes(families, ks, peer_ks, target, draft, target_gguf=gguf, ngram_max=args.ngram_max,
                                     n_ctx=n_ctx, k_max=args.k_max, server=server, no_server=no_server)
        notes = [f"not run: {n}" for n in skipped]
        for mode in modes if trace is not None else ():
            if mode.family == "spec-auto":  # the one mode whose planner decides (the others' K is fixed)
                mode.policy.planner.trace = trace
        parity_modes = _parity_modes(target, draft, args.parity_k) if parity_prompts else []
        if parity_count and not parity_modes:
            notes.append("parity: skipped, no draft model")
        prompts, parity_prompts = _plan(args, config, curve, modes, prompts, parity_prompts, len(parity_modes), notes)
        records = _run(modes, prompts, config, parity_modes, parity_prompts, keep)
    finally:
        if server is not None:
            server.close()
    return records, curve, notes


def _cost_curve(target, draft, prompts, max_tokens: int, reps: int):
    """The cost curve when spec runs; else the 1-token point alone (the estimate's rate)."""
    context = next(iter(prompts.values()))[0].ids
    print(f"specsample: measuring the cost curve at {len(context)} tokens of context", file=sys.stderr)
    return measure_cost_curve(target, draft if max_tokens > 1 else None, context, max_tokens, reps=reps)


def _plan(args, config, curve, modes, prompts, parity_prompts, n_parity_modes: int, notes: list[str]):
    """Print the time estimate; trim prompts to --budget-minutes."""
    cells = {task: TaskLoad(len(group), len(modes) * len(config.settings), config.new_tokens(task),
                        sum(len(p.ids) for p in group) / len(group)) for task, group in prompts.items()}
    if parity_prompts:
        cells["parity"] = TaskLoad(len(parity_prompts), n_parity_modes, config.new_tokens("humaneval"),
                               sum(len(p.ids) for p in parity_prompts) / len(parity_prompts))
    rates = (curve.target_cost[0], curve.prefill_seconds / curve.context_tokens)
    estimate = estimate_seconds(cells, *rates)
    print(f"specsample: estimated at most {format_duration(estimate)} ({len(modes)} modes; every answer priced at its "
          f"task's token limit and the autoregressive rate of {1 / rates[0]:.1f} tokens/s)", file=sys.stderr)
    if args.budget_minutes and estimate > 60 * args.budget_minutes:
        kept = trim_to_budget(cells, *rates, 60 * args.budget_minutes)
        prompts = {task: group[: kept[task]] for task, group in prompts.items()}
        parity_prompts = parity_prompts[: kept.get("parity", 0)]
        trimmed = ", ".join(f"{task} {cells[task].prompts}->{n}" for task, n in kept.items())
        notes.append(f"--budget-minutes {args.budget_minutes:g} trimmed prompts: {trimmed}")
        print(f"specsample: trimmed to fit {args.budget_minutes:g} minutes: {trimmed}; now at most "
              f"{format_duration(estimate_seconds({t: replace(c, prompts=kept[t]) for t, c in cells.items()}, *rates))}",
              file=sys.stderr)
    return prompts, parity_prompts


def _run(modes, prompts, config, parity_modes, parity_prompts, keep) -> list[Record]:
    from tqdm import tqdm

    steps = total_steps(modes, prompts, config, len(parity_modes), len(parity_prompts))
    with tqdm(total=steps, file=sys.stderr, desc="bench", unit="gen") as progress:
        records = run_bench(modes, prompts, config, progress, keep)
        records += run_parity(parity_modes, parity_prompts, config, progress) if parity_modes else []
    return records


def _parity_modes(target, draft, k: int) -> list:
    if draft is None:
        return []
    return [OurMode("ar", "ar", target), OurMode(f"spec-k{k}", "spec", target, k, draft)]

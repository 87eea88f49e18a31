"""The per-sequence benchmark (`specsample bench`): the models loaded once, each target
type in turn, every mode's runs interleaved, then the report.

A research run (benchmarks/bench.py) passes `research`, an object with:
    families                        the mode families it adds to FAMILIES (its peers)
    target_types() -> [(label, --target-quant value)]
                                    the target types to run in turn (--target-quants)
    overview(runs) -> str | None    the summary's table by target type
    check(families)                 refuses the families it cannot run with these options
    modes(families, peer_ks, target, draft, target_gguf=, ngram_max=, n_ctx=, k_max=)
                                    (modes, notes on those that cannot run) of its families,
                                    held until after() (a server it starts: closed there)
    before(target, draft, prompts, modes, config, notes) -> prompts
                                    before a target type's runs (its cost curve; trimming)
    after(label, target, draft, records) -> (records, sections)
                                    after them: more records (parity), and sections for
                                    that target's part of summary.md
    files() -> {name: text}         more files for the output folder
    notes                           lines for the report's notes
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial

from ..app.arguments import UsageError, model_options
from ..app.assemble import assemble
from .modes import AUTO_FAMILIES, FAMILIES, build_modes
from ..policy.trace import Trace
from .options import bench_config, command_line, draft_lengths, is_llamacpp, machine_line, names, target_label
from .records import Record
from .report import keep_partial, start_partial, write_report
from .runner import prepare, run_bench, total_steps
from .summary import TargetRun


def run(args, research=None) -> int:
    """The per-sequence benchmark: every mode on every target type, then the report."""
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)  # validates before the slow model loads
    known = (AUTO_FAMILIES if args.modes == "auto" else FAMILIES) + (research.families if research else ())
    families = list(known) if args.modes == "auto" else names(args.modes, known, "mode")
    if research:
        research.check(families)
    if args.trace is not None and "spec-auto" not in families:
        raise UsageError("--trace follows the spec-auto mode's decisions: run it (--modes)")
    ks, peer_ks = draft_lengths(args)
    types = research.target_types() if research else [(None, args.target_quant)]
    options = model_options(args)
    models = assemble(replace(options, target_quant=types[0][1]), drafting=args.draft != "ngram")
    draft, target, overlap = models.draft, models.target, models.overlap  # overlap: the pair's placement, every type's
    del models  # each target type is loaded in turn; only the draft stays
    runs, notes = [], []
    engine = "gguf" if is_llamacpp(target) else args.dtype
    start_partial(args.out)
    trace = Trace(args.trace) if args.trace is not None else None
    for label, quant in types:
        if target is None:
            target = assemble(replace(options, target_quant=quant), drafting=False).target
        label = label or target_label(target, args)
        if len(types) > 1:
            print(f"specsample: target {label}", file=sys.stderr, flush=True)
        kept = partial(keep_partial, args.out, label)
        if trace is not None:
            trace.tag = label
        records, run_notes = _bench_target(args, config, families, ks, peer_ks, target, draft, kept, research, trace,
                                           overlap)
        sections = []
        if research:
            records, sections = research.after(label, target, draft, records)
        runs.append(TargetRun(label, [replace(r, target=label) for r in records], sections))
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
        target = None  # free it before the next type loads
    if trace is not None:
        trace.close()
    machine = machine_line(engine, args, load_at_start)
    table = write_report(args.out, runs, command=command_line(args), machine=machine,
                         notes=notes + (research.notes if research else []),
                         extra=research.files() if research else None,
                         overview=research.overview(runs) if research else None)
    print(table)
    print(f"specsample: wrote {args.out}/records.jsonl and {args.out}/summary.md", file=sys.stderr)
    return 0


def _bench_target(args, config, families, ks, peer_ks, target, draft, keep, research,
                  trace=None, overlap: bool = False) -> tuple[list[Record], list[str]]:
    """Every mode on one target type, its runs interleaved."""
    counts = {t: config.prompt_count(t) for t in config.tasks}
    prompts = prepare(target, config.tasks, counts)
    longest = max(len(p.ids) for group in prompts.values() for p in group)
    most_tokens = max(config.new_tokens(t) for t in config.tasks + ("humaneval",))
    n_ctx = longest + most_tokens + max(ks + peer_ks + [args.k_max]) + 16
    if n_ctx > target.context_length:  # before any slow step, not at the first long prompt
        raise UsageError(f"these prompts and answers need {n_ctx} tokens of context, and the target was loaded with "
                         f"{target.context_length}: give --ctx-size {n_ctx} (or a smaller --max-new-tokens)")
    gguf = getattr(target, "path", None) if is_llamacpp(target) else None
    modes, skipped = build_modes([f for f in families if f in FAMILIES], ks, peer_ks, target, draft,
                                 ngram_max=args.ngram_max, k_max=args.k_max, verifier=args.verifier, overlap=overlap)
    if research:
        more, not_run = research.modes([f for f in families if f not in FAMILIES], peer_ks, target, draft,
                                       target_gguf=gguf, ngram_max=args.ngram_max, n_ctx=n_ctx,
                                       k_max=max(ks + peer_ks))
        modes, skipped = modes + more, skipped + not_run
    notes = [f"not run: {n}" for n in skipped]
    for mode in modes if trace is not None else ():
        if mode.family == "spec-auto":  # the one mode whose planner decides (the others' K is fixed)
            mode.policy.planner.trace = trace
    if research:
        prompts = research.before(target, draft, prompts, modes, config, notes)
    records = _run(modes, prompts, config, keep)
    return records, notes


def _run(modes, prompts, config, keep) -> list[Record]:
    from tqdm import tqdm

    with tqdm(total=total_steps(modes, prompts, config), file=sys.stderr, desc="bench", unit="gen") as progress:
        return run_bench(modes, prompts, config, progress, keep)

"""Writing a benchmark's results: records.jsonl, cost_curve.json, summary.md and plots,
for one target type or several side by side."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .bandwidth import read_ceiling
from .costs import CostCurve
from .parity import pass_rates
from .plots import write_plots
from .report import (CONTROLLER_NOTE, PARITY_NOTE, PREDICTION_NOTE, STRUCTURED_NOTE, THROUGHPUT_NOTE, bandwidth_note,
                     controller_table, cost_table, greedy_identity, main_table, markdown_table, parity_table,
                     prediction_section, predictions_by_group, structured_table, write_records)
from .rounds import ROUND_NOTE, round_time_table
from .stats import summarise
from .targets import by_target_section


@dataclass
class TargetRun:
    """One target encoding's share of a run: its records, cost curve and weight bytes."""

    label: str  # the target's weight type ("q4_k_m", "bf16") or dtype
    records: list[dict]
    curve: CostCurve | None = None
    weight_bytes: int | None = None


def write_report(out: Path, runs: list[TargetRun], *, command: str, machine: str, notes: list[str] = (),
                 plots: bool = True, read_bandwidth: float | None = None) -> str:
    """records.jsonl, cost_curve.json, summary.md and plots in `out`; returns the
    tables to print. Several target types get an overview by type, then a section each."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "records.jsonl", [r for run in runs for r in run.records])
    curves = {run.label: asdict(run.curve) for run in runs if run.curve is not None}
    if curves:
        (out / "cost_curve.json").write_text(json.dumps(curves) + "\n")
    parts = ["# specsample bench", f"Command: `{command}`", f"Machine: {machine}"]
    printed = []
    if len(runs) > 1:
        overview = by_target_section(runs, read_bandwidth)
        parts += ["## By target type", overview]
        printed.append(overview)
    for run in runs:
        suffix = f"-{run.label}" if len(runs) > 1 else ""
        sections, table = run_sections(out, run, read_bandwidth, plots, suffix)
        if len(runs) > 1:
            parts += [f"## Target {run.label}"] + ["#" + p if p.startswith("## ") else p for p in sections]
            printed.append(f"Target {run.label}:\n{table}")
        else:
            parts += sections
            printed.append(table)
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    (out / "summary.md").write_text("\n\n".join(parts) + "\n")
    return "\n\n".join(printed)


def run_sections(out: Path, run: TargetRun, read_bandwidth: float | None, plots: bool,
                 suffix: str = "") -> tuple[list[str], str]:
    """The summary's sections for one target type, and its main table."""

    curve = run.curve
    main = [r for r in run.records if r["phase"] == "main"]
    summaries = summarise(main)
    ceiling = read_ceiling(read_bandwidth, [s.decode_tokens_per_second for s in summaries
                                            if s.mode == "ar" and s.decode_tokens_per_second], run.weight_bytes)
    predictions = predictions_by_group(summaries, curve)
    table = main_table(summaries, run.weight_bytes, ceiling)
    parts = [f"## Throughput and latency (target {run.label})",
             THROUGHPUT_NOTE + bandwidth_note(run.weight_bytes, read_bandwidth, ceiling), table]
    parts += ["## Greedy exactness", markdown_table(greedy_identity(main))]
    structured = structured_table(main)
    if structured:
        parts += ["## Structured output", STRUCTURED_NOTE, structured]
    rounds = round_time_table(main)
    if rounds:
        parts += ["## Where a round's time goes", ROUND_NOTE, rounds]
    choices = controller_table(main)
    if choices:
        parts += ["## What -k auto chose", CONTROLLER_NOTE, choices]
    if curve is not None:
        parts += ["## Cost curve", f"Median of {curve.reps} calls after a warm-up, at a cache of "
                  f"{curve.context_tokens} tokens, with both models loaded and taking turns (one draft step, then "
                  "one target call) as in a speculative round; then 1-token target calls back to back, as plain "
                  "decoding runs, and draft steps back to back, as a round's later steps run.", cost_table(curve)]
    if predictions:
        parts += ["## Analytic prediction", PREDICTION_NOTE, prediction_section(summaries, predictions)]
    rates = pass_rates([r for r in run.records if r["phase"] == "parity"])
    if rates:
        parts += ["## HumanEval parity (pass@1)", PARITY_NOTE, parity_table(rates)]
    if plots:
        latencies: dict[str, list[float]] = {}
        for r in main:
            latencies.setdefault(r["mode"], []).append(r["latency_seconds"])
        images = write_plots(out, summaries, predictions, latencies, suffix)
        parts += ["## Plots", "\n".join(f"![{p.stem}]({p.name})" for p in images)]
    return parts, table

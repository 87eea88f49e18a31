"""The sections of summary.md for one target type: tables, notes and figures, built
from that type's records and cost curve (report.py lays out and writes the file)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .bandwidth import read_ceiling
from .costs import CostCurve
from .fim_task import held_out_bodies
from .parity import pass_rates
from .plots import figures
from .records import Record
from .stats import summarise
from .tables import (CONTROLLER_NOTE, FIM_NOTE, PARITY_NOTE, PREDICTION_NOTE, ROUND_NOTE, STRUCTURED_NOTE,
                     THROUGHPUT_NOTE, bandwidth_note, controller_table, cost_table, fim_table, greedy_identity,
                     main_table, markdown_table, parity_table, prediction_section, predictions_by_group,
                     round_time_table, structured_table)


@dataclass
class TargetRun:
    """One target encoding's share of a run: its records, cost curve and weight bytes."""

    label: str  # the target's weight type ("q4_k_m", "bf16") or dtype
    records: list[Record]
    curve: CostCurve | None = None
    weight_bytes: int | None = None


@dataclass
class RunSections:
    sections: list[str]  # markdown blocks, "## " headings among them
    table: str  # the main table, which the command line prints
    figures: dict = field(default_factory=dict)  # name -> matplotlib Figure, drawn when plots were asked for


def run_sections(run: TargetRun, read_bandwidth: float | None, plots: bool) -> RunSections:
    """The summary's sections for one target type, its main table and its figures."""
    curve = run.curve
    main = [r for r in run.records if r.phase == "main"]
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
    middles = fim_table(main, held_out_bodies()) if any(r.task == "fim" for r in main) else None
    if middles:
        parts += ["## Fill-in-the-middle", FIM_NOTE, middles]
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
    rates = pass_rates([r for r in run.records if r.phase == "parity"])
    if rates:
        parts += ["## HumanEval parity (pass@1)", PARITY_NOTE, parity_table(rates)]
    if not plots:
        return RunSections(parts, table)
    latencies: dict[str, list[float]] = {}
    for r in main:
        latencies.setdefault(r.mode, []).append(r.latency_seconds)
    return RunSections(parts, table, figures(summaries, predictions, latencies))

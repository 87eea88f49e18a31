"""The sections of summary.md for one target type: tables, notes and figures, built
from that type's records (report.py lays out and writes the file)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .plots import figures
from .records import Record
from .stats import summarise
from .tables import THROUGHPUT_NOTE, greedy_identity, main_table, markdown_table


@dataclass
class TargetRun:
    """One target encoding's share of a run: its records, and the sections a research
    run adds after ours (benchmarks/: structured output, fill-in-the-middle, rounds,
    cost curve, analytic prediction, parity)."""

    label: str  # the target's weight type ("q4_k_m", "bf16") or dtype
    records: list[Record]
    sections: list[str] = field(default_factory=list)


@dataclass
class RunSections:
    sections: list[str]  # markdown blocks, "## " headings among them
    table: str  # the main table, which the command line prints
    figures: dict = field(default_factory=dict)  # name -> matplotlib Figure, drawn when plots were asked for


def run_sections(run: TargetRun, plots: bool) -> RunSections:
    """The summary's sections for one target type, its main table and its figures."""
    main = [r for r in run.records if r.phase == "main"]
    summaries = summarise(main)
    table = main_table(summaries)
    parts = [f"## Throughput and latency (target {run.label})", THROUGHPUT_NOTE, table]
    parts += ["## Greedy exactness", markdown_table(greedy_identity(main))]
    parts += run.sections
    if not plots:
        return RunSections(parts, table)
    latencies: dict[str, list[float]] = {}
    for r in main:
        latencies.setdefault(r.mode, []).append(r.latency_seconds)
    return RunSections(parts, table, figures(summaries, latencies))

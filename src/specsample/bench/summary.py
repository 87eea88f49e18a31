"""The sections of summary.md for one target type: tables and notes, built from that
type's records (report.py lays out and writes the file)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .records import Record
from .stats import summarise
from .tables import THROUGHPUT_NOTE, greedy_identity, main_table, markdown_table


@dataclass
class TargetRun:
    """One target encoding's share of a run: its records, and the sections a research
    run adds after ours (benchmarks/: structured output, fill-in-the-middle, rounds,
    cost curve, analytic prediction, parity, plots)."""

    label: str  # the target's weight type ("q4_k_m", "bf16") or dtype
    records: list[Record]
    sections: list[str] = field(default_factory=list)


def run_sections(run: TargetRun) -> tuple[list[str], str]:
    """The summary's sections for one target type (markdown blocks, "## " headings among
    them), and its main table, which the command line prints."""
    main = [r for r in run.records if r.phase == "main"]
    table = main_table(summarise(main))
    parts = [f"## Throughput and latency (target {run.label})", THROUGHPUT_NOTE, table]
    parts += ["## Greedy exactness", markdown_table(greedy_identity(main))]
    return parts + run.sections, table

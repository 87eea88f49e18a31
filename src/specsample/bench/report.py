"""The one writer of a bench's output folder: every file `specsample bench` leaves
there is named and written here, from the sections and tables the other modules build.

    records.jsonl, summary.md          the per-sequence benchmark (a research run: cost_curve.json, *.png)
    serve.jsonl, serve.md              bench serve (the research --serve adds calls.jsonl)
    partial.jsonl                      while a run goes on (below)
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .summary import TargetRun, run_sections

RECORDS, SUMMARY = "records.jsonl", "summary.md"
SERVE_RECORDS, SERVE_SUMMARY = "serve.jsonl", "serve.md"
PARTIAL = "partial.jsonl"


def keep_partial(out: Path, label: str, records: list) -> None:
    """Append records as they are made, each labelled with its target type, so that a
    run stopped after an hour leaves what it measured (records.jsonl's or
    serve.jsonl's lines, read by the same classes); the report removes the file when
    it writes the whole run."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / PARTIAL, [replace(r, target=label) for r in records], mode="a")


def start_partial(out: Path) -> None:
    (out / PARTIAL).unlink(missing_ok=True)  # an earlier run's rows are not this run's


def write_report(out: Path, runs: list[TargetRun], *, command: str, machine: str, notes: list[str] = (),
                 extra: dict[str, str] | None = None, overview: str | None = None) -> str:
    """records.jsonl and summary.md in `out`, and any `extra` files a research run adds
    (name -> text: cost_curve.json); returns the tables to print. Several target types
    (the research bench's --target-quants) get its `overview` by type, then a section each."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / RECORDS, [r for run in runs for r in run.records])
    for name, text in (extra or {}).items():
        (out / name).write_text(text)
    parts, printed = [], []
    if overview:
        parts += ["## By target type", overview]
        printed.append(overview)
    for run in runs:
        sections, table = run_sections(run)
        if len(runs) > 1:
            parts += [f"## Target {run.label}"] + ["#" + p if p.startswith("## ") else p for p in sections]
            printed.append(f"Target {run.label}:\n{table}")
        else:
            parts += sections
            printed.append(table)
    _write_markdown(out / SUMMARY, "specsample bench", command, machine, parts, notes)
    start_partial(out)
    return "\n\n".join(printed)


def write_serve_report(out: Path, records: list, sections: list[str], *, command: str, machine: str,
                       notes: list[str]) -> None:
    """serve.jsonl (records.ServedRecord, one a line) and serve.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / SERVE_RECORDS, records)
    _write_markdown(out / SERVE_SUMMARY, "specsample bench serve", command, machine, sections, notes)
    start_partial(out)


def write_records(path: Path, records: list, mode: str = "w") -> None:
    """One record a line, each as its own to_json() gives it (mode "a": appended)."""
    with open(path, mode) as f:
        for r in records:
            f.write(json.dumps(r.to_json()) + "\n")


def _write_markdown(path: Path, title: str, command: str, machine: str, sections: list[str],
                    notes: list[str] = ()) -> None:
    parts = [f"# {title}", f"Command: `{command}`", f"Machine: {machine}", *sections]
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    path.write_text("\n\n".join(parts) + "\n")

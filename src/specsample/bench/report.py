"""The one writer of a bench's output folder: every file `specsample bench` leaves
there is named and written here, from the sections and tables the other modules build.

    records.jsonl, summary.md, *.png   the per-sequence benchmark (a research run: cost_curve.json)
    serve.jsonl, serve.md                                bench serve (the research --serve: calls.jsonl)
    partial.jsonl                                        while a run goes on (below)
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .summary import TargetRun, run_sections
from .targets import by_target_section

RECORDS, SUMMARY = "records.jsonl", "summary.md"
SERVE_RECORDS, SERVE_SUMMARY, CALL_SPLITS = "serve.jsonl", "serve.md", "calls.jsonl"
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
                 plots: bool = True, extra: dict[str, str] | None = None) -> str:
    """records.jsonl, summary.md and plots in `out`, and any `extra` files a research
    run adds (name -> text: cost_curve.json); returns the tables to print. Several
    target types get an overview by type, then a section each."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / RECORDS, [r for run in runs for r in run.records])
    for name, text in (extra or {}).items():
        (out / name).write_text(text)
    parts, printed = [], []
    if len(runs) > 1:
        overview = by_target_section(runs)
        parts += ["## By target type", overview]
        printed.append(overview)
    for run in runs:
        built = run_sections(run, plots)
        sections = built.sections
        if built.figures:
            images = _save_figures(out, built.figures, f"-{run.label}" if len(runs) > 1 else "")
            sections = sections + ["## Plots", "\n".join(f"![{p.stem}]({p.name})" for p in images)]
        if len(runs) > 1:
            parts += [f"## Target {run.label}"] + ["#" + p if p.startswith("## ") else p for p in sections]
            printed.append(f"Target {run.label}:\n{built.table}")
        else:
            parts += sections
            printed.append(built.table)
    _write_markdown(out / SUMMARY, "specsample bench", command, machine, parts, notes)
    start_partial(out)
    return "\n\n".join(printed)


def write_serve_report(out: Path, records: list, sections: list[str], *, command: str, machine: str,
                       notes: list[str], splits: list = ()) -> None:
    """serve.jsonl (records.ServedRecord, one a line), calls.jsonl (calls.CallSplit, a
    line per load of our servers) and serve.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / SERVE_RECORDS, records)
    if splits:
        write_records(out / CALL_SPLITS, splits)
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


def _save_figures(out: Path, figures: dict, suffix: str) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for name, figure in figures.items():
        paths.append(out / f"{name}{suffix}.png")
        figure.savefig(paths[-1], dpi=110)
        plt.close(figure)
    return paths

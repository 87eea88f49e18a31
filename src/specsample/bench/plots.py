"""PNG plots with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path

from .costs import Prediction
from .stats import ModeSummary


def write_plots(out: Path, summaries: list[ModeSummary], predictions: dict[tuple, list[Prediction]],
                latencies: dict[str, list[float]], suffix: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = [s for s in summaries if s.family == "spec"]
    paths = []
    if spec:
        paths.append(_per_task(plt, out / f"speedup_vs_k{suffix}.png", spec, "decode_speedup",
                               "decode speedup over ar (prefill left out)", predictions))
        paths.append(_per_task(plt, out / f"tokens_per_call_vs_k{suffix}.png", spec, "tokens_per_target_call",
                               "mean tokens per target call", {}))
    if latencies:
        paths.append(_latency(plt, out / f"latency{suffix}.png", latencies))
    return paths


def _per_task(plt, path: Path, spec: list[ModeSummary], attr: str, ylabel: str, predictions) -> Path:
    tasks = list(dict.fromkeys(s.task for s in spec))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for setting in dict.fromkeys(s.setting for s in spec if s.task == task):
            points = sorted((s.k, getattr(s, attr)) for s in spec if s.task == task and s.setting == setting
                            and getattr(s, attr) is not None)
            if points:
                line, = ax.plot(*zip(*points), marker="o", label=f"{setting} measured")
                preds = predictions.get((task, setting), [])
                if preds:
                    ax.plot([p.k for p in preds], [p.speedup for p in preds], linestyle="--", marker="x",
                            color=line.get_color(), label=f"{setting} predicted")
        if attr == "decode_speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=task, xlabel="K (draft tokens per round)", ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _latency(plt, path: Path, latencies: dict[str, list[float]]) -> Path:
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(latencies)), 4))
    ax.boxplot(list(latencies.values()))
    ax.set_xticks(range(1, len(latencies) + 1), list(latencies), rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="seconds per sequence", title="per-sequence latency (all tasks and settings)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

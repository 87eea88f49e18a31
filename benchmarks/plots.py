"""The research bench's figures, drawn with matplotlib's Agg backend (no display
needed): decode speedup and tokens per target call against K (the K sweep), and each
mode's per-sequence latency; saved beside summary.md, with a section that shows them."""

from __future__ import annotations

from pathlib import Path

from specsample.bench.stats import ModeSummary, summarise


def plot_section(out: Path, records: list, suffix: str = "") -> list[str]:
    """One target type's figures saved in `out` (each name + suffix + .png), and the
    summary's section that shows them; none without records to draw."""
    import matplotlib.pyplot as plt

    main = [r for r in records if r.phase == "main"]
    latencies: dict[str, list[float]] = {}
    for r in main:
        latencies.setdefault(r.mode, []).append(r.latency_seconds)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, figure in figures(summarise(main), latencies).items():
        paths.append(out / f"{name}{suffix}.png")
        figure.savefig(paths[-1], dpi=110)
        plt.close(figure)
    return ["## Plots", "\n".join(f"![{p.stem}]({p.name})" for p in paths)] if paths else []


def figures(summaries: list[ModeSummary], latencies: dict[str, list[float]]) -> dict:
    """The figures of one target type's results, by name (a matplotlib Figure each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = [s for s in summaries if s.family == "spec"]
    drawn = {}
    if spec:
        drawn["speedup_vs_k"] = _per_task(plt, spec, "decode_speedup", "decode speedup over ar (prefill left out)")
        drawn["tokens_per_call_vs_k"] = _per_task(plt, spec, "tokens_per_target_call", "mean tokens per target call")
    if latencies:
        drawn["latency"] = _latency(plt, latencies)
    return drawn


def _per_task(plt, spec: list[ModeSummary], attr: str, ylabel: str):
    tasks = list(dict.fromkeys(s.task for s in spec))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for setting in dict.fromkeys(s.setting for s in spec if s.task == task):
            points = sorted((s.k, getattr(s, attr)) for s in spec if s.task == task and s.setting == setting
                            and getattr(s, attr) is not None)
            if points:
                ax.plot(*zip(*points), marker="o", label=setting)
        if attr == "decode_speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=task, xlabel="K (draft tokens per round)", ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _latency(plt, latencies: dict[str, list[float]]):
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(latencies)), 4))
    ax.boxplot(list(latencies.values()))
    ax.set_xticks(range(1, len(latencies) + 1), list(latencies), rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="seconds per sequence", title="per-sequence latency (all tasks and settings)")
    fig.tight_layout()
    return fig

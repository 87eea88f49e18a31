"""Target encodings side by side: one overview row per target type, task and setting,
and a sentence that says, from this run's own cost curves, why they differ.

The same weights cost a different shape of call in each encoding. A Q4_K_M call on a
small CPU is compute-bound: every extra token scored adds the arithmetic of a token.
A BF16 call reads 3x the bytes and is bound by memory bandwidth: the weights are read
once for every token of the call, so scoring K + 1 tokens costs little more than one,
which is the premise of speculative decoding.
"""

from __future__ import annotations

from .bandwidth import effective_bandwidth, read_ceiling
from .records import Record
from .stats import ModeSummary, summarise
from .summary import TargetRun
from .tables import cell, markdown_table, predictions_by_group

NOTE = (
    "Decode speedups over each target's own `ar` (our autoregressive loop on the same file), prompt prefill left out, "
    "with the best K of each fixed-K family; "
    "the call cost is the cost curve's n-token call over its 1-token call (both after a draft step); predicted: the "
    "analytic model's best K at the acceptance measured for the fixed-K modes; eff. bandwidth of `-k auto` as a share "
    "of that target's read ceiling (see each target's section).")


def by_target_section(runs: list[TargetRun], probe: float | None) -> str:
    rows = [["target", "task", "setting", "weights GB", "call of n tokens / 1 token", "ar decode tok/s", "-k auto",
             "best fixed K", "llama-server -md", "predicted (best K)", "-k auto eff. GB/s (% of ceiling)",
             "-k auto plain steps"]]
    for run in runs:
        summaries = summarise([r for r in run.records if r.phase == "main"])
        ceiling = read_ceiling(probe, [s.decode_tokens_per_second for s in summaries
                                       if s.mode == "ar" and s.decode_tokens_per_second], run.weight_bytes)
        predictions = predictions_by_group(summaries, run.curve)
        plain = _plain_shares(run.records)
        for task, setting in dict.fromkeys((s.task, s.setting) for s in summaries):
            group = [s for s in summaries if (s.task, s.setting) == (task, setting)]
            ar, auto = _first(group, "ar"), _first(group, "spec-auto")
            best, peer = _best(group, "spec"), _best(group, "llamacpp-spec")
            predicted = max(predictions.get((task, setting), []), key=lambda p: p.speedup, default=None)
            rows.append([run.label, task, setting, cell(run.weight_bytes and run.weight_bytes / 1e9, ".2f"),
                         _call_ratios(run), cell(ar and ar.decode_tokens_per_second, ".2f"),
                         cell(auto and auto.decode_speedup, ".2f"),
                         f"{best.decode_speedup:.2f} (K={best.k})" if best else "–",
                         f"{peer.decode_speedup:.2f} (K={peer.k})" if peer else "–",
                         f"{predicted.speedup:.2f} (K={predicted.k})" if predicted else "–",
                         _bandwidth(run.weight_bytes, auto, ceiling), cell(plain.get((task, setting)), ".0%")])
    return "\n\n".join([NOTE, markdown_table(rows), why_they_differ(runs)])


def why_they_differ(runs: list[TargetRun]) -> str:
    """One sentence from the run's cost curves and what -k auto did with them."""
    said = []
    for run in runs:
        if run.curve is None or len(run.curve.target_cost) < 2:
            continue
        n = len(run.curve.target_cost)
        shares = list(_plain_shares(run.records).values())
        drafted = f", and -k auto drafted in {1 - sum(shares) / len(shares):.0%} of its rounds" if shares else ""
        said.append(f"on {run.label} a call scoring {n} tokens costs {run.curve.ratio(n):.2f}x a 1-token call{drafted}")
    if not said:
        return ""
    return ("Why the targets differ: " + "; ".join(said) + ". Drafting pays where scoring several tokens costs little "
            "more than one, as when a call's time is the time to read the weights (memory-bound); where every extra "
            "token adds its own arithmetic (compute-bound), the drafts' time is not won back.")


def _first(group: list[ModeSummary], family: str) -> ModeSummary | None:
    return next((s for s in group if s.family == family or s.mode == family), None)


def _best(group: list[ModeSummary], family: str) -> ModeSummary | None:
    """The family's mode with the best decode speedup (its best K)."""
    ranked = [s for s in group if s.family == family and s.decode_speedup is not None]
    return max(ranked, key=lambda s: s.decode_speedup, default=None)


def _call_ratios(run: TargetRun) -> str:
    if run.curve is None or len(run.curve.target_cost) < 2:
        return "–"
    n = len(run.curve.target_cost)
    return f"{run.curve.ratio(2):.2f} (n=2), {run.curve.ratio(n):.2f} (n={n})"


def _bandwidth(weight_bytes: int | None, auto: ModeSummary | None, ceiling: float | None) -> str:
    effective = effective_bandwidth(weight_bytes, auto and auto.decode_tokens_per_second)
    if effective is None:
        return "–"
    return f"{effective / 1e9:.1f}" + (f" ({100 * effective / ceiling:.0f}%)" if ceiling else "")


def _plain_shares(records: list[Record]) -> dict[tuple, float]:
    """Share of -k auto's rounds that were plain steps, per (task, setting)."""
    rounds: dict[tuple, list[int]] = {}
    for r in records:
        histogram = r.stats.get("draft_length_histogram")
        if r.phase != "main" or r.k != "auto" or not histogram:
            continue
        c = rounds.setdefault((r.task, r.setting), [0, 0])
        c[0] += histogram[0]
        c[1] += sum(histogram)
    return {key: plain / total for key, (plain, total) in rounds.items() if total}

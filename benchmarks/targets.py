"""Target encodings side by side (--target-quants): the types a run takes in turn, and
one overview row per target type, task and setting.

The same weights cost a different shape of call in each encoding. A Q4_K_M call on a
small CPU is compute-bound: every extra token scored adds the arithmetic of a token.
A BF16 call reads 3x the bytes and is bound by memory bandwidth: the weights are read
once for every token of the call, so scoring K + 1 tokens costs little more than one,
which is the premise of speculative decoding (the research bench's cost curves show it,
and the analytic model's prediction).
"""

from __future__ import annotations

from specsample.app.arguments import UsageError
from specsample.bench.options import names
from specsample.bench.records import Record
from specsample.bench.stats import ModeSummary, summarise
from specsample.bench.summary import TargetRun
from specsample.bench.tables import cell, markdown_table

def target_types(args) -> list[tuple[str | None, str]]:
    """(label, --target-quant value) for each target type to run: one, or each of
    --target-quants, where the target file's own type means the file as given."""
    if not args.target_quants:
        return [(None, args.target_quant)]
    if args.target_quant != "none":
        raise UsageError("give --target-quant or --target-quants, not both")
    from specsample.backends.models import resolve
    from specsample.backends.reencode import TARGET_QUANTS, file_type

    gguf = resolve(args.target).gguf_path
    if gguf is None:
        raise UsageError("--target-quants re-encodes a GGUF target file; this target is not one")
    own = file_type(gguf)
    types = []
    for name in names(args.target_quants, [own, *TARGET_QUANTS], "--target-quants type"):
        types.append((name, "none" if name == own else name))
    return types


NOTE = ("Decode speedups over each target's own `ar` (our autoregressive loop on the same file), prompt prefill left "
        "out, with the best K of each fixed-K family; plain steps: the share of -k auto's rounds that drafted nothing.")


def by_target_section(runs: list[TargetRun]) -> str:
    rows = [["target", "task", "setting", "ar decode tok/s", "-k auto", "best fixed K", "llama-server -md",
             "-k auto plain steps"]]
    for run in runs:
        summaries = summarise([r for r in run.records if r.phase == "main"])
        plain = plain_shares(run.records)
        for task, setting in dict.fromkeys((s.task, s.setting) for s in summaries):
            group = [s for s in summaries if (s.task, s.setting) == (task, setting)]
            ar, auto = _first(group, "ar"), _first(group, "spec-auto")
            best, peer = best_of(group, "spec"), best_of(group, "llamacpp-spec")
            rows.append([run.label, task, setting, cell(ar and ar.decode_tokens_per_second, ".2f"),
                         cell(auto and auto.decode_speedup, ".2f"),
                         f"{best.decode_speedup:.2f} (K={best.k})" if best else "–",
                         f"{peer.decode_speedup:.2f} (K={peer.k})" if peer else "–",
                         cell(plain.get((task, setting)), ".0%")])
    return "\n\n".join([NOTE, markdown_table(rows)])


def _first(group: list[ModeSummary], family: str) -> ModeSummary | None:
    return next((s for s in group if s.family == family or s.mode == family), None)


def best_of(group: list[ModeSummary], family: str) -> ModeSummary | None:
    """The family's mode with the best decode speedup (its best K)."""
    ranked = [s for s in group if s.family == family and s.decode_speedup is not None]
    return max(ranked, key=lambda s: s.decode_speedup, default=None)


def plain_shares(records: list[Record]) -> dict[tuple, float]:
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

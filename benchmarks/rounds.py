"""Where a round of our loop spends its time, and what -k auto chose: two tables of the
research bench's summary.md, from any run's records (python -m benchmarks.studies.rounds
prints the first for a records.jsonl)."""

from __future__ import annotations

from specsample.bench.records import Record
from specsample.bench.tables import cell, markdown_table


def round_time_table(records: list[Record]) -> str | None:
    """Where a round of our loop spends its time, per task, setting and mode: draft
    steps (the draft's prefill and catch-up included), the target call, and the rest
    (sampling, verification, the policy, the grammar), per round and per token."""
    groups: dict[tuple, dict[str, float]] = {}
    for r in records:
        st = r.stats
        if "target_seconds" not in st or not st.get("target_calls"):
            continue  # peers report no split
        g = groups.setdefault((r.task, r.setting, r.mode), dict.fromkeys(
            ("seqs", "tokens", "rounds", "steps", "draft", "target", "other"), 0.0))
        g["seqs"] += 1
        g["tokens"] += st["new_tokens"]
        g["rounds"] += st["target_calls"]
        g["steps"] += st.get("draft_calls", 0)
        g["draft"] += st["draft_seconds"]
        g["target"] += st["target_seconds"]
        g["other"] += st["other_seconds"]  # GenerationStats.other_seconds: prefill and calibration left out
    if not groups:
        return None
    rows = [["task", "setting", "mode", "seqs", "rounds", "tokens/round", "draft calls/round",
             "ms/round: draft", "target", "other", "ms/draft call", "decode ms/token"]]
    for (task, setting, mode), g in groups.items():
        n = g["rounds"]
        rows.append([task, setting, mode, str(int(g["seqs"])), str(int(n)), f"{g['tokens'] / n:.2f}",
                     f"{g['steps'] / n:.2f}", f"{1000 * g['draft'] / n:.1f}", f"{1000 * g['target'] / n:.1f}",
                     f"{1000 * g['other'] / n:.1f}", cell(1000 * g["draft"] / g["steps"] if g["steps"] else None, ".1f"),
                     f"{1000 * (g['draft'] + g['target'] + g['other']) / g['tokens']:.1f}"])
    return markdown_table(rows)


ROUND_NOTE = (
    "Our loop's decoding time, summed over the mode's sequences, split by round (one target call each; the prompt "
    "prefill and the controller's one-off calibration left out). Draft time includes the draft's own prompt prefill "
    "and catch-up on tokens it has not seen; other is sampling, verification, the policy and the grammar. "
    "`python -m benchmarks.studies.rounds records.jsonl` prints this table for any run's records.")


def controller_table(records: list[Record]) -> str | None:
    """Rounds by draft length and by source, per task and setting, for adaptive modes."""
    groups: dict[tuple, dict] = {}
    for r in records:
        st = r.stats
        if r.k != "auto" or "draft_length_histogram" not in st:
            continue
        g = groups.setdefault((r.task, r.setting, r.mode), {"lengths": [], "sources": {}})
        for m, count in enumerate(st["draft_length_histogram"]):
            g["lengths"].extend([0] * (m + 1 - len(g["lengths"])))
            g["lengths"][m] += count
        for source, c in st.get("sources", {}).items():
            acc = g["sources"].setdefault(source, [0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + c["rounds"], acc[1] + c["drafted"], acc[2] + c["accepted"]
    if not groups:
        return None
    rows = [["task", "setting", "mode", "rounds", "plain steps", "rounds by draft length 0, 1, 2, ...",
             "source: rounds, accepted/drafted"]]
    for (task, setting, mode), g in groups.items():
        rounds = sum(g["lengths"])
        sources = "; ".join(f"{s}: {n}, {a}/{d}" for s, (n, d, a) in sorted(g["sources"].items())) or "none"
        rows.append([task, setting, mode, str(rounds), f"{g['lengths'][0] / rounds:.0%}" if rounds else "-",
                     ", ".join(map(str, g["lengths"])), sources])
    return markdown_table(rows)


CONTROLLER_NOTE = (
    "Summed over the mode's sequences. A plain step scores one token with the target and drafts nothing; the last "
    "round of an answer is plain when only one token is left to emit. Sources: the draft model, or a context "
    "lookup whose suffix match had n tokens (ngram<n>), or tokens a grammar forced (forced).")


def round_sections(records: list[Record]) -> list[str]:
    """Both tables with their notes, where the records have rounds of our loop."""
    sections = []
    rounds, choices = round_time_table(records), controller_table(records)
    if rounds:
        sections += ["## Where a round's time goes", ROUND_NOTE, rounds]
    if choices:
        sections += ["## What -k auto chose", CONTROLLER_NOTE, choices]
    return sections

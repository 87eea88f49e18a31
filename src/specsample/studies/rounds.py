"""Where a round of our loop spends its time, from a run's records: the per-round
split that shows what drafting costs against the target call.

    python -m specsample.bench.rounds docs/results/target-types/records.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .report import cell, markdown_table


def round_time_table(records: list[dict]) -> str | None:
    """Where a round of our loop spends its time, per task, setting and mode: draft
    steps (the draft's prefill and catch-up included), the target call, and the rest
    (sampling, verification, the policy, the grammar), per round and per token."""
    groups: dict[tuple, dict[str, float]] = {}
    for r in records:
        st = r["stats"]
        if "target_seconds" not in st or not st.get("target_calls"):
            continue  # peers report no split
        g = groups.setdefault((r["task"], r["setting"], r["mode"]), dict.fromkeys(
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
    "`python -m specsample.bench.rounds records.jsonl` prints this table for any run's records.")


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python -m specsample.bench.rounds RECORDS.jsonl [...]", file=sys.stderr)
        return 2
    for path in paths:
        records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        by_target: dict[str, list[dict]] = {}
        for r in records:
            if r.get("phase", "main") == "main":
                by_target.setdefault(r.get("target") or "-", []).append(r)
        for target, group in by_target.items():
            print(f"{path}, target {target}:\n{round_time_table(group) or 'no rounds of our loop'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A whole small benchmark on toy backends: runner, cost curve, report files."""

import json

from specsample.bench.costs import measure_cost_curve
from specsample.bench.modes import SETTINGS, OurMode
from specsample.bench.report import write_report
from specsample.bench.runner import BenchConfig, prepare, run_bench
from toy import TrigramBackend, random_table

VOCAB = 12


class LetterTokenizer:
    def encode(self, text):
        return [ord(c) % VOCAB for c in text[-24:]]  # short prompts keep the toy fast

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)

    def chat_prompt(self, text):
        return self.encode(text)


def _backend(seed, name):
    b = TrigramBackend(random_table(VOCAB, seed, scale=3.0), name=name)
    b.tokenizer = LetterTokenizer()
    return b


def test_small_run_writes_records_summary_and_plots(tmp_path):
    target, draft = _backend(0, "target"), _backend(0, "draft")  # same table: drafts mostly accepted
    modes = [OurMode("ar", "ar", target), OurMode("spec-k1", "spec", target, 1, draft),
             OurMode("spec-k2", "spec", target, 2, draft), OurMode("ngram-k2", "ngram", target, 2),
             OurMode("spec-auto", "spec-auto", target, "auto", draft)]
    config = BenchConfig(tasks=("humaneval", "copy"), settings=("greedy", "sample"), default_prompts=2, max_new_tokens=12)
    prompts = prepare(target, config.tasks, {"humaneval": 2, "copy": 2})
    records = run_bench(modes, prompts, config)
    assert len(records) == 2 * 2 * 2 * len(modes)
    # Interleaving: the first mode run rotates from prompt to prompt.
    firsts = [records[i]["mode"] for i in range(0, len(records), len(modes))]
    assert firsts[:5] == ["ar", "spec-k1", "spec-k2", "ngram-k2", "spec-auto"]

    curve = measure_cost_curve(target, draft, prompts["humaneval"][0].ids, 3, reps=2)
    assert len(curve.target_cost) == 3 and curve.draft_step > 0 and curve.alternating
    assert target.length == 0 and draft.length == 0  # both rolled back after measuring
    table = write_report(tmp_path, records, curve, command="specsample bench --test", machine="toy",
                         weight_bytes=2_000_000_000, read_bandwidth=10e9)

    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(records) and json.loads(lines[0])["stats"]["new_tokens"] == 12
    summary = (tmp_path / "summary.md").read_text()
    assert "spec-k2" in table and "| copy | sample | ngram-k2 |" in table
    # Every row says how many sequences back it: 2 prompts here.
    assert all(row.split("|")[5].strip() == "2" for row in table.splitlines()[2:])
    assert "eff. GB/s (% of read)" in table and "read bandwidth, measured in this run, is 10.0 GB/s" in summary
    ar_row = next(row for row in table.splitlines() if "| humaneval | greedy | ar |" in row)
    assert "%)" in ar_row.split("|")[12]  # 2 GB x decode tokens/s, against 10 GB/s
    for section in ("Command: `specsample bench --test`", "Cost curve", "Analytic prediction", "Greedy exactness"):
        assert section in summary
    # Exactness: greedy speculative output equals greedy autoregressive output.
    assert "| spec-k2 | 4/4 |" in summary and "| ngram-k2 | 4/4 |" in summary and "| spec-auto | 4/4 |" in summary
    # What the adaptive mode chose, with its rounds and sources.
    assert "## What -k auto chose" in summary
    section = summary.split("## What -k auto chose")[1]
    auto_row = next(row for row in section.splitlines() if row.startswith("| humaneval | greedy | spec-auto | "))
    cells = [c.strip() for c in auto_row.split("|")[1:-1]]
    assert int(cells[3]) == sum(int(x) for x in cells[5].split(", "))
    for png in ("speedup_vs_k.png", "tokens_per_call_vs_k.png", "latency.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_toy_speculation_accepts_with_an_identical_draft():
    target, draft = _backend(1, "t"), _backend(1, "d")
    mode = OurMode("spec-k2", "spec", target, 2, draft)
    out = mode.run([1, 2, 3], 10, SETTINGS["sample"], seed=0)
    assert out.stats["accepted"] == out.stats["drafted"] > 0  # identical draft: never rejected
    assert len(out.token_ids) == 10


def test_parity_table_has_intervals_and_a_z_test():
    from specsample.bench.parity import PassRate
    from specsample.bench.report import parity_table

    table = parity_table([PassRate("ar", 20, 40), PassRate("spec-k3", 24, 40)])
    assert "| ar | 20/40 | 0.50 |" in table and "| ar | 20/40 | 0.50 | [0.35, 0.65] | – | – |" in table
    spec = next(row for row in table.splitlines() if "spec-k3" in row)
    assert "0.90" in spec  # z = 0.1 / sqrt(.55 * .45 * 2 / 40) = 0.90

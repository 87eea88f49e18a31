"""A whole small benchmark on toy backends: runner, report files, and the research
bench's sections (cost curve, prediction, bandwidth) in them."""

import json
from dataclasses import replace

import pytest

from benchmarks.bench import research_sections
from benchmarks.costs import measure_cost_curve
from benchmarks.plots import plot_section
from benchmarks.tasks import RESEARCH_TASKS  # noqa: F401 (registers the copy task)
from specsample.bench.modes import SETTINGS, OurMode
from specsample.bench.report import write_report
from specsample.bench.runner import BenchConfig, prepare, run_bench
from specsample.bench.summary import TargetRun
from bench_helpers import record
from toy import TrigramBackend, random_table

pytestmark = pytest.mark.pure

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
    firsts = [records[i].mode for i in range(0, len(records), len(modes))]
    assert firsts[:5] == ["ar", "spec-k1", "spec-k2", "ngram-k2", "spec-auto"]

    curve = measure_cost_curve(target, draft, prompts["humaneval"][0].ids, 3, reps=2)
    assert len(curve.target_cost) == 3 and curve.draft_first > 0
    assert curve.plain > 0 and curve.draft_step > 0
    assert target.length == 0 and draft.length == 0  # both rolled back after measuring
    sections = research_sections(records, curve, 2_000_000_000, 10e9) + plot_section(tmp_path, records)
    table = write_report(tmp_path, [TargetRun("toy", records, sections)], command="specsample bench --test",
                         machine="toy")

    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(records) and json.loads(lines[0])["stats"]["new_tokens"] == 12
    summary = (tmp_path / "summary.md").read_text()
    assert "spec-k2" in table and "| copy | sample | ngram-k2 |" in table
    # Every row says how many sequences back it: 2 prompts here.
    assert all(row.split("|")[5].strip() == "2" for row in table.splitlines()[2:])
    ar_row = next(row for row in table.splitlines() if "| humaneval | greedy | ar |" in row)
    assert float(ar_row.split("|")[9]) >= 0 and float(ar_row.split("|")[10]) == 1.0  # TTFT (toy: ms), ar's own ratio
    # The research bench's bandwidth: 2 GB x decode tokens/s, against the ceiling, which is never below
    # what plain decoding reached: no ar row passes 100%.
    bandwidth = summary.split("## Effective bandwidth")[1]
    assert "a read probe in this run (10.0 GB/s" in bandwidth
    ar_rows = [row for row in bandwidth.splitlines() if row.startswith("| ") and row.split("|")[3].strip() == "ar"]
    assert ar_rows and all(int(row.split("|")[4].split("(")[1].rstrip("%) ")) <= 100 for row in ar_rows)
    for section in ("Command: `specsample bench --test`", "Cost curve", "Analytic prediction", "Greedy exactness",
                    "## Where a round's time goes"):
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
        assert (tmp_path / png).stat().st_size > 1000 and f"]({png})" in summary.split("## Plots")[1]


def test_toy_speculation_accepts_with_an_identical_draft():
    target, draft = _backend(1, "t"), _backend(1, "d")
    mode = OurMode("spec-k2", "spec", target, 2, draft)
    out = mode.run([1, 2, 3], 10, SETTINGS["sample"], seed=0)
    assert out.stats["accepted"] == out.stats["drafted"] > 0  # identical draft: never rejected
    assert len(out.token_ids) == 10


def test_parity_table_has_intervals_and_a_z_test():
    from benchmarks.parity import PassRate, parity_table

    table = parity_table([PassRate("ar", 20, 40), PassRate("spec-k3", 24, 40)])
    assert "| ar | 20/40 | 0.50 |" in table and "| ar | 20/40 | 0.50 | [0.35, 0.65] | – | – |" in table
    spec = next(row for row in table.splitlines() if "spec-k3" in row)
    assert "0.90" in spec  # z = 0.1 / sqrt(.55 * .45 * 2 / 40) = 0.90


def test_two_target_types_get_an_overview_and_a_section_each(tmp_path):
    from benchmarks.costs import CostCurve
    from benchmarks.targets import by_target_section

    target, draft = _backend(0, "target"), _backend(0, "draft")
    modes = [OurMode("ar", "ar", target), OurMode("spec-k2", "spec", target, 2, draft),
             OurMode("spec-auto", "spec-auto", target, "auto", draft)]
    config = BenchConfig(tasks=("humaneval",), settings=("greedy",), default_prompts=2, max_new_tokens=8)
    prompts = prepare(target, config.tasks, {"humaneval": 2})
    runs, curves = [], {}
    for label, cost in (("q4_k_m", [0.03, 0.055, 0.075]), ("bf16", [0.09, 0.1, 0.11])):
        records = [replace(r, target=label) for r in run_bench(modes, prompts, config)]
        curve = CostCurve(24, 0.01, cost, 2)
        runs.append(TargetRun(label, records, research_sections(records, curve, 1_000_000_000, 10e9)))
        curves[label] = curve.target_cost
    write_report(tmp_path, runs, command="specsample bench --target-quants q4_k_m,bf16", machine="toy",
                 extra={"cost_curve.json": json.dumps(curves)}, overview=by_target_section(runs))
    summary = (tmp_path / "summary.md").read_text()
    assert "## By target type" in summary and "## Target q4_k_m" in summary and "## Target bf16" in summary
    assert "### Throughput and latency (target bf16)" in summary
    overview = summary.split("## By target type")[1].split("## Target")[0]
    rows = [r for r in overview.splitlines() if r.startswith("| q4_k_m |") or r.startswith("| bf16 |")]
    assert len(rows) == 2 and all(row.split("|")[4].strip() != "–" for row in rows)  # ar's decode rate
    q4_section, bf16_section = summary.split("## Target q4_k_m")[1].split("## Target bf16")
    assert "A call scoring 3 tokens costs 2.50x a plain step here" in q4_section
    assert "A call scoring 3 tokens costs 1.22x a plain step here" in bf16_section
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert {r["target"] for r in records} == {"q4_k_m", "bf16"}
    assert set(json.loads((tmp_path / "cost_curve.json").read_text())) == {"q4_k_m", "bf16"}


def test_round_time_table_splits_decoding_by_round_and_leaves_prefill_out(capsys, tmp_path):
    from specsample.bench.report import write_records
    from benchmarks.rounds import round_time_table
    from benchmarks.studies.rounds import main

    def split(mode, tokens, calls, draft_calls, draft, target, prefill, total, calibration=0.0):
        return record(task="t", mode=mode, target="bf16",
                      stats={"new_tokens": tokens, "target_calls": calls, "draft_calls": draft_calls,
                             "draft_seconds": draft, "target_seconds": target, "prefill_seconds": prefill,
                             "calibration_seconds": calibration, "total_seconds": total,
                             "other_seconds": total - prefill - calibration - draft - target})

    records = [split("spec-k4", 10, 2, 8, 0.2, 0.6, 0.5, 1.4),
               split("spec-k4", 6, 2, 8, 0.2, 0.6, 0.5, 1.5, calibration=0.1),
               record(task="t", mode="llamacpp-spec-k4", stats={"new_tokens": 9})]
    table = round_time_table(records)
    row = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    # 4 rounds, 16 tokens, 16 draft calls; draft 0.4 s, target 1.2 s, other (1.4+1.5-1.0-0.1-1.6) = 0.2 s.
    assert row == ["t", "greedy", "spec-k4", "2", "4", "4.00", "4.00", "100.0", "300.0", "50.0", "25.0", "112.5"]
    assert len(table.splitlines()) == 3  # the peer reports no split and gets no row
    path = tmp_path / "records.jsonl"
    write_records(path, records)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "target bf16" in out and "| t | greedy | spec-k4 | 2 | 4 |" in out


def test_a_run_keeps_each_record_as_it_is_made_and_the_report_clears_them(tmp_path):
    from specsample.bench.records import read_records
    from specsample.bench.report import PARTIAL, keep_partial, start_partial

    target, draft = _backend(0, "target"), _backend(0, "draft")
    modes = [OurMode("ar", "ar", target), OurMode("spec-k2", "spec", target, 2, draft)]
    config = BenchConfig(tasks=("humaneval",), settings=("greedy",), default_prompts=2, max_new_tokens=6)
    prompts = prepare(target, config.tasks, {"humaneval": 2})
    (tmp_path / PARTIAL).write_text("an earlier run's line\n")
    start_partial(tmp_path)
    seen = []

    def keep(made):  # what a stopped run would have left: every record so far, on disk
        keep_partial(tmp_path, "toy", made)
        seen.append(len(read_records(tmp_path / PARTIAL)))

    records = run_bench(modes, prompts, config, keep=keep)
    assert seen == list(range(1, len(records) + 1))
    assert [r.to_json() for r in read_records(tmp_path / PARTIAL)] == [replace(r, target="toy").to_json()
                                                                        for r in records]
    write_report(tmp_path, [TargetRun("toy", records)], command="c", machine="m")
    assert not (tmp_path / PARTIAL).exists() and (tmp_path / "records.jsonl").exists()

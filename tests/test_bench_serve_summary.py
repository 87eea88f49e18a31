"""`bench --serve`'s figures and serve.md: a load's tokens/s with and without prefill,
TTFT and TPOT, refusals and losses, on hand-computed examples; the load table, the
ratios against llama-server and one slot, greedy exactness and the written report."""

import json

import pytest

from specsample.bench.load import decode_span, summarise_load
from specsample.bench.records import RequestTiming, ServedRecord
from specsample.bench.report import write_serve_report
from specsample.bench.serve_summary import paired, serve_sections, serve_table, spread, summaries

from benchmarks.serve_run import peer_table, started_sections

pytestmark = pytest.mark.pure


def _timing(index=0, sent=0.0, first=0.5, finished=1.5, tokens=10, **rest):
    return RequestTiming(index, sent, first, finished, tokens, **rest)


def test_a_load_summary_by_hand():
    timings = [
        _timing(0, sent=0.0, first=1.0, finished=3.0, tokens=5),  # streams over [1, 3]; TPOT 2 / 4
        _timing(1, sent=0.0, first=2.0, finished=4.0, tokens=9),  # [2, 4]; TPOT 2 / 8
        _timing(2, sent=4.0, first=1.0, finished=2.0, tokens=3),  # [5, 6]; TPOT 1 / 2
        _timing(3, first=None, finished=0.1, tokens=0, error="APIStatusError: 429", status=429),
        _timing(4, first=None, finished=0.1, tokens=0, error="APIStatusError: 503", status=503),
        _timing(5, first=None, finished=0.1, tokens=0, error="APIStatusError: 429", status=429),
        _timing(6, first=0.5, finished=0.9, tokens=0, error="the stream ended without a finish reason"),
    ]
    s = summarise_load(timings, wall_seconds=6.5)
    assert (s.requests, s.answered, s.refused, s.lost) == (7, 3, {429: 2, 503: 1}, 1)
    assert s.completion_tokens == 17 and s.tokens_per_second == pytest.approx(17 / 6.5)
    # After each answer's first token: 4 + 8 + 2 tokens, while something streamed: [1, 4] and [5, 6].
    assert (s.decode_tokens, s.decode_seconds) == (14, 4.0) and s.decode_tokens_per_second == pytest.approx(3.5)
    assert sorted(s.ttft) == [1.0, 1.0, 2.0] and sorted(s.tpot) == [0.25, 0.5, 0.5]
    assert s.quantile("ttft", 50) == 1.0 and s.quantile("tpot", 50) == 0.5
    assert s.tokens_per_answer == pytest.approx(17 / 3)


def test_one_request_at_a_time_gives_the_single_stream_decode_rate():
    timings = [_timing(0, sent=0.0, first=1.0, finished=2.0, tokens=11), _timing(1, sent=2.0, first=1.0, finished=4.0,
                                                                                 tokens=21)]
    s = summarise_load(timings, wall_seconds=6.0)
    assert s.decode_tokens_per_second == pytest.approx((10 + 20) / (1.0 + 3.0))  # sum(tokens - 1) / sum(last - first)


@pytest.mark.parametrize("intervals,span", [
    ([], 0.0), ([(0, 2)], 2.0), ([(0, 2), (1, 3), (5, 6)], 4.0), ([(1, 5), (2, 3)], 4.0), ([(2, 3), (0, 1)], 2.0),
])
def test_decode_span_is_the_union_of_the_streaming_intervals(intervals, span):
    assert decode_span(intervals) == span


def test_outcomes():
    assert _timing().outcome == "answered" and _timing().decoding == (0.5, 1.5)
    assert _timing(error="x", status=429).outcome == "refused" and _timing(error="x", status=429).decoding is None
    assert _timing(error="ReadTimeout").outcome == "lost"
    assert RequestTiming(0, 0.0, first_text=1.0, finished=3.0, completion_tokens=5).tpot == pytest.approx(0.5)
    assert RequestTiming(0, 0.0, first_text=1.0, finished=1.0, completion_tokens=1).tpot is None


def _record(mode, prompt="p0", *, slots=1, clients=2, setting="greedy", text="a", tokens=10, wall=2.0, family=None,
            k=None, target="q4_k_m", repeat=None, **timing):
    t = _timing(int(prompt[-1]), tokens=tokens, text=text, finish_reason="stop", chunk_gaps=[0.1], **timing)
    return ServedRecord(mode=mode, family=family or mode, k=k, target=target, task="humaneval", setting=setting,
                        prompt_id=prompt, clients=clients, slots=slots, wall_seconds=wall, timing=t, repeat=repeat)


def test_the_load_table_shows_refusals_by_status_and_losses():
    records = [_record("ar", "p0"), _record("ar", "p1"),
               _record("spec-auto", "p0", wall=1.0, drafted=8, accepted=6),
               _record("spec-auto", "p1", wall=1.0, error="APIStatusError: 429", status=429, text="", tokens=0),
               _record("spec-auto", "p2", wall=1.0, error="ReadTimeout", text="", tokens=0)]
    ar_row, spec_row = serve_table(summaries(records)).splitlines()[2:4]
    # 20 tokens in 2 s; each answer streams 10 tokens over [0.5, 1.5], both at once: 18 tokens in 1 s; 2 answers in
    # 2 s; both first texts at 0.5 s; ratios to itself; 1 s / 9 tokens TPOT, 100 ms gaps.
    assert ar_row == ("| humaneval | greedy | 1 | 2 | ar | 1 | 2/2 | 0 | 0 | 10 | 10.00 | 18.00 | 1.000 | 0.50 | 0.50 | "
                      "1.00 | 1.00 | 1.00 | 111.1 / 111.1 | 100.0 / 100.0 | – |")
    assert spec_row.startswith("| humaneval | greedy | 1 | 2 | spec-auto | 1 | 1/3 | 1 (429: 1) | 1 | 10 | 10.00 | "
                               "9.00 | 1.000 | 0.50 | 0.50 | 1.00 | 0.50 | 1.00 |")
    assert spec_row.endswith("| 0.75 |")  # 6 of 8 drafts accepted


def _repeats(mode, walls, firsts, **fields):
    """A load run once per wall: two answers of 10 tokens each time, the first text of both at firsts[i]."""
    return [_record(mode, f"p{p}", wall=wall, repeat=i, first=first, finished=first + 1.0, **fields)
            for i, (wall, first) in enumerate(zip(walls, firsts)) for p in range(2)]


def test_a_repeated_load_is_one_row_of_medians_and_ranges_with_ratios_taken_repeat_by_repeat():
    records = _repeats("ar", [2.0, 2.5, 4.0], [0.5, 0.4, 1.0]) + _repeats("spec-auto", [1.0, 1.0, 2.5], [0.5, 0.5, 0.5])
    by_key = summaries(records)
    assert [len(runs) for runs in by_key.values()] == [3, 3]
    header, _, ar_row, spec_row = serve_table(by_key).split("\n")
    assert header.startswith("| task | setting | slots | clients | server | repeats | answered |")
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in spec_row.split("|")]))
    # tokens/s 20 / wall: ar 10, 8, 5; spec-auto 20, 20, 8. Each ratio is within a round: 2.0, 2.5, 1.6, whose
    # median (2.0) is not the ratio of the medians (20 / 8 = 2.5).
    assert cells["repeats"] == "3" and cells["answered"] == "6/6"
    assert cells["tokens/s"] == "20.00 (8.00–20.00)" and cells["tokens/s ÷ ar"] == "2.00 (1.60–2.50)"
    assert cells["requests/s"] == "2.000 (0.800–2.000)"
    # TTFT: spec-auto 0.5 every time, over ar's 0.5, 0.4, 1.0.
    assert cells["TTFT P50 s"] == "0.50 (0.50–0.50)" and cells["TTFT P50 ÷ ar"] == "1.00 (0.50–1.25)"
    ar_cells = [c.strip() for c in ar_row.split("|")]
    assert ar_cells[11] == "8.00 (5.00–10.00)" and ar_cells[14:16] == ["0.50 (0.40–1.00)", "0.50 (0.40–1.00)"]


@pytest.mark.parametrize("values,text", [([10.0, 12.0, 11.0], "11.0 (10.0–12.0)"), ([3.0], "3.0"),
                                         ([None, 2.0, 4.0], "3.0 (2.0–4.0)"), ([None], "–"), ([], "–")])
def test_spread_is_the_median_and_the_range(values, text):
    assert spread(values, ".1f") == text


def test_ratios_pair_the_repeats_of_one_round():
    def load(tokens_per_second):
        return summarise_load([_timing(tokens=int(tokens_per_second))], wall_seconds=1.0)

    runs, base = [load(20), load(30)], [load(10), load(10)]
    assert paired(runs, base, lambda s: s.tokens_per_second) == [2.0, 3.0]
    assert paired(runs, None, lambda s: s.tokens_per_second) == []
    assert paired([load(20)], [summarise_load([], wall_seconds=1.0)], lambda s: s.decode_tokens_per_second) == [None]


def test_an_endpoint_row_has_no_slot_count_and_its_ratios_are_to_the_named_baseline():
    records = [_record(name, "p0", family="endpoint", slots=None, wall=wall, repeat=0)
               for name, wall in (("vllm", 1.0), ("ours", 0.5))]
    table = serve_sections(records, baseline="vllm")[0][2]
    assert "tokens/s ÷ vllm" in table.splitlines()[0]
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| humaneval | greedy | – | 2 | vllm | 1 |") and "| 1.00 | 1.00 | 1.00 |" in rows[0]
    assert rows[1].startswith("| humaneval | greedy | – | 2 | ours | 1 |") and "| 2.00 | 1.00 | 1.00 |" in rows[1]
    identity = serve_sections(records, baseline="vllm")[0][-1].splitlines()
    assert identity[0].endswith("| greedy answers identical to vllm's (2 clients) |") and identity[2:] == [
        "| ours | – | 2 | 1/1 |"]


def test_loads_are_ordered_so_the_servers_under_one_load_sit_together():
    records = [_record(mode, slots=slots, clients=clients) for slots in (4, 1) for mode in ("ar", "spec-auto")
               for clients in (8, 1)]
    assert list(summaries(records)) == [("humaneval", "greedy", slots, clients, mode) for slots in (1, 4)
                                        for clients in (1, 8) for mode in ("ar", "spec-auto")]


def _load(mode, tokens_per_s, decode_wall, *, slots=4, clients=4, family=None, k=None, target="bf16"):
    """Two answers of 11 tokens in `20 / tokens_per_s` s of wall time, streaming together for decode_wall s."""
    return [_record(mode, f"p{i}", slots=slots, clients=clients, family=family, k=k, target=target, tokens=11,
                    wall=22 / tokens_per_s, first=1.0, finished=1.0 + decode_wall) for i in range(2)]


def test_the_summary_gives_our_servers_over_llama_server_and_over_one_slot():
    records = (_load("spec-auto", 11.0, 2.0) + _load("llamacpp-server", 8.8, 4.0)
               + _load("llamacpp-spec-k3", 5.5, 5.0, family="llamacpp-spec", k=3)
               + _load("llamacpp-spec-k4", 4.4, 4.0, family="llamacpp-spec", k=4)
               + _load("spec-auto", 10.0, 2.5, slots=1))
    table = peer_table(records)
    rows = table.splitlines()[2:]
    # tokens/s 11 over 8.8 and decode tokens/s (20 / 2) over (20 / 4); -md's best K by decode: K = 4 (20 / 4 > 20 / 5).
    # The 1-slot load has no peer to compare with: no row.
    assert rows == ["| bf16 | humaneval | greedy | 4 | 4 | spec-auto | 1.25 / 2.00 | 2.50 / 2.00 (K=4) | 1.10 / 1.25 |"]
    assert peer_table(_load("ar", 1.0, 1.0, slots=1)) is None  # nothing to compare with


def test_greedy_identity_is_against_ar_with_the_fewest_slots_and_clients():
    records = [_record("ar", "p0", text="a", slots=1, clients=1), _record("ar", "p1", text="b", slots=1, clients=1),
               _record("ar", "p0", text="a", slots=4), _record("ar", "p1", text="c", slots=4),
               _record("spec-auto", "p0", text="a", slots=4), _record("spec-auto", "p1", text="b", slots=4),
               _record("spec-auto", "p2", text="x", slots=4),  # ar never answered p2: left out
               _record("llamacpp-server", "p0", text="x", slots=4, error="boom")]  # not answered: left out
    identity = serve_sections(records)[0][-1]
    assert identity.splitlines()[0].endswith("| greedy answers identical to ar's (1 slots, 1 clients) |")
    assert identity.splitlines()[2:] == ["| ar | 4 | 2 | 1/2 |", "| spec-auto | 4 | 2 | 2/2 |"]
    alone = serve_sections(records[:2])[0]  # ar alone: nothing to compare, no section
    assert alone[0] == "## Serving load" and not any("exactness" in part for part in alone)


def test_the_serve_report_has_a_section_per_target_and_keeps_every_request(tmp_path):
    records = (_load("spec-auto", 11.0, 2.0, target="q4_k_m") + _load("llamacpp-server", 8.8, 4.0, target="q4_k_m")
               + _load("spec-auto", 11.0, 2.0) + _load("llamacpp-server", 8.8, 4.0))
    records.append(_record("ar", "p3", target="bf16", error="APIStatusError: 503", status=503, text="", tokens=0))
    sections, printed = started_sections(records)
    headings = [s for s in sections if s.startswith("## ")]
    assert headings == ["## Summary: against llama-server, and against one slot",  # no ar answered: no exactness
                        "## Serving load (target q4_k_m)", "## Serving load (target bf16)"]
    assert "| q4_k_m | humaneval | greedy | 4 | 4 | spec-auto | 1.25 / 2.00 |" in sections[2]
    assert "Target bf16:" in printed and sections[2] in printed
    write_serve_report(tmp_path, records, sections, command="specsample bench --serve", machine="m", notes=["a note"])
    report = (tmp_path / "serve.md").read_text()
    assert sections[2] in report and "`specsample bench --serve`" in report and "- a note" in report
    assert "| 0/1 | 1 (503: 1) | 0 |" in report
    lines = (tmp_path / "serve.jsonl").read_text().splitlines()
    assert [ServedRecord.from_json(json.loads(line)) for line in lines] == records  # flat on disk, whole on reading
    assert json.loads(lines[-1])["status"] == 503 and "status" not in json.loads(lines[0])

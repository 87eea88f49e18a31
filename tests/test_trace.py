"""The planner's decision trace (policy/trace.py): a traced run is the untraced run,
one JSON line per round that adds up to the run's statistics, alone and in a batch;
no trace costs no call; the summary and `specsample trace`."""

import io
import json

import pytest

from specsample.cli import main
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate, generate_many
from specsample.decoding.sampling import SamplingConfig
from specsample.policy import trace as trace_module
from specsample.policy.make import make_policy
from specsample.policy.control import Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Prices
from specsample.policy.trace import Trace, format_summary, read_lines, summarise, traced

from test_distribution import MIXED_DRAFT, MIXED_PROMPT, MIXED_TARGET
from test_planner_batch import CostedSequences, draft_cost, target_cost
from toy import CostedBackend, FakeClock, TrigramBackend, random_table

pytestmark = pytest.mark.pure

SAMPLED = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig(temperature=0.0)
LINE_KEYS = {"round", "t", "load", "barred", "probe", "prices", "predicted", "seqs", "target", "draft", "seconds",
             "kind"}
SEQ_KEYS = {"seat", "seq", "offer", "lag", "reading", "stalls", "options", "chosen", "catch_up", "why", "left_out",
            "drafted", "accepted", "emitted", "seconds"}


def alone(trace=None, prompts=4, tokens=30):
    """-k auto over the hybrid drafter on toys whose calls cost fake seconds, one
    planner across `prompts` sequences; returns the results."""
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(MIXED_TARGET), clock, lambda m: 1.0 + 0.1 * (m - 1))
    draft = CostedBackend(TrigramBackend(MIXED_DRAFT), clock, lambda m: 0.3 + 0.02 * (m - 1))
    policy = make_policy("auto", 4, target, draft, context=MIXED_PROMPT, clock=clock)
    policy.planner.trace = trace
    results = []
    for seed in range(prompts):
        model = ModelDrafter(draft, SAMPLED)
        model.clock = clock
        config = GenerationConfig(max_new_tokens=tokens, sampling=SAMPLED, seed=seed)
        results.append(generate(target, MIXED_PROMPT, config, HybridDrafter(model, NgramDrafter(max_ngram=2)), policy,
                                clock=clock))
    return results


def batch(trace=None, prompts=4):
    """Two sequences at a time sharing each call (batching.Scheduler), one planner."""
    clock = FakeClock()
    target = CostedSequences(MIXED_TARGET, 2, clock, target_cost)
    draft = CostedSequences(MIXED_DRAFT, 2, clock, draft_cost, name="draft")
    prices = Prices(Curve({1: target_cost(1), 32: target_cost(32)}), Curve({1: draft_cost(1), 16: draft_cost(16)}))
    policy = Planner(4, prices, clock, trace=trace).seat()

    def make_drafter(slot):
        model = ModelDrafter(slot, SAMPLED)
        model.clock = clock
        return HybridDrafter(model, NgramDrafter(max_ngram=2))

    configs = [GenerationConfig(max_new_tokens=12 + 3 * i, sampling=SAMPLED, seed=i) for i in range(prompts)]
    results, _ = generate_many(target, [MIXED_PROMPT, [3, 4, 5]] * (prompts // 2), configs, draft, make_drafter,
                               policy, clock=clock)
    return results


def traced_lines(run):
    out = io.StringIO()
    results = run(Trace(out))
    return results, [json.loads(line) for line in out.getvalue().splitlines()]


def same_run(a, b, timed=True):
    """The same tokens from the same rounds (and, where the streams ran on the fake
    clock, `timed`, the same seconds)."""
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.stats.draft_length_histogram == y.stats.draft_length_histogram
        assert x.stats.sources == y.stats.sources
        assert x.stats.total_seconds == y.stats.total_seconds or not timed


def test_a_traced_run_is_the_untraced_run_and_each_round_is_one_line():
    results, lines = traced_lines(alone)
    same_run(alone(), results)
    rounds = sum(sum(r.stats.draft_length_histogram) for r in results)
    assert len(lines) == rounds and [line["round"] for line in lines] == list(range(rounds))
    planned = [line for line in lines if line["t"] is not None]
    assert len(planned) >= rounds - 2 * len(results)  # only a stream's first token (free) and a budget's last go unplanned
    for line in planned:
        assert set(line) == LINE_KEYS and len(line["seqs"]) == 1
        seq = line["seqs"][0]
        assert set(seq) == SEQ_KEYS
        options = {(o[0], o[1]): o for o in seq["options"]}
        assert seq["options"][0][:3] == ["plain", 0, 1.0]
        assert tuple(seq["chosen"]) in options  # the choice was one of the options priced
        best = max(o[4] for o in seq["options"])
        assert options[tuple(seq["chosen"])][4] == best  # alone: the best priced option
        assert line["predicted"]["seconds"] == options[tuple(seq["chosen"])][3]
        assert seq["drafted"] <= 4 and seq["accepted"] <= seq["drafted"] and 1 <= seq["emitted"] <= seq["accepted"] + 1
        assert line["target"]["calls"] <= 1 and line["seconds"] >= line["target"]["seconds"]
        # The prices priced every call size its options make.
        assert {str(1 + o[1]) for o in seq["options"]} <= set(line["prices"]["target"])
    kinds = {line["kind"] for line in lines}
    assert {"plain", "model", "lookup"} <= kinds
    assert {line["seqs"][0]["why"] for line in lines} >= {"priced higher", "last", "free"}


def test_the_summary_adds_up_to_the_runs_statistics():
    results, lines = traced_lines(alone)
    summary = summarise(lines)
    stats = [r.stats for r in results]
    assert summary.rounds == summary.sequence_rounds == sum(sum(s.draft_length_histogram) for s in stats)
    assert summary.tokens == sum(s.new_tokens for s in stats)
    assert sum(row.rounds for row in summary.by_kind.values()) == summary.rounds
    assert sum(row.tokens for row in summary.by_kind.values()) == summary.tokens
    assert sum(summary.why_plain.values()) + sum(summary.drafted_from.values()) == summary.sequence_rounds
    assert summary.drafted_from["model"] == sum(s.sources.get("model", [0])[0] for s in stats)
    drafted_nothing = sum(seq["drafted"] == 0 for line in lines for seq in line["seqs"])
    assert drafted_nothing == sum(s.plain_rounds for s in stats)
    # On a fake clock the rounds' time is the models' calls and nothing else: the
    # realised seconds are the stream's.
    assert summary.seconds == pytest.approx(sum(s.total_seconds - s.prefill_seconds
                                                for s in stats))
    table = format_summary(summary)
    for kind in summary.by_kind:
        assert f"| {kind} | {summary.by_kind[kind].rounds} |" in table


def test_a_batch_round_is_one_line_with_every_sequence_in_it():
    results, lines = traced_lines(batch)
    same_run(batch(), results, timed=False)  # generate_many's streams keep their stats on the real clock
    summary = summarise(lines)
    assert summary.tokens == sum(r.stats.new_tokens for r in results)
    assert summary.sequence_rounds == sum(sum(r.stats.draft_length_histogram) for r in results)
    shared = [line for line in lines if len(line["seqs"]) == 2]
    assert shared and all(len({s["seat"] for s in line["seqs"]}) == 2 for line in shared)
    for line in shared:
        # One target call for both: its tokens are both sequences' drafts, each one's
        # pending token but in its first round (the prefill's row predicts it), and
        # the prompt read beside them (load).
        drafted = sum(s["drafted"] for s in line["seqs"])
        assert line["target"]["calls"] == 1 and drafted <= line["target"]["tokens"] - line["load"] <= drafted + 2
    # generate_many seats each sequence anew (policy.fork()): four seats, a sequence each.
    assert {(s["seat"], s["seq"]) for line in lines for s in line["seqs"]} == {(i, 1) for i in range(4)}


def test_a_draft_behind_a_long_prompt_shows_as_catch_up_rounds():
    clock = FakeClock()
    table = random_table(8, seed=3)
    target = CostedBackend(TrigramBackend(table), clock, lambda n: 1.0 + 0.02 * (n - 1))
    draft = CostedBackend(TrigramBackend(table, name="draft"), clock, lambda n: 0.05 + 0.005 * (n - 1))
    drafter = ModelDrafter(draft, GREEDY)
    drafter.clock = clock
    out = io.StringIO()
    prices = Prices(Curve({n: 1.0 + 0.02 * (n - 1) for n in (1, 2, 4, 8, 16)}), Curve({1: 0.05, 16: 0.2}))
    planner = Planner(6, prices, clock, trace=Trace(out))
    result = generate(target, [i % 8 for i in range(3000)], GenerationConfig(max_new_tokens=300, sampling=GREEDY),
                      drafter, planner.seat(), clock)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    summary = summarise(lines)
    assert summary.by_kind["catch-up"].rounds > 0 and summary.catch_up_tokens > 0 and summary.catch_up_seconds > 0
    assert summary.why_plain["stalls"] > 0  # before it caught up, the model was left out for its unread text
    assert any(line["seqs"][0].get("left_out") == {"model": "stalls"} for line in lines)
    assert summary.tokens == result.stats.new_tokens


def test_no_trace_costs_no_call(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the trace was touched")

    for name in ("begun", "planned", "called", "reported"):
        monkeypatch.setattr(Trace, name, refuse)
    monkeypatch.setattr(trace_module, "_planned", refuse)
    assert Planner().trace is None
    results = alone(prompts=2)
    assert sum(r.stats.new_tokens for r in results) == 60
    batch(prompts=2)


def test_each_line_is_on_disk_as_soon_as_its_round_ends(tmp_path):
    """A server killed mid-run leaves every finished round readable: the file is
    flushed per line, and a cut last line is left out."""
    path = tmp_path / "trace.jsonl"
    trace = Trace(path)
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(MIXED_TARGET), clock, lambda m: 1.0 + 0.1 * (m - 1))
    draft = CostedBackend(TrigramBackend(MIXED_DRAFT), clock, lambda m: 0.3)
    model = ModelDrafter(draft, GREEDY)
    result = generate(target, MIXED_PROMPT, GenerationConfig(max_new_tokens=20, sampling=GREEDY), model,
                      Planner(4, clock=clock, trace=trace).seat(), clock=clock)
    lines, bad = read_lines(path)  # not closed yet
    assert bad == 0 and sum(s["emitted"] for line in lines for s in line["seqs"]) == result.stats.new_tokens
    trace.close()
    with open(path, "a") as f:
        f.write('{"round": 99, "se')
    assert read_lines(path) == (lines, 1)


def test_traced_refuses_a_fixed_k_and_the_trace_command_prints_the_summary(tmp_path, capsys):
    with pytest.raises(ValueError, match="-k auto"):
        traced(make_policy(3), tmp_path / "never.jsonl")
    path = tmp_path / "trace.jsonl"
    with traced(make_policy("auto"), path) as trace:
        assert isinstance(trace, Trace)
    assert path.read_text() == ""
    results, lines = traced_lines(alone)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(lines)} rounds") and "| round kind |" in out and "price error" in out
    assert main(["trace", str(tmp_path / "missing.jsonl")]) == 2

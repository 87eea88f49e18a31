"""The cost cache is read as untrusted input: an entry that cannot be a measurement
is measured again, with one line, never a crash on every -k auto request."""

import json
import logging
import math

import pytest

from specsample.cli import main
from specsample.policy.calibrate import measure, wide_sizes
from specsample.policy.make import make_policy

from test_cli import tiny_dirs  # noqa: F401 (a fixture)
from toy import CostedBackend, FakeClock, TrigramBackend, random_table

pytestmark = pytest.mark.pure

GOOD = {"target": [1.0, 1.5, 2.0, 2.5], "reps": 3, "verify_after_draft": True, "draft_step": 0.2, "draft_first": 0.2,
        "draft_token": 0.05, "draft_long": 6.55}  # the draft of pair() reading 128 tokens: 0.2 + 0.05 * 127
BAD = {
    "zeros": dict(GOOD, target=[0.0, 0.0, 0.0, 0.0]),
    "negative": dict(GOOD, draft_step=-0.2),
    "strings": dict(GOOD, target=["1.0", "1.5", "2.0", "2.5"]),
    "nan": dict(GOOD, target=[math.nan, 1.5, 2.0, 2.5]),
    "infinite draft": dict(GOOD, draft_first=math.inf),
    "booleans": dict(GOOD, target=[True, True, True, True]),
    "nested": dict(GOOD, target=[[1.0], [1.5], [2.0], [2.5]]),
    "target not a list": dict(GOOD, target=1.0),
    "not a dict": [1.0, 1.5, 2.0, 2.5],
    "larger calls not a dict": dict(GOOD, target_wide=[4.5, 6.5]),
    "larger calls keyed by words": dict(GOOD, target_wide={"eight": 4.5}),
    "larger calls keyed by 1": dict(GOOD, target_wide={"1": 4.5}),
    "larger calls keyed by other digits": dict(GOOD, target_wide={"\u0668": 4.5}),
    "larger call free": dict(GOOD, target_wide={"8": 0.0}),
}


def pair():
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(random_table(5, 0)), clock, lambda n: 1.0 + 0.5 * (n - 1))
    draft = CostedBackend(TrigramBackend(random_table(5, 1)), clock, lambda n: 0.2 + 0.05 * (n - 1))
    return target, draft, clock


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_entry_is_measured_again_with_one_line(tmp_path, caplog, name):
    target, draft, clock = pair()
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps(BAD[name]))  # json.dumps writes NaN and Infinity, as a broken run could
    with caplog.at_level(logging.WARNING):
        policy = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls > 0  # measured
    assert policy.planner.prices.target(3) == pytest.approx(2.0) and policy.planner.prices.draft(1) == pytest.approx(0.2)
    written = json.loads(cache.read_text())  # the bad entry replaced
    assert written.keys() == GOOD.keys() and written["target"] == pytest.approx(GOOD["target"])
    assert all(written[key] == pytest.approx(GOOD[key]) for key in GOOD if key != "target")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(cache) in lines[0] and "\n" not in lines[0]


def test_a_good_entry_is_used_as_it_is_without_a_word(tmp_path, caplog):
    target, draft, clock = pair()
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps(dict(GOOD, target=[2.0, 2.2, 2.4, 2.6], draft_token=0.0)))  # catching up may be free
    with caplog.at_level(logging.WARNING):
        policy = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls == 0 and policy.planner.prices.target(2) == pytest.approx(2.2)
    assert not caplog.records


def test_an_entry_too_short_for_k_max_is_measured_again_without_a_word(tmp_path, caplog):
    target, draft, clock = pair()
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps(dict(GOOD, target=[1.0, 1.5])))
    with caplog.at_level(logging.WARNING):
        make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls > 0 and not caplog.records


def test_an_entry_of_one_timed_call_per_size_is_measured_again_without_a_word(tmp_path, caplog):
    target, draft, clock = pair()
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "reps"}))  # as written before medians
    with caplog.at_level(logging.WARNING):
        make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls > 0 and not caplog.records
    assert json.loads(cache.read_text())["reps"] == 3


def test_an_entry_priced_before_verify_calls_followed_a_draft_step_is_measured_again_without_a_word(tmp_path, caplog):
    target, draft, clock = pair()
    cache = tmp_path / "costs.json"
    cache.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "verify_after_draft"}))  # back to back
    with caplog.at_level(logging.WARNING):
        make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls > 0 and not caplog.records
    assert json.loads(cache.read_text())["verify_after_draft"] is True


def test_calls_are_timed_as_decoding_makes_them():
    """A plain step back to back; a verify call right after a draft step, which costs it
    `cold` more (the measurement a round pays, not the one a target timed alone sees);
    without a draft model, both back to back; the first draft step of a round right
    after a target call."""
    def cost(n):
        return 1.0 + 0.5 * (n - 1)

    clock = FakeClock()
    target = CostedBackend(TrigramBackend(random_table(5, 0)), clock, cost, cold=0.3)
    draft = CostedBackend(TrigramBackend(random_table(5, 1)), clock, lambda n: 0.2 + 0.05 * (n - 1), cold=0.1)
    measured = measure(target, draft, [1, 2, 3], 4, clock=clock, wide=[8])
    assert measured["target"] == pytest.approx([1.0, 1.8, 2.3, 2.8])
    assert measured["target_wide"] == pytest.approx({"8": cost(8) + 0.3})
    assert measured["draft_step"] == pytest.approx(0.2) and measured["draft_first"] == pytest.approx(0.3)
    assert measured["verify_after_draft"] is True
    alone = measure(target, None, [1, 2, 3], 4, clock=clock, wide=[8])
    assert alone["target"] == pytest.approx([cost(n) for n in range(1, 5)])
    assert alone["target_wide"] == pytest.approx({"8": cost(8)}) and alone["verify_after_draft"] is False


def test_the_command_line_recalibrates_a_corrupt_cache_in_one_line(capsys, caplog, tiny_dirs, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """Before, a zero made every -k auto run end in a ZeroDivisionError traceback. The
    line goes through logging: to stderr as it is where nothing configured logging (the
    command line), to the server's log under uvicorn; pytest's own handler takes it here."""
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path))
    argv = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "the cat sat on",
            "--max-new-tokens", "6", "-k", "auto", "--json",
            "--threads", "1"]  # the cache is keyed by the thread count, which otherwise follows the free cores
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    [cache] = (tmp_path / "costs").glob("*.json")
    cache.write_text(json.dumps(dict(json.loads(cache.read_text()), target=[0, 0, "x"])))
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["token_ids"] == first["token_ids"]
    [line] = [r.getMessage() for r in caplog.records]
    assert "cost cache" in line and "\n" not in line and "Traceback" not in err
    assert all(seconds > 0 for seconds in json.loads(cache.read_text())["target"])


def test_wide_sizes_are_a_few_steps_up_to_the_largest_batch():
    assert wide_sizes(9, 1) == []  # one sequence: its own calls of 1 .. 9 tokens
    assert wide_sizes(9, 2) == [12, 16]  # 18: within a quarter of 16, interpolated
    assert wide_sizes(9, 4) == [12, 16, 24, 32]
    assert wide_sizes(9, 8) == [12, 16, 24, 32, 48, 64]
    assert wide_sizes(3, 4) == [8, 12]
    assert wide_sizes(7, 3) == [8, 12, 16, 21]  # 21: past 16 by more than a quarter


def test_a_cache_measured_for_fewer_sequences_is_extended_with_the_larger_calls(tmp_path, caplog):
    def cost(n):  # flat at first, then dearer by the token: no straight line through 1 .. 4 foretells it
        return 1.0 + 0.1 * (n - 1) + 0.05 * max(0, n - 4) ** 2

    clock = FakeClock()
    target = CostedBackend(TrigramBackend(random_table(5, 0)), clock, cost)
    draft = CostedBackend(TrigramBackend(random_table(5, 1)), clock, lambda n: 0.2 + 0.05 * (n - 1))
    cache = tmp_path / "costs.json"
    alone = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    first = json.loads(cache.read_text())
    assert "target_wide" not in first
    assert alone.planner.prices.target(16) != pytest.approx(cost(16))  # extrapolated from 3 and 4 tokens

    calls, draft_calls = target.calls, draft.calls
    with caplog.at_level(logging.WARNING):
        four = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock, parallel=4)
    assert target.calls - calls == 2 + 3 * 3  # 2 warm-ups, 3 x 8, 12, 16
    assert draft.calls - draft_calls == 1 + 3 * 3  # its one-token context, then a step before each timed call
    written = json.loads(cache.read_text())
    assert written["target_wide"] == pytest.approx({str(n): cost(n) for n in (8, 12, 16)})
    assert {k: v for k, v in written.items() if k != "target_wide"} == first  # kept, not measured again
    assert [four.planner.prices.target(n) for n in (12, 16)] == pytest.approx([cost(12), cost(16)])
    assert four.planner.prices.target(10) == pytest.approx((cost(8) + cost(12)) / 2)
    assert not caplog.records

    calls = target.calls
    for parallel in (4, 2, 1):  # covered: nothing measured
        make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock, parallel=parallel)
    assert target.calls == calls
    with pytest.raises(ValueError):
        make_policy("auto", 3, target, draft, cost_cache=cache, clock=clock, parallel=0)

import pytest

from benchmarks.parity import wilson_interval
from specsample.bench.stats import percentile, summarise

from bench_helpers import record

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("q,expected", [(0, 1.0), (50, 2.5), (90, 3.7), (99, 3.97), (100, 4.0)])
def test_percentile_interpolates_like_numpy(q, expected):
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


def test_percentile_of_one_value_and_errors():
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_wilson_interval():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson_interval(0, 4)[0] == 0.0 and wilson_interval(0, 4)[1] > 0.4  # not the degenerate [0, 0]
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _record(mode, family, tokens, seconds, accepted=0, drafted=0, calls=None, k=None):
    stats = {"new_tokens": tokens, "accepted": accepted, "drafted": drafted, "target_calls": calls or tokens}
    return record(mode=mode, family=family, k=k, stats=stats, latency_seconds=seconds)


def test_summarise_aggregates_and_speedup():
    records = [_record("ar", "ar", 10, 2.0), _record("ar", "ar", 10, 2.0),
               _record("spec-k2", "spec", 10, 1.0, accepted=6, drafted=8, calls=4, k=2),
               _record("spec-k2", "spec", 10, 1.0, accepted=6, drafted=8, calls=4, k=2)]
    ar, spec = summarise(records)
    assert ar.tokens_per_second == pytest.approx(5.0) and ar.speedup == pytest.approx(1.0)
    assert spec.speedup == pytest.approx(2.0)
    assert spec.acceptance_rate == pytest.approx(0.75)
    assert spec.tokens_per_target_call == pytest.approx(2.5)
    assert spec.latency(50) == pytest.approx(1.0)


def test_kinds_get_rows_of_their_own_after_the_overall_one_with_time_to_first_token():
    def timed(mode, kind, tokens, seconds, first):
        stats = {"new_tokens": tokens, "target_calls": tokens, "prefill_seconds": (first or 0.2) / 2}
        if first is not None:
            stats["first_token_seconds"] = first
        return record(mode=mode, family=mode, task="chat", kind=kind, stats=stats, latency_seconds=seconds)

    records = [timed("ar", "writing", 10, 2.0, 0.5), timed("ar", "rag", 10, 4.0, 3.0),
               timed("spec-auto", "writing", 10, 1.0, 0.4), timed("spec-auto", "rag", 10, 4.0, 3.3),
               timed("peer", "writing", 10, 1.0, None), timed("peer", "rag", 10, 1.0, 1.0)]
    rows = {(s.task, s.mode): s for s in summarise(records)}
    assert [s.task for s in summarise(records)][:3] == ["chat", "chat/writing", "chat/rag"]
    assert rows["chat", "ar"].sequences == 2 and rows["chat/rag", "ar"].sequences == 1
    assert rows["chat", "ar"].time_to_first_token == pytest.approx(1.75)  # the median of 0.5 and 3.0
    assert rows["chat/writing", "spec-auto"].first_token_ratio == pytest.approx(0.8)
    assert rows["chat/rag", "spec-auto"].first_token_ratio == pytest.approx(1.1)
    assert rows["chat/writing", "spec-auto"].speedup == pytest.approx(2.0)
    assert rows["chat/rag", "spec-auto"].speedup == pytest.approx(1.0)
    # A mode that reported no time for one of its sequences has no median to show.
    assert rows["chat", "peer"].time_to_first_token is None and rows["chat/rag", "peer"].time_to_first_token == 1.0
    assert rows["chat", "peer"].first_token_ratio is None


def test_two_proportion_z_test_worked_example():
    from benchmarks.parity import two_proportion_z_test

    z, p = two_proportion_z_test(40, 100, 50, 100)
    assert z == pytest.approx(-1.4213, abs=1e-3) and p == pytest.approx(0.1552, abs=1e-3)
    assert two_proportion_z_test(5, 5, 7, 7) == (0.0, 1.0)  # no variance: no evidence
    assert two_proportion_z_test(0, 0, 1, 2) == (0.0, 1.0)

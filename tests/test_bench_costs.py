import pytest

from benchmarks.costs import break_even_alpha, expected_tokens_per_round, predict, predicted_speedup, recommend

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("alpha,k,expected", [
    (0.0, 4, 1.0),  # every draft rejected: one token per round
    (1.0, 4, 5.0),  # every draft accepted, plus the bonus token
    (0.5, 1, 1.5),
    (0.5, 3, 1.875),  # 1 + .5 + .25 + .125
    (0.8, 4, (1 - 0.8**5) / 0.2),
])
def test_expected_tokens_per_round(alpha, k, expected):
    assert expected_tokens_per_round(alpha, k) == pytest.approx(expected)


def test_expected_tokens_rejects_bad_alpha():
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 2)


def test_predicted_speedup_worked_example():
    # Target: 100 ms for 1 token, 120 ms for 3; draft step 10 ms; alpha 0.8, K=2.
    # E = 1 + .8 + .64 = 2.44; time/token = (2*10 + 120) / 2.44 = 57.38 ms; speedup 100/57.38.
    target_cost = [0.100, 0.110, 0.120]
    assert predicted_speedup(0.8, 2, 0.010, target_cost) == pytest.approx(0.100 / (0.140 / 2.44))


def test_free_perfect_drafter_with_flat_target_cost_gives_k_plus_one():
    assert predicted_speedup(1.0, 3, 0.0, [1.0] * 4) == pytest.approx(4.0)


def test_recommend_picks_the_best_k():
    # A flat target cost and a cheap draft: longer drafts pay until alpha^K dies off.
    preds = predict({1: 0.9, 2: 0.9, 4: 0.9, 8: 0.9}, 0.01, [0.1] * 9)
    best = recommend(preds)
    assert best is not None and best.k == max(preds, key=lambda p: p.speedup).k and best.speedup > 1


def test_recommend_says_none_when_no_k_pays():
    # Target cost grows linearly with tokens scored and the draft is costly: never pays.
    target_cost = [0.1 * n for n in range(1, 6)]
    preds = predict({1: 0.5, 2: 0.5, 4: 0.5}, 0.05, target_cost)
    assert all(p.speedup < 1 for p in preds)
    assert recommend(preds) is None


def test_predict_skips_unmeasured():
    preds = predict({1: 0.5, 2: None, 9: 0.5}, 0.0, [0.1, 0.1, 0.1])
    assert [p.k for p in preds] == [1]


def test_prediction_uses_plain_decoding_as_the_baseline_and_warm_later_draft_steps():
    # A 1-token call costs 100 ms after a draft step but 80 ms in plain decoding; the
    # round's first draft step 20 ms, the next 10 ms. K=2, alpha 0.8: E = 2.44,
    # time/token = (20 + 10 + 120) / 2.44; the baseline is the plain 80 ms.
    target_cost = [0.100, 0.110, 0.120]
    got = predicted_speedup(0.8, 2, 0.020, target_cost, plain=0.080, draft_step=0.010)
    assert got == pytest.approx(0.080 / (0.150 / 2.44))
    assert predict({2: 0.8}, 0.020, target_cost, 0.080, 0.010)[0].speedup == pytest.approx(got)


def test_break_even_acceptance_is_where_the_predicted_speedup_crosses_one():
    # Target 100 ms for 1 token, 140 ms for 2; draft step 20 ms; K = 1: a round costs
    # 160 ms and yields 1 + alpha tokens, so it breaks even at 1 + alpha = 1.6.
    target_cost = [0.100, 0.140]
    alpha = break_even_alpha(1, 0.020, target_cost)
    assert alpha == pytest.approx(0.6)
    assert predicted_speedup(alpha + 0.01, 1, 0.020, target_cost) > 1 > predicted_speedup(alpha - 0.01, 1, 0.020,
                                                                                          target_cost)
    # A dearer call (a network's fixed cost paid once per call, here 50 ms) breaks even lower.
    assert break_even_alpha(1, 0.020, [0.150, 0.190]) < alpha


def test_break_even_is_none_where_even_a_perfect_drafter_loses():
    # 2 tokens in 200 ms plus a 50 ms draft step: slower than two 100 ms plain steps.
    assert break_even_alpha(1, 0.050, [0.100, 0.200]) is None

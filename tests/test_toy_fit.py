"""The suite's goodness-of-fit helper (toy.assert_fits): its chi-square tail is exact
where a closed form exists, far into the tail where ALPHA sits, and a fit catches a
sampler off by the difference the distribution tests say they detect."""

import math

import pytest
import torch

from toy import ALPHA, _p_value, assert_fits, assert_misfits, chi_square_tail

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 3.0, 10.0, 30.0, 60.0, 120.0])
def test_the_tail_matches_its_closed_forms(x):
    assert chi_square_tail(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
    assert chi_square_tail(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
    assert chi_square_tail(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-9)
    # even dof: Q = exp(-x/2) * sum_{i < dof/2} (x/2)^i / i!
    assert chi_square_tail(x, 40) == pytest.approx(
        math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(20)), rel=1e-9)


def test_the_level_is_where_it_says_in_the_far_tail():
    # chi-square(1) exceeds 23.928 with probability 1.0e-6 (the normal's 4.8916 sigma, squared)
    assert chi_square_tail(4.891638475 ** 2, 1) == pytest.approx(1e-6, rel=1e-6)


def exact_and_draws(n: int, seed: int, shift: float = 0.0):
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    drawn = probs + shift * torch.tensor([1.0, -1.0, 0.0, 0.0])
    g = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(drawn, n, replacement=True, generator=g)
    counts = {(t,): c for t, c in enumerate(torch.bincount(tokens, minlength=4).tolist()) if c}
    return counts, {(t,): float(p) for t, p in enumerate(probs)}


def test_a_correct_sampler_fits_and_one_off_by_point_05_does_not():
    counts, exact = exact_and_draws(4000, seed=0)
    assert_fits(counts, exact, 4000)
    counts, exact = exact_and_draws(4000, seed=0, shift=0.05)  # 0.05 of mass moved from token 1 to 0
    assert _p_value(counts, exact, 4000) < ALPHA
    with pytest.raises(AssertionError, match="fits the exact distribution"):
        assert_fits(counts, exact, 4000)
    assert_misfits(counts, exact, 4000)


def test_a_draw_outside_the_support_never_fits():
    assert _p_value({(5,): 1}, {(0,): 1.0}, 1) == 0.0

"""`check` under -k auto: the planner drafts from its own timings, as in use, here
the timings of a fake clock that toy backends move by what their calls cost, so
what it chooses is the same in every run, whatever else the machine is doing."""

import pytest

from specsample.app.check import CheckConfig, check
from specsample.decoding import rounds as rounds_module
from specsample.decoding.drafters import ModelDrafter
from specsample.policy.make import make_policy

from test_check import DRAFT, PROMPTS, SAMPLING, TARGET
from test_distribution import accept_everything
from toy import CostedBackend, FakeClock, TrigramBackend, assert_fits, assert_misfits

pytestmark = pytest.mark.pure


# Per prompt, the chance that a correct sampler's counts fit worse than this; three
# prompts, so a false alarm rate of at most 3e-6 over the seeds such a run could draw
# (the seeds here are fixed, so the outcome is too).
ALPHA = 1e-6
# The wrong sampler's run: a quarter of the check's 1,500 samples (125 a prompt), where
# every prompt's pairs still fail at p < 1e-19 (8e-93 and below at 500 a prompt). A
# test's power grows with its sample, so what fails at 125 a prompt fails at 500.
CONTROL_SAMPLES = 375


def fits(result, assertion) -> list[float]:
    """Each prompt's sampled (x1, x2) pairs held to the exact ones by `assertion`; their p-values."""
    ps = []
    for prompt in result.prompts:
        exact = {cell.tokens: cell.exact for cell in prompt.cells}
        counts = {cell.tokens: round(cell.observed * prompt.samples) for cell in prompt.cells}
        ps.append(assertion(counts, exact, prompt.samples))
    return ps


@pytest.mark.parametrize("wrong_verify", [None, accept_everything])
def test_auto_checks_the_planners_own_draft_lengths(monkeypatch, wrong_verify):
    """-k auto: the planner drafts (up to k_max) as it would in use, where target calls
    cost the same for 1 to 5 tokens and the draft a tenth of one; the reference scores
    the second token in a one-token call; a wrong sampler fails."""
    if wrong_verify is not None:
        monkeypatch.setattr(rounds_module, "verify", wrong_verify)
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(TARGET), clock, lambda n: 1.0)
    drafter = ModelDrafter(CostedBackend(TrigramBackend(DRAFT, name="draft"), clock, lambda n: 0.1), SAMPLING)
    drafter.clock = clock
    policy = make_policy("auto", 4, target, drafter.model_backend, context=PROMPTS[0], clock=clock)
    samples = 1500 if wrong_verify is None else CONTROL_SAMPLES
    config = CheckConfig(samples=samples, sampling=SAMPLING)
    result = check(target, drafter, PROMPTS, config, policy=policy, clock=clock)
    assert all(p.acceptance_rate is not None for p in result.prompts)  # it drafted for every prompt
    if wrong_verify is None:
        fits(result, assert_fits)
    else:  # every prompt's pairs caught, far below the level, so no seed change makes one pass by chance
        assert max(fits(result, assert_misfits)) < 1e-3 * ALPHA

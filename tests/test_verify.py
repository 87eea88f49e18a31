"""Table-driven verify cases built from +-100 logits: each outcome is certain."""

import pytest
import torch

from specsample.decoding.sampling import sample
from specsample.decoding.verify import residual_distribution, verify

from toy import assert_fits, counted

pytestmark = pytest.mark.pure

HI, LO = 100.0, -100.0


def peaked(*tokens, vocab=4):
    """Rows of probabilities, each (numerically) all on one token."""
    logits = torch.full((len(tokens), vocab), LO)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = HI
    return torch.softmax(logits, -1)


CASES = [
    # name, draft tokens, draft peaks, target peaks, expected tokens, accepted
    ("all accepted + bonus", [1, 2], [1, 2], [1, 2, 3], [1, 2, 3], 2),
    ("first rejected, recovered", [1, 2], [1, 2], [0, 2, 3], [0], 0),
    ("second rejected, recovered", [1, 2], [1, 2], [1, 3, 0], [1, 3], 1),
    ("single draft accepted + bonus", [3], [3], [3, 0], [3, 0], 1),
    ("no drafts: bonus only", [], [], [2], [2], 0),
]


@pytest.mark.parametrize("name,drafts,draft_peaks,target_peaks,expected,accepted", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["model-draft", "one-hot-draft"])
def test_certain_outcomes(name, drafts, draft_peaks, target_peaks, expected, accepted, with_draft_probs):
    draft_probs = peaked(*draft_peaks) if with_draft_probs and drafts else None
    for seed in range(20):
        verdict = verify(torch.tensor(drafts, dtype=torch.long), draft_probs, peaked(*target_peaks),
                         torch.Generator().manual_seed(seed))
        assert verdict.tokens == expected
        assert verdict.num_accepted == accepted


def test_recovered_token_never_the_rejected_one_when_draft_is_one_hot():
    # Target spreads over {0, 1}; draft 1 is rejected with probability .5 and the
    # recovered token must then be 0: the target with 1 removed.
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    outcomes = set()
    for seed in range(200):
        v = verify(torch.tensor([1]), None, target, torch.Generator().manual_seed(seed))
        outcomes.add((v.num_accepted, v.tokens[0]))
    assert outcomes == {(0, 0), (1, 1)}


def test_acceptance_probability_is_min_one_ratio():
    # target(x)=.2, draft(x)=.8 -> accept with probability .25
    target = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    draft = torch.tensor([[0.8, 0.2]])
    g = torch.Generator().manual_seed(0)
    n = 20_000
    accepted = sum(verify(torch.tensor([0]), draft, target, g).num_accepted for _ in range(n))
    # binomial sd = sqrt(.25 * .75 / n) ~ .0031; allow 5 sd (two-sided: a false alarm 5.7e-7)
    counted(5.7e-7)
    assert abs(accepted / n - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5


def test_residual_with_no_mass_falls_back_to_target():
    target = torch.tensor([0.3, 0.7])
    assert torch.equal(residual_distribution(target, target.clone()), target)
    # A draft above the target everywhere, by one float32 step: what rounding makes of
    # a draft equal to the target. The residual clamps to zero.
    above = torch.nextafter(target, torch.ones(2))
    assert (above > target).all()
    assert torch.equal(residual_distribution(target, above), target)


def test_residual_with_a_little_mass_is_still_the_residual():
    # One float32 step below the target on one token: all the residual's mass is there.
    target = torch.tensor([0.3, 0.7])
    draft = torch.stack([target[0], torch.nextafter(target[1], torch.tensor(0.0))])
    assert torch.equal(residual_distribution(target, draft), torch.tensor([0.0, 1.0]))


def test_verify_follows_the_target_when_draft_equals_it_in_bfloat16():
    """Draft and target from the same logits, one softmax in float32 and one in
    bfloat16: equal but for rounding, so the rare rejections leave residuals of
    next to no mass. A recovered token must lie where the target exceeds the draft,
    and the first emitted token must follow the target row (a chi-square test over
    N = 20,000 rounds fails at p < 1e-3)."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    target = torch.softmax(logits, -1).to(torch.bfloat16)  # [3, 50]
    draft = torch.softmax(logits.to(torch.bfloat16), -1)  # [3, 50]
    g = torch.Generator().manual_seed(0)
    n, counts, rejections = 20_000, {}, 0
    for _ in range(n):
        drafts = sample(draft[:2].float(), g)  # [2]
        verdict = verify(drafts, draft[:2], target, g)
        first = (verdict.tokens[0],)
        counts[first] = counts.get(first, 0) + 1
        if verdict.num_accepted < 2:  # recovered from the residual: a token the target gives more than the draft
            at, recovered = verdict.num_accepted, verdict.tokens[-1]
            assert target[at, recovered] > draft[at, recovered]
            rejections += 1
    assert rejections > 0  # 9 at these seeds
    row = target[0].float() / target[0].float().sum()
    exact = {(token,): float(p) for token, p in enumerate(row)}
    assert_fits(counts, exact, n)

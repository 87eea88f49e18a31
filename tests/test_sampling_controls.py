"""min_p, logit_bias and the penalties keep speculative sampling exact: the output
follows the *processed* target distribution, enumerated with the same controls
(and, for the penalties, the same history: generated tokens counted from the
prompt's end). N = 6,000 sequences of 3 tokens (216 cells, about 28 expected in
each); chi-square p > toy.ALPHA = 1e-6 passes, p < ALPHA is a detected error.

Negative controls, each of which must fail, on CONTROL_N = 750 sequences (an eighth
of N: a test's power grows with its sample, so what fails at 750 fails at 6,000), at
p < 1e-11 (at 375 the weakest lands at 7e-9):
  * draft only: the drafter applies the control, the target does not. The output is
    then the unprocessed target's, which the check tells apart.
  * a verify call whose rows all see the history of its first row: row j must also
    count drafts[:j], or accepted drafts escape the penalty of the rows after them.
The converse of the first, the control applied to the target only, is not an error:
verification corrects any draft distribution, so it stays exact and only accepts
less often; test_target_only_control_is_exact_but_accepts_less says so.
"""

import pytest
import torch

from specsample.decoding import generate as generate_module
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import Sampler, SamplingConfig

from toy import ALPHA, TrigramBackend, assert_fits, assert_misfits, empirical, exact_distribution, random_table

pytestmark = pytest.mark.pure


VOCAB, LENGTH, N = 6, 3, 6_000
CONTROL_N = 750  # each negative control
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
CLOSE = TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0)
FAR = random_table(VOCAB, seed=2)

CONTROLS = {
    "min_p": SamplingConfig(min_p=0.1),
    "presence": SamplingConfig(presence_penalty=1.5),
    "frequency": SamplingConfig(frequency_penalty=0.8, temperature=0.9),
    "repetition": SamplingConfig(repetition_penalty=1.8),
    "logit_bias": SamplingConfig(logit_bias={0: 2.0, 3: -1.5}),
    "all": SamplingConfig(temperature=0.8, top_p=0.95, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5,
                          repetition_penalty=1.3, logit_bias={4: 1.0}),
}


def speculative(target_sampling, draft_sampling, draft_table=FAR, n=N):
    """n outputs of the target under `target_sampling`, drafted under `draft_sampling`
    with K = 3; and the share of drafts accepted."""
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=target_sampling, verifier="rejection")
    drafter, stats = ModelDrafter(TrigramBackend(draft_table, name="draft"), draft_sampling), []
    counts = empirical(n, TrigramBackend(TARGET), PROMPT, config, drafter, 3, stats=stats)
    return counts, sum(s.accepted for s in stats) / sum(s.drafted for s in stats)


def exact(sampling):
    return exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)


@pytest.mark.parametrize("name", list(CONTROLS))
def test_control_applied_to_both_sides_is_exact(name):
    sampling = CONTROLS[name]
    counts, _ = speculative(sampling, sampling)
    assert_fits(counts, exact(sampling), N)


@pytest.mark.parametrize("name", ["min_p", "presence", "repetition", "logit_bias"])
def test_negative_control_draft_only_fails(name):
    """At CONTROL_N: p = 0 for min_p, 4e-73 presence, 4e-12 repetition, 4e-223 logit_bias."""
    counts, _ = speculative(SamplingConfig(temperature=CONTROLS[name].temperature), CONTROLS[name], n=CONTROL_N)
    p = assert_misfits(counts, exact(CONTROLS[name]), CONTROL_N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


class FirstRowHistory(Sampler):
    """Wrong: every row of a block is processed with the history of its first row
    (the drafter's blocks are one row, so only the target's verify rows go wrong)."""

    def probs(self, logits, tokens, config):
        first = list(tokens)[: len(tokens) - logits.shape[0] + 1]
        return torch.cat([super(FirstRowHistory, self).probs(row[None], first, config) for row in logits])


@pytest.mark.parametrize("name", ["presence", "frequency"])
def test_negative_control_rows_blind_to_the_drafts_before_them_fail(monkeypatch, name):
    """At CONTROL_N: p ~ 2e-67 for presence, 1e-18 for frequency."""
    monkeypatch.setattr(generate_module, "Sampler", FirstRowHistory)
    sampling = CONTROLS[name]
    # long accepted runs: rows after drafts matter
    counts, _ = speculative(sampling, sampling, draft_table=CLOSE, n=CONTROL_N)
    p = assert_misfits(counts, exact(sampling), CONTROL_N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


def test_target_only_control_is_exact_but_accepts_less():
    sampling = CONTROLS["presence"]
    counts, unmatched = speculative(sampling, SamplingConfig(), draft_table=CLOSE)
    assert_fits(counts, exact(sampling), N)
    _, matched = speculative(sampling, sampling, draft_table=CLOSE, n=2000)
    # ~6,000 drafts each: a standard error near .004 on either rate
    assert matched > unmatched + 0.015


def test_a_logit_bias_id_past_the_vocabulary_is_refused_before_any_model_call():
    """The CLI's path (a library call) refuses it as the server does, rather than
    generating as if the bias were not there."""
    target = TrigramBackend(TARGET)
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=SamplingConfig(logit_bias={VOCAB: 5.0}))
    with pytest.raises(ValueError, match=rf"token ids in \[0, {VOCAB}\)"):
        generate(target, PROMPT, config, ModelDrafter(TrigramBackend(FAR, name="draft"), config.sampling), 3)
    assert target.length == 0

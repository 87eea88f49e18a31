"""The heart of the paper: speculative samples follow the target distribution.

Each check draws N = 20,000 sequences of L = 4 new tokens from a trigram toy target
(vocabulary 6, so 1,296 possible sequences) and compares their empirical joint
distribution with the exact one, enumerated from the same table, by a Pearson
chi-square test (cells with expected count < 5 pooled). The bound: the test fails
when p < 1e-3. Seeds are fixed, so a run is deterministic; with a correct sampler
each configuration has a 1-in-1000 chance of a false alarm at a given seed. The
negative controls show that the same check rejects wrong samplers outright.
"""

import importlib

import pytest
import torch

from specsample.drafters import ModelDrafter, NgramDrafter
from specsample.generate import GenerationConfig, generate
from specsample.sampling import SamplingConfig
from specsample.verify import Verdict, verify

from toy import TrigramBackend, chi_square_p_value, exact_distribution, random_table

# The module, not the function of the same name that specsample/__init__ exports.
generate_module = importlib.import_module("specsample.generate")

VOCAB, LENGTH, N, ALPHA = 6, 4, 20_000, 1e-3
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
DRAFTS = {
    "close": TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0),  # high acceptance
    "far": random_table(VOCAB, seed=2),  # unrelated: frequent rejections
}


def empirical(drafter_factory, sampling, k, n=N, seed=0):
    target = TrigramBackend(TARGET)
    drafter = drafter_factory(sampling)
    counts = {}
    for i in range(n):
        config = GenerationConfig(max_new_tokens=LENGTH, k=k, sampling=sampling, seed=seed * n + i)
        seq = tuple(generate(target, PROMPT, config, drafter).token_ids)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def model_drafter(kind):
    return lambda sampling: ModelDrafter(TrigramBackend(DRAFTS[kind], name=kind), sampling)


SETTINGS = [
    # draft, K, temperature, top_k, top_p
    ("close", 1, 1.0, 0, 1.0),
    ("close", 3, 1.0, 0, 1.0),
    ("far", 2, 1.0, 0, 1.0),
    ("far", 4, 0.7, 0, 1.0),
    ("close", 2, 1.3, 3, 1.0),
    ("far", 3, 1.0, 0, 0.8),
    ("close", 4, 0.8, 4, 0.9),
]


@pytest.mark.parametrize("kind,k,temperature,top_k,top_p", SETTINGS)
def test_model_drafter_preserves_target_distribution(kind, k, temperature, top_k, top_p):
    sampling = SamplingConfig(temperature, top_k, top_p)
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    counts = empirical(model_drafter(kind), sampling, k)
    assert chi_square_p_value(counts, exact, N) > ALPHA


@pytest.mark.parametrize("k,top_p", [(2, 1.0), (3, 0.9)])
def test_ngram_drafter_preserves_target_distribution(k, top_p):
    sampling = SamplingConfig(1.0, 0, top_p)
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    counts = empirical(lambda s: NgramDrafter(max_ngram=2), sampling, k)
    assert chi_square_p_value(counts, exact, N) > ALPHA


def test_autoregressive_preserves_target_distribution():
    sampling = SamplingConfig(0.9, 0, 0.95)
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    counts = empirical(lambda s: None, sampling, 1)
    assert chi_square_p_value(counts, exact, N) > ALPHA


def accept_everything(draft_tokens, draft_probs, target_probs, generator):
    bonus = torch.multinomial(target_probs[-1], 1, generator=generator)
    return Verdict(draft_tokens.tolist() + bonus.tolist(), len(draft_tokens))


def recover_from_target(draft_tokens, draft_probs, target_probs, generator):
    """Right acceptance rule, but resamples from the target instead of the residual."""
    verdict = verify(draft_tokens, draft_probs, target_probs, generator)
    n = verdict.num_accepted
    if n == len(draft_tokens):
        return verdict
    recovered = torch.multinomial(target_probs[n], 1, generator=generator)
    return Verdict(verdict.tokens[:n] + recovered.tolist(), n)


@pytest.mark.parametrize("wrong_verify", [accept_everything, recover_from_target])
def test_negative_control_wrong_sampler_fails_the_check(monkeypatch, wrong_verify):
    monkeypatch.setattr(generate_module, "verify", wrong_verify)
    sampling = SamplingConfig()
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    counts = empirical(model_drafter("far"), sampling, 2)
    assert chi_square_p_value(counts, exact, N) < ALPHA

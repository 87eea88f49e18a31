"""The coupled verifier (Gumbel-max with noise keyed by seed and position).

Its output must follow the target's distribution (chi-square on the toy trigram
model, N = 8,000 sequences of 3 tokens, p > 1e-3; one seed per sequence, so the
sequences are independent), and a seeded answer must be the same token for token
whatever drafts it (none, a draft model, n-gram lookup, any K, the adaptive
policy). The negative control reuses a position's noise at the next position:
each token still follows its own row, but neighbours are correlated, and the joint
distribution test must reject it: at CONTROL_N = 1,000 it does with p ~ 3e-63 (p = 0
at N). A test's power grows with its sample, so what fails at 1,000 fails at 8,000.
"""

import pytest
import torch

from specsample.decoding import sampling as sampling_module
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig, race_noise
from specsample.decoding.verify import verify_coupled
from specsample.policy.make import make_policy

from toy import (ALPHA, CostedBackend, FakeClock, TrigramBackend, assert_fits, assert_misfits, empirical,
                 exact_distribution, mixed_tables, random_table)

pytestmark = pytest.mark.pure


VOCAB, LENGTH, N = 6, 3, 8_000
CONTROL_N = 1_000  # the negative control: an eighth of N
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
FAR = random_table(VOCAB, seed=2)


def coupled(sampling, drafter, k, n=N):
    """n outputs of the target under the coupled verifier."""
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier="coupled")
    return empirical(n, TrigramBackend(TARGET), PROMPT, config, drafter, k)


@pytest.mark.parametrize("sampling,kind,k", [
    (SamplingConfig(1.0), "model", 3),
    (SamplingConfig(0.8, top_p=0.9, presence_penalty=0.7), "hybrid", 2),
])
def test_coupled_output_follows_the_target(sampling, kind, k):
    model = ModelDrafter(TrigramBackend(FAR, name="far"), sampling)
    drafter = model if kind == "model" else HybridDrafter(model, NgramDrafter(max_ngram=2))
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    assert_fits(coupled(sampling, drafter, k), exact, N)


def test_negative_control_noise_reused_at_the_next_position_fails(monkeypatch):
    monkeypatch.setattr(sampling_module, "race_noise", lambda seed, position, vocab: race_noise(seed, position // 2, vocab))
    sampling = SamplingConfig(1.0)
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
    counts = coupled(sampling, ModelDrafter(TrigramBackend(FAR, name="far"), sampling), 3, n=CONTROL_N)
    p = assert_misfits(counts, exact, CONTROL_N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


def TARGET_COST(m):  # seconds of a target call scoring m tokens, on the adaptive policy's fake clock
    return 1.0 + 0.1 * (m - 1)


def drafters(sampling):
    """(name, drafter, policy or K, clock) for every way of drafting we have."""
    close = TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0)
    out = [("autoregressive", None, None, None)]
    for k in (1, 3, 5):
        out.append((f"model-far-k{k}", ModelDrafter(TrigramBackend(FAR, name="far"), sampling), k, None))
        out.append((f"model-close-k{k}", ModelDrafter(TrigramBackend(close, name="close"), sampling), k, None))
    out.append(("ngram-k4", NgramDrafter(max_ngram=2), 4, None))
    # The adaptive policy, on a fake clock: its draft lengths change with what it has seen.
    clock = FakeClock()
    target_table, draft_table = mixed_tables(VOCAB, seed=3)
    draft = CostedBackend(TrigramBackend(draft_table), clock, lambda m: 0.3 + 0.02 * (m - 1))
    model = ModelDrafter(draft, sampling)
    model.clock = clock
    out.append(("hybrid-auto", HybridDrafter(model, NgramDrafter(max_ngram=2)),
                make_policy("auto", 4, CostedBackend(TrigramBackend(target_table), clock, TARGET_COST), draft,
                            context=PROMPT, clock=clock), clock))
    return out


@pytest.mark.parametrize("sampling", [SamplingConfig(0.8, top_p=0.95), SamplingConfig(1.2, top_k=4),
                                      SamplingConfig(1.0, frequency_penalty=0.6, min_p=0.05)])
def test_a_seeded_answer_is_the_same_whatever_drafts_it(sampling):
    target_table, _ = mixed_tables(VOCAB, seed=3)
    answers = {}
    for name, drafter, policy, clock in drafters(sampling):
        for seed in range(40):
            target = TrigramBackend(target_table) if clock is None else \
                CostedBackend(TrigramBackend(target_table), clock, TARGET_COST)
            config = GenerationConfig(max_new_tokens=16, sampling=sampling, seed=seed, verifier="coupled")
            result = generate(target, PROMPT, config, drafter, policy, *([clock] if clock else []))
            answers.setdefault(seed, {})[name] = result.token_ids
    for seed, by_drafter in answers.items():
        reference = by_drafter["autoregressive"]
        assert all(tokens == reference for tokens in by_drafter.values()), (seed, by_drafter)
    assert len({tuple(a["autoregressive"]) for a in answers.values()}) > 30  # and seeds do change the answer


def test_coupled_answers_under_the_auto_verifier_follow_the_seed():
    sampling = SamplingConfig(0.9)
    target = TrigramBackend(TARGET)
    drafter = ModelDrafter(TrigramBackend(FAR, name="far"), sampling)
    config = GenerationConfig(max_new_tokens=12, sampling=sampling, seed=5)
    a = generate(target, PROMPT, config, drafter, 2)
    b = generate(target, PROMPT, config)
    assert a.token_ids == b.token_ids


def test_verify_coupled_worked_example():
    target = torch.tensor([[0.3, 0.5, 0.2], [0.1, 0.8, 0.1], [0.4, 0.4, 0.2]])
    noise = torch.tensor([[0.1, 2.0, 0.9], [0.5, 0.4, 3.0], [1.0, 0.2, 0.25]], dtype=torch.float64)
    v = verify_coupled(torch.tensor([0, 2]), target, noise)
    assert (v.tokens, v.num_accepted) == ([0, 1], 1)
    v = verify_coupled(torch.tensor([0, 1]), target, noise)
    assert (v.tokens, v.num_accepted) == ([0, 1, 1], 2)
    v = verify_coupled(torch.tensor([], dtype=torch.long), target[:1], noise[:1])
    assert (v.tokens, v.num_accepted) == ([0], 0)

"""Speculative sampling through llama.cpp's scoring path follows the target's exact
distribution: the check of test_distribution.py on GGUF files that llama.cpp loads and
runs (tiny_gguf.py: one layer of random weights over a 258-token vocabulary).

What runs is the llama.cpp backend a user's GGUF runs through: its prefill, its
multi-token verify calls, its rollback of rejected drafts and the scoring on top of a
rolled-back cache, and a draft model on a llama.cpp cache of its own. The sampler's
exactness does not depend on the weights, so a tiny file checks the path in seconds
where the real 0.5B took 3.3 calls of 33 ms a sample (80 s and 53 s for the two checks
below, docs/testing.md). The real pair's numerics are checked where they matter: the
greedy equalities and the batch-invariant kernels in test_llamacpp_real.py, and a
user's own pair with `specsample check`.

The exact reference is enumerated with the same backend, one sequence of calls per
prefix from an empty cache; a path that reaches EOS ends there, as generation does.
"""

import pytest
import torch

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig
from specsample.decoding.sampling import SamplingConfig, logits_to_probs

from tiny_gguf import write_tiny_gguf
from toy import ALPHA, assert_fits, assert_misfits, empirical

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.pure

PROMPT = [ord("d")]  # one token: no prefill is repeated per sample
LENGTH = 3
N = 2_000
DRAFTING = SamplingConfig(temperature=1.6, top_k=6)  # a different distribution: rejections and recoveries


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    return {matrices: write_tiny_gguf(folder / f"{matrices}.gguf", specials=("<|endoftext|>",), matrices=matrices)
            for matrices in ("f32", "bf16")}


def load(path, **options):
    from specsample.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend(path, threads=1, share_cores=False, **options)


def exact_joint(model, sampling: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(the next LENGTH tokens) under `sampling`, each row scored by `model` afresh."""
    exact = {}

    def walk(prefix: list[int], p: float) -> None:
        if len(prefix) == LENGTH or (prefix and prefix[-1] in model.eos_token_ids):
            exact[tuple(prefix)] = p
            return
        model.rollback(0)
        probs = logits_to_probs(model.score(PROMPT + prefix, 1), sampling)[0]
        for token in torch.nonzero(probs).flatten().tolist():
            walk(prefix + [token], p * float(probs[token]))

    walk([], 1.0)
    return exact


def speculative_samples(model, draft, sampling: SamplingConfig, n: int) -> dict[tuple[int, ...], int]:
    """n samples of LENGTH tokens, K = 1: a rejection in the first round leaves room for a
    second drafted round, scored on top of a rolled-back cache. Both paths must be taken."""
    config, stats = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier="rejection"), []
    counts = empirical(n, model, PROMPT, config, ModelDrafter(draft, DRAFTING), 1, stats=stats)
    assert 0.05 < sum(s.acceptance_rate for s in stats) / n < 0.95  # both accept and reject paths are exercised
    assert sum(sum(s.draft_length_histogram[1:]) >= 2 for s in stats) > n // 10  # and rounds after a rollback
    return counts


def test_sampling_through_llamacpp_scoring_follows_exact_target(files):
    """Top-k 3 (at most 27 outcomes), N = 2,000 (the real 0.5B's check drew 800); chi-square p > toy.ALPHA (cells expected
    below 5 pooled). The target runs with batch-invariant kernels, as a user's target
    does under --batch-invariant: a row's logits do not move with the call's size, so
    the reference's one-row calls give the verify calls' rows."""
    model, sampling = load(files["f32"], batch_invariant=True), SamplingConfig(temperature=1.0, top_k=3)
    exact = exact_joint(model, sampling)
    assert len(exact) > 9  # a distribution worth checking, not a few near-certain paths
    assert_fits(speculative_samples(model, load(files["f32"]), sampling, N), exact, N)


def test_negative_control_a_target_too_hot_fails_the_same_check(files):
    """What the check above sees at its N: the same sampler at temperature 1.5 instead of
    1.0 (top-k 3 kept, so the support is the same) must not fit the exact joint. This
    joint is flat (its likeliest path has 0.097), so a temperature moves it little:
    1.5 lands at p ~ 1e-14; 1.25 at p ~ 4e-6 was not far enough below the level."""
    model = load(files["f32"], batch_invariant=True)
    exact = exact_joint(model, SamplingConfig(temperature=1.0, top_k=3))
    hot = speculative_samples(model, load(files["f32"]), SamplingConfig(temperature=1.5, top_k=3), N)
    p = assert_misfits(hot, exact, N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


def test_sampling_on_a_bf16_target_follows_its_exact_distribution(files):
    """A target whose matrices are bf16 (what `--target-quant bf16` makes of the default
    target), on llama.cpp's default kernels; top-k 2 (8 outcomes), N = 800 (the real
    0.5B's bf16 check drew 300)."""
    model, sampling = load(files["bf16"]), SamplingConfig(temperature=1.0, top_k=2)
    assert_fits(speculative_samples(model, load(files["f32"]), sampling, 800), exact_joint(model, sampling), 800)

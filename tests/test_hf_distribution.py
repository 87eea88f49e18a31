"""Speculative sampling through the transformers backend's real cache crop follows
the target distribution.

The trigram toy of test_distribution.py has no KV cache; here every rejected draft
is cropped out of a real DynamicCache (plain, and full-length layers for a sliding
window of 2, shorter than the sequences). Tiny random models with a vocabulary of 8
give every row of L = 3 new tokens (73 contexts) exactly, by fresh, uncropped
scoring. N = 1,500 sequences per check, tested token by token as in
test_distribution.py (toy.assert_follows: each token against its context's exact row),
failing at p < toy.ALPHA = 1e-6. The negative control, a crop that keeps the rejected
drafts, fails it by far (p ~ 2e-20 at this N; the whole-sequence fit at 3,000 gave 1e-40).
"""

import pytest
import torch

from specsample.backends.hf import HFBackend
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from tiny_hf import tiny_model, tiny_windowed_model
from toy import assert_does_not_follow, assert_follows

pytestmark = pytest.mark.pure

VOCAB, LENGTH, N, K = 8, 3, 1_500, 2
PROMPT = [1, 5, 2]
SAMPLING = SamplingConfig(temperature=1.0)
SHARPEN = 24.0  # logits peaked enough that attending to a stale draft shows


def models(arch):
    """Target and draft: two seeds of one architecture, so rounds mix full accepts,
    partial accepts and rejections."""
    if arch == "qwen2":
        return tuple(tiny_model(seed, layers=1, vocab=VOCAB, sharpen=SHARPEN) for seed in (0, 1))
    pair = tuple(tiny_windowed_model(arch, seed, window=2, vocab=VOCAB) for seed in (0, 1))
    for model in pair:
        with torch.no_grad():
            model.lm_head.weight.mul_(SHARPEN)
    return pair


class FreshScoring:
    """next_logits for toy.exact_distribution: every context scored from an empty cache."""

    def __init__(self, model):
        self.backend = HFBackend(model)
        self.vocab_size = self.backend.vocab_size

    def next_logits(self, context):  # [vocab]
        self.backend.rollback(0)
        return self.backend.score(context, num_logits=1)[0]


def sample_counts(target_model, draft_model):
    target = HFBackend(target_model)
    drafter = ModelDrafter(HFBackend(draft_model), SAMPLING)
    counts, rolled_back = {}, 0
    for i in range(N):
        result = generate(target, PROMPT, GenerationConfig(max_new_tokens=LENGTH, sampling=SAMPLING, seed=i,
                                                           verifier="rejection"), drafter, K)
        seq = tuple(result.token_ids)
        counts[seq] = counts.get(seq, 0) + 1
        rolled_back += result.stats.accepted < result.stats.drafted
    assert rolled_back > N // 10  # the crop really was exercised
    return counts


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_hf_speculative_sampling_preserves_target_distribution(arch):
    target_model, draft_model = models(arch)
    assert_follows(sample_counts(target_model, draft_model), FreshScoring(target_model), PROMPT, SAMPLING)


def test_negative_control_a_crop_that_keeps_rejected_drafts_fails(monkeypatch):
    def forgetful_rollback(self, length):
        if length == 0:
            self.cache = None
        # The backend reports the length asked for (so the loop's cache check passes),
        # but its cache keeps the rejected drafts and the next round attends to them.
        self._length = min(length, self._length)

    target_model, draft_model = models("qwen2")
    monkeypatch.setattr(HFBackend, "rollback", forgetful_rollback)
    counts = sample_counts(target_model, draft_model)
    monkeypatch.undo()  # the reference rows are scored with the real rollback
    assert_does_not_follow(counts, FreshScoring(target_model), PROMPT, SAMPLING)

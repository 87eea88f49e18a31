"""A truncated draft vocabulary (FR-Spec): faster drafts, the same output."""

import pytest
import torch

from specsample.backends.draft_vocab import frequent_tokens, restrict_draft_vocabulary
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from tiny_hf import tiny_backend
from toy import TrigramBackend, assert_follows, random_table

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0)
PROMPT = [5, 17, 3, 60, 42, 8, 11, 5, 17]


def test_restricted_head_scores_kept_tokens_as_before_and_others_never():
    full, small = tiny_backend(7), tiny_backend(7)
    keep = list(range(0, 96, 3))
    small.restrict_vocabulary(keep)
    a, b = full.score(PROMPT, 3), small.score(PROMPT, 3)
    assert torch.allclose(a[:, keep], b[:, keep], atol=1e-5)
    outside = [t for t in range(96) if t not in keep]
    assert torch.isneginf(b[:, outside]).all()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_a_truncated_draft_equals_greedy_autoregressive(k):
    target = tiny_backend(0)
    reference = generate(target, PROMPT, GenerationConfig(max_new_tokens=40, sampling=GREEDY)).token_ids
    draft = tiny_backend(0)
    draft.restrict_vocabulary(list(range(48)))  # the target often wants a token the draft cannot say
    result = generate(target, PROMPT, GenerationConfig(max_new_tokens=40, sampling=GREEDY), ModelDrafter(draft, GREEDY), k)
    assert result.token_ids == reference
    assert 0 < result.stats.acceptance_rate < 1


def test_a_draft_with_zero_probability_tokens_keeps_the_target_distribution():
    """The exact check of test_distribution.py with a draft that can never propose
    two of the six tokens (their logits are -inf, as after truncation): sequences of
    4 tokens from that file's target table, tested token by token at toy.ALPHA. At
    8,000 of them the test sees more than the whole-sequence fit on 20,000 used here
    before: a target logit off by 0.2 in every row gives p ~ 4e-6 token by token, and
    p = 2e-4 as whole sequences (test_distribution.py's docstring)."""
    table = random_table(6, seed=0)
    draft_table = table + 0.3 * random_table(6, seed=1, scale=1.0)
    draft_table[..., [1, 4]] = float("-inf")
    sampling, n = SamplingConfig(1.0), 8_000
    target, drafter = TrigramBackend(table), ModelDrafter(TrigramBackend(draft_table), sampling)
    counts = {}
    for i in range(n):
        seq = tuple(generate(target, [1, 2], GenerationConfig(max_new_tokens=4, sampling=sampling, seed=i),
                             drafter, 3).token_ids)
        counts[seq] = counts.get(seq, 0) + 1
    assert_follows(counts, TrigramBackend(table), [1, 2], sampling)


class WordTokenizer:
    def encode(self, text):
        return [hash(w) % 50 for w in text.split()]


def test_frequent_tokens_ranks_by_corpus_counts_and_keeps_special_ones(tmp_path):
    keep = frequent_tokens(WordTokenizer(), 60, 5, always=frozenset({59}), cache=tmp_path)
    assert len(keep) == 6 and 59 in keep and keep == sorted(keep)
    assert list(tmp_path.glob("vocab/counts-*.json"))  # cached for the next run
    assert frequent_tokens(WordTokenizer(), 60, 5, always=frozenset({59}), cache=tmp_path) == keep


def test_only_the_hf_backend_can_truncate():
    with pytest.raises(ValueError, match="hf backend"):
        restrict_draft_vocabulary(TrigramBackend(random_table(4, 0)), 2)

"""The transformers backend on real weights (Qwen2.5-Coder 0.5B).

Most of the transformers path is tested on tiny models built from a config
(test_hf_backend.py, test_hf_distribution.py); here it runs on the real 0.5B, as target
and as draft. The shipped pair's acceptance on transformers (1.5B target, 0.5B draft), a
property of the two models rather than of this code, is what `specsample check
--backend hf` prints per prompt, and the bench measures; it cost this suite a minute a
run (several seconds a token in float32 on a small CPU) and, on a fresh machine, the
1.5B's conversion too. `make test` fetches the pair first (1.6 GB, cached); the first
HF load of the 0.5B converts its GGUF file (cached too). Skipped, saying why, when the
files are absent.
"""

import pytest

from specsample.decoding.drafters import ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

pytestmark = pytest.mark.real

GREEDY = SamplingConfig(temperature=0)
PROMPT = "Write a Python function `is_palindrome(s)` that ignores case and spaces."
CHAT = GenerationConfig(max_new_tokens=24, sampling=GREEDY)


@pytest.fixture(scope="module")
def hf_draft(real_pair):
    """The real 0.5B on transformers."""
    from specsample.backends import load_backend

    return load_backend(real_pair.draft, "hf")


@pytest.fixture(scope="module")
def chat_reference(hf_draft):
    """PROMPT's chat prompt and the 0.5B's greedy answer to it on transformers."""
    ids = hf_draft.tokenizer.chat_prompt(PROMPT)
    return ids, generate(hf_draft, ids, CHAT).token_ids


def test_hf_greedy_speculation_with_an_hf_draft_that_is_often_rejected_equals_autoregressive(
        real_pair, hf_draft, chat_reference):
    """A transformers draft for a transformers target, both real: a second copy of the
    0.5B proposes by sampling (temperature 1) where the target decodes greedily, so
    some proposals are rejected and both models' caches roll back mid-answer; the
    output is still the target's greedy answer."""
    from specsample.backends import load_backend

    target, (ids, reference) = hf_draft, chat_reference
    draft = load_backend(real_pair.draft, "hf")
    result = generate(target, ids, CHAT, ModelDrafter(draft, SamplingConfig(temperature=1.0)), 4)
    assert result.token_ids == reference
    assert 0 < result.stats.accepted < result.stats.drafted  # both paths taken: kept and rejected drafts
    assert "palindrome" in result.text  # the real weights answer the question


def test_hf_greedy_ngram_equals_autoregressive(hf_draft):
    target = hf_draft
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    config = GenerationConfig(max_new_tokens=24, sampling=GREEDY)
    assert generate(target, ids, config, NgramDrafter(), 3).token_ids == generate(target, ids, config).token_ids


def test_mixed_backends_llamacpp_draft_for_hf_target(real_pair, hf_draft, chat_reference):
    """The 0.5B on transformers drafted by itself on llama.cpp: two engines, one vocabulary."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.backends.base import check_same_vocabulary

    target, (ids, reference) = hf_draft, chat_reference
    draft = real_pair.shared("draft")
    check_same_vocabulary(target, draft)  # both cut Qwen's padding rows to 151,665
    assert draft.tokenizer.chat_prompt(PROMPT) == ids  # same template, same token ids
    result = generate(target, ids, CHAT, ModelDrafter(draft, GREEDY), 3)
    assert result.token_ids == reference
    assert result.stats.acceptance_rate > 0.5

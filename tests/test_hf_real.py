"""The transformers backend on real weights (Qwen2.5-Coder).

Most of the transformers path is tested on tiny models built from a config
(test_hf_backend.py, test_hf_distribution.py); here it runs on the real 0.5B, and only
the first check loads the 1.5B target too (the pair as shipped, on transformers:
several seconds a token on a small CPU in float32). `make test` fetches the pair first
(1.6 GB, cached); the first HF load of each converts its GGUF file (cached too).
Skipped, saying why, when the files are absent.
"""

import pytest

from specsample.decoding.drafters import ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

pytestmark = pytest.mark.real

GREEDY = SamplingConfig(temperature=0)
PROMPT = "Write a Python function `is_palindrome(s)` that ignores case and spaces."


@pytest.fixture(scope="module")
def hf_draft(real_pair):
    """The real 0.5B on transformers."""
    from specsample.backends import load_backend

    return load_backend(real_pair.draft, "hf")


def test_hf_greedy_speculative_equals_autoregressive_with_high_acceptance(real_pair, hf_draft):
    """The one check on the real pair as shipped: 1.5B target, 0.5B draft."""
    from specsample.backends import load_backend

    target, draft = load_backend(real_pair.target, "hf"), hf_draft
    ids = target.tokenizer.chat_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=32, sampling=GREEDY)
    reference = generate(target, ids, config)
    result = generate(target, ids, config, ModelDrafter(draft, GREEDY), 4)
    assert result.token_ids == reference.token_ids
    assert result.stats.acceptance_rate > 0.5
    assert "def is_palindrome" in result.text


def test_hf_greedy_ngram_equals_autoregressive(hf_draft):
    target = hf_draft
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    config = GenerationConfig(max_new_tokens=24, sampling=GREEDY)
    assert generate(target, ids, config, NgramDrafter(), 3).token_ids == generate(target, ids, config).token_ids


def test_mixed_backends_llamacpp_draft_for_hf_target(real_pair, hf_draft):
    """The 0.5B on transformers drafted by itself on llama.cpp: two engines, one vocabulary."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.backends.base import check_same_vocabulary

    target = hf_draft
    draft = real_pair.shared("draft")
    check_same_vocabulary(target, draft)  # both cut Qwen's padding rows to 151,665
    ids = target.tokenizer.chat_prompt(PROMPT)
    assert draft.tokenizer.chat_prompt(PROMPT) == ids  # same template, same token ids
    config = GenerationConfig(max_new_tokens=24, sampling=GREEDY)
    result = generate(target, ids, config, ModelDrafter(draft, GREEDY), 3)
    assert result.token_ids == generate(target, ids, config).token_ids
    assert result.stats.acceptance_rate > 0.5

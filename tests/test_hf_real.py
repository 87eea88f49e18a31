"""Integration on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft).

`make test` fetches the pair first (1.6 GB, cached); the first HF load converts the
GGUF files (a few minutes, cached too). Skipped, saying why, when the files are absent.
"""

import pytest

from specsample.drafters import ModelDrafter, NgramDrafter
from specsample.generate import GenerationConfig, generate
from specsample.sampling import SamplingConfig

pytestmark = pytest.mark.real

GREEDY = SamplingConfig(temperature=0)
PROMPT = "Write a Python function `is_palindrome(s)` that ignores case and spaces."


@pytest.fixture(scope="module")
def hf_pair(real_pair):
    return real_pair.load("hf")


def test_hf_greedy_speculative_equals_autoregressive_with_high_acceptance(hf_pair):
    target, draft = hf_pair
    ids = target.tokenizer.chat_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=32, k=4, sampling=GREEDY)
    reference = generate(target, ids, config)
    result = generate(target, ids, config, ModelDrafter(draft, GREEDY))
    assert result.token_ids == reference.token_ids
    assert result.stats.acceptance_rate > 0.5
    assert "def is_palindrome" in result.text


def test_hf_greedy_ngram_equals_autoregressive(hf_pair):
    target, _ = hf_pair
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    config = GenerationConfig(max_new_tokens=24, k=3, sampling=GREEDY)
    assert generate(target, ids, config, NgramDrafter()).token_ids == generate(target, ids, config).token_ids


def test_mixed_backends_llamacpp_draft_for_hf_target(real_pair, hf_pair):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.backends import load_backend
    from specsample.backends.base import check_same_vocabulary

    target, _ = hf_pair
    draft = load_backend(real_pair.draft, "llamacpp")
    check_same_vocabulary(target, draft)  # both cut Qwen's padding rows to 151,665
    ids = target.tokenizer.chat_prompt(PROMPT)
    assert draft.tokenizer.chat_prompt(PROMPT) == ids  # same template, same token ids
    config = GenerationConfig(max_new_tokens=24, k=3, sampling=GREEDY)
    result = generate(target, ids, config, ModelDrafter(draft, GREEDY))
    assert result.token_ids == generate(target, ids, config).token_ids
    assert result.stats.acceptance_rate > 0.5

"""Structured output on the real default pair (llama.cpp): the grammar engine's
tokenizer built from the GGUF vocabulary, JSON under the bench's schema, and greedy
constrained speculation equal to greedy constrained decoding token for token (on the
batch-invariant target, whose logits do not depend on how many tokens a call scores)."""

import pytest

from benchmarks.structured import SCHEMA, is_valid, prompt_text, structured_docs
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.constraints import Constraint, start
from specsample.policy.control import Planner

pytestmark = pytest.mark.real
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specsample[llamacpp]')")

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair(real_pair):
    return real_pair.shared("target", batch_invariant=True), real_pair.shared("draft", quant="q4_0")


def test_the_engine_reads_the_gguf_vocabulary(pair):
    target, _ = pair
    state = start(Constraint.json_schema({"type": "object", "properties": {"answer": {"type": "integer"}},
                                          "required": ["answer"]}), target, 64)
    forced = state.forced()
    text = target.tokenizer.decode(list(forced))  # the engine leaves out a last token that could grow (" 7")
    assert text.startswith('{"answer"') and '{"answer": '.startswith(text)
    assert state.allowed() == forced[0]
    for token in forced:
        state.advance(token)
    number = state.allowed()
    assert number.shape == (target.vocab_size,) and not number[target.tokenizer.encode(" x")[0]]
    assert number[target.tokenizer.encode(" 7")[0]] and not number[target.tokenizer.encode("}")[0]]


def test_greedy_constrained_speculation_equals_constrained_decoding_and_validates(pair):
    target, draft = pair
    name, doc = next(d for d in structured_docs() if d[0] == "statistics.median")
    ids = target.tokenizer.chat_prompt(prompt_text(name, doc))
    config = dict(max_new_tokens=160, sampling=GREEDY, constraint=Constraint.json_schema(SCHEMA))
    plain = generate(target, ids, GenerationConfig(**config))
    assert plain.stop_reason == "grammar" and is_valid(plain.text, SCHEMA)
    assert plain.stats.forced_tokens > len(plain.token_ids) // 5
    policy = Planner(k_max=6).seat()
    # The speculative runs reuse the prompt plain decoding left in the cache (bitwise a
    # fresh prefill's rows on batch-invariant kernels): a 175-token prefill is seconds here.
    for drafter, p in ((ModelDrafter(draft, GREEDY), 3), (HybridDrafter(ModelDrafter(draft, GREEDY), NgramDrafter()), policy)):
        result = generate(target, ids, GenerationConfig(**config, cache_prompt=True), drafter, p)
        assert result.stats.cached_prompt_tokens > 0
        assert result.token_ids == plain.token_ids
        assert result.stats.sources["forced"][2] == plain.stats.forced_tokens  # every forced token drafted free
        assert result.stats.target_calls < plain.stats.target_calls - plain.stats.forced_tokens

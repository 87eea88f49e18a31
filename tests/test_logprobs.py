"""Log-probabilities of emitted tokens come from the verify call's rows (no extra
target call) and equal what the target gives for the same prefix; prompt scoring
gives each prompt token's log-probability given the tokens before it."""

import pytest
import torch

from specsample.decoding.drafters import ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.sampling import Sampler, SamplingConfig
from specsample.output.logprobs import score_prompt

from toy import CostedBackend, FakeClock, TrigramBackend, random_table

pytestmark = pytest.mark.pure

VOCAB = 8
TARGET = random_table(VOCAB, seed=4)
DRAFT = TARGET + 0.5 * random_table(VOCAB, seed=5, scale=1.0)
PROMPT = [1, 2, 3]


def expected_rows(prompt, tokens, sampling, mode):
    """The target's row for each emitted token, computed one prefix at a time."""
    backend, sampler, rows = TrigramBackend(TARGET), Sampler(len(prompt)), []
    for i in range(len(tokens)):
        context = prompt + tokens[:i]
        logits = backend.next_logits(context)[None]
        rows.append(torch.log_softmax(logits, -1)[0] if mode == "raw"
                    else torch.log(sampler.probs(logits, context, sampling))[0])
    return rows


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
@pytest.mark.parametrize("sampling,mode", [(SamplingConfig(0.0), "raw"), (SamplingConfig(0.8, top_k=5), "raw"),
                                           (SamplingConfig(0.8, top_k=5, presence_penalty=1.0), "processed")])
def test_emitted_logprobs_are_the_targets_for_the_same_prefix(drafter, sampling, mode):
    made = {"none": None, "model": ModelDrafter(TrigramBackend(DRAFT, name="draft"), sampling),
            "ngram": NgramDrafter(max_ngram=2)}[drafter]
    config = GenerationConfig(max_new_tokens=20, sampling=sampling, seed=1, logprobs=3, logprobs_mode=mode)
    s = stream(TrigramBackend(TARGET), PROMPT, config, made, 3)
    chunks = list(s)
    result = s.result
    assert [lp.token for lp in result.logprobs] == result.token_ids
    assert [lp for c in chunks for lp in (c.logprobs or [])] == result.logprobs
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks if c.token_ids)
    for lp, row in zip(result.logprobs, expected_rows(PROMPT, result.token_ids, sampling, mode)):
        assert lp.logprob == pytest.approx(float(row[lp.token]), abs=1e-5)
        values, index = row.topk(3)
        assert [t for t, _ in lp.top] == index.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-5)
    if drafter != "none":
        assert result.stats.drafted > 0  # rows came from verify calls that scored drafts


def test_logprobs_cost_no_target_call():
    calls = []
    for logprobs in (None, 5):
        clock = FakeClock()
        target = CostedBackend(TrigramBackend(TARGET), clock, lambda m: 1.0)
        drafter = ModelDrafter(TrigramBackend(DRAFT, name="draft"), SamplingConfig(0.9))
        config = GenerationConfig(max_new_tokens=30, sampling=SamplingConfig(0.9), seed=2, logprobs=logprobs)
        result = generate(target, PROMPT, config, drafter, 3)
        calls.append((target.calls, result.token_ids))
    assert calls[0] == calls[1]


def test_greedy_speculative_logprobs_equal_autoregressive():
    sampling = SamplingConfig(0.0)
    config = GenerationConfig(max_new_tokens=24, sampling=sampling, logprobs=2)
    spec = generate(TrigramBackend(TARGET), PROMPT, config, ModelDrafter(TrigramBackend(DRAFT), sampling), 4)
    plain = generate(TrigramBackend(TARGET), PROMPT, config)
    assert spec.token_ids == plain.token_ids and spec.logprobs == plain.logprobs


def test_no_logprobs_unless_asked():
    result = generate(TrigramBackend(TARGET), PROMPT, GenerationConfig(max_new_tokens=5))
    assert result.logprobs is None


@pytest.mark.parametrize("chunk", [1, 3, 128])
def test_score_prompt_gives_each_token_given_the_ones_before(chunk):
    prompt = [1, 2, 3, 0, 7, 7, 5]
    backend = TrigramBackend(TARGET)
    scored = score_prompt(backend, prompt, top=2, chunk=chunk)
    assert scored[0] is None and len(scored) == len(prompt)
    for i in range(1, len(prompt)):
        row = torch.log_softmax(TARGET[prompt[i - 2] if i >= 2 else 0, prompt[i - 1]], -1)
        assert scored[i].token == prompt[i]
        assert scored[i].logprob == pytest.approx(float(row[prompt[i]]), abs=1e-6)
        assert [t for t, _ in scored[i].top] == row.topk(2).indices.tolist()
    assert backend.tokens == prompt  # the cache holds the prompt, nothing else


def test_invalid_logprob_settings_are_refused():
    with pytest.raises(ValueError, match="logprobs"):
        GenerationConfig(logprobs=21)
    with pytest.raises(ValueError, match="mode"):
        GenerationConfig(logprobs=1, logprobs_mode="softmax")
    with pytest.raises(ValueError, match="verifier"):
        GenerationConfig(verifier="maybe")

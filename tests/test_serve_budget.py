"""--max-request-tokens: one request's tokens (every choice's max_tokens, n x prompts,
and the prompt tokens echo scores) are capped, as the single worker serves requests in
turn; a request over the cap is a 400 that gives the numbers."""

import pytest

from specsample.serve.errors import APIError
from specsample.serve.request_config import plan, make_choices
from specsample.serve.schemas import CompletionRequest
from specsample.serve.settings import Settings

pytestmark = pytest.mark.pure

CONTEXT = 4096


def choices(budget, **body):
    request = CompletionRequest(model="toy", **body)
    asked = plan(request, Settings(model_name="toy", policy=3, max_tokens=100, max_request_tokens=budget), 26)
    return make_choices(asked, [(p, None) for p in request.prompt], CONTEXT, "prompt")


def refusal(budget, **body) -> str:
    with pytest.raises(APIError) as e:
        choices(budget, **body)
    assert e.value.status == 400 and e.value.code == "request_too_large"
    return e.value.message


def test_n_times_prompts_times_max_tokens_is_capped():
    prompts = [[1, 2, 3], [4, 5]]
    assert len(choices(400, prompt=prompts, n=2, max_tokens=100)) == 4  # 400 tokens: at the cap
    message = refusal(399, prompt=prompts, n=2, max_tokens=100)
    assert "400 tokens" in message and "4 choices" in message and "399" in message


def test_without_max_tokens_each_choice_counts_the_default():
    assert len(choices(300, prompt=[[1, 2]], n=3)) == 3
    assert "300 tokens" in refusal(299, prompt=[[1, 2]], n=3)


def test_echo_counts_the_prompt_tokens_it_scores():
    prompts = [[1] * 50, [2] * 30]
    assert len(choices(80, prompt=prompts, echo=True, logprobs=0, max_tokens=0)) == 2
    message = refusal(79, prompt=prompts, echo=True, logprobs=0, max_tokens=0)
    assert "80 prompt tokens to score" in message
    assert "90 to generate, 80 prompt" in refusal(169, prompt=prompts, echo=True, logprobs=0, max_tokens=45)


def test_the_default_budget_is_eight_full_length_choices():
    settings = Settings(model_name="toy", max_tokens=100)
    assert settings.request_budget == 800
    assert len(choices(None, prompt=[[1]], n=8, max_tokens=100)) == 8
    assert "900 tokens" in refusal(None, prompt=[[1]], n=9, max_tokens=100)

"""One context-fit rule: stream() takes exactly the max_tokens the server fits to a
prompt, and refuses one more."""

import dataclasses

import pytest

from specsample.decoding.context_fit import new_token_room
from specsample.decoding.generate import GenerationConfig, stream
from specsample.policy.make import most_drafts
from specsample.policy.control import Planner
from specsample.serve.errors import APIError
from specsample.serve.request_config import RequestPlan, fit_context

from toy import TrigramBackend, random_table

pytestmark = pytest.mark.pure

PROMPT = [1, 2, 3, 4, 5]


@pytest.mark.parametrize("policy,k_max", [(3, 3), (Planner(5).seat(), 5)], ids=["k-3", "auto-k-max-5"])
def test_the_server_fits_max_tokens_to_what_stream_accepts(policy, k_max):
    target = TrigramBackend(random_table(6, seed=0))
    target.context_length = 20
    room = new_token_room(target.context_length, len(PROMPT), most_drafts(policy))
    assert room == 20 - 5 - k_max - 1
    config = GenerationConfig(max_new_tokens=100)

    def plan(requested=None):  # as the server's plan() makes it under this policy
        return RequestPlan(config, requested, None, 1, False, budget=1 << 20, k_max=most_drafts(policy))

    fitted = fit_context(plan(), len(PROMPT), target.context_length, "prompt")
    assert fitted.max_new_tokens == room
    stream(target, PROMPT, fitted, None, policy)  # accepted: stream() checks before any model call
    with pytest.raises(ValueError, match="does not fit the context of the target"):
        stream(target, PROMPT, dataclasses.replace(fitted, max_new_tokens=room + 1), None, policy)
    with pytest.raises(APIError, match=f"leaves room for {room}"):
        fit_context(plan(room + 1), len(PROMPT), target.context_length, "prompt")
    with pytest.raises(APIError, match=f"prompts of at most {len(PROMPT) + room - 1}"):
        fit_context(plan(), len(PROMPT) + room, target.context_length, "prompt")

"""cache_prompt: a generation scores only what its target's cache does not hold already
of its prompt (the start it shares with what the last generation there left), and its
output is the one a fresh prefill gives (exact toy models, whose numbers do not depend
on call shapes)."""

import pytest
import torch

from specsample.backends.base import common_prefix_length
from specsample.decoding.batching import slots
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate, reusable_prefix
from specsample.decoding.sampling import SamplingConfig

from tiny_hf import tiny_backend
from toy import TrigramBackend, TrigramSequences, random_table

pytestmark = pytest.mark.pure

SAMPLED = SamplingConfig(temperature=1.0)
TURN_1 = [5, 17, 3, 60, 42, 8, 11]


class Counting(TrigramBackend):
    """Counts the tokens each score() call feeds."""

    def __init__(self, table):
        super().__init__(table)
        self.fed: list[int] = []

    def score(self, token_ids, num_logits):
        self.fed.append(len(token_ids))
        return super().score(token_ids, num_logits)


def config(cache_prompt: bool, seed: int = 3, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=12, sampling=SAMPLED, seed=seed, cache_prompt=cache_prompt, **kw)


def test_reusable_prefix_keeps_the_prompts_last_token_to_score():
    assert reusable_prefix(None, [1, 2, 3]) == 0
    assert reusable_prefix([], [1, 2, 3]) == 0
    assert reusable_prefix([1, 2, 9], [1, 2, 3, 4]) == 2
    assert reusable_prefix([1, 2, 3, 4, 5], [1, 2, 3, 4]) == 3  # all of it held: the last is scored again
    assert reusable_prefix([7], [1, 2]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3


def test_a_chats_next_turn_scores_only_what_is_new_and_answers_as_a_fresh_prefill_would():
    table = random_table(64, 0, scale=2.0)
    target, fresh = Counting(table), Counting(table)
    first = generate(target, TURN_1, config(True))
    turn_2 = TURN_1 + first.token_ids + [9, 30, 2]  # the answer, then the user's next message
    target.fed.clear()
    cached = generate(target, turn_2, config(True, seed=4))
    alone = generate(fresh, turn_2, config(True, seed=4))  # nothing cached: the whole prompt
    assert cached.token_ids == alone.token_ids
    held = len(TURN_1) + len(first.token_ids) - 1  # the first answer's last token was never scored
    assert cached.stats.cached_prompt_tokens == held and alone.stats.cached_prompt_tokens == 0
    assert target.fed[0] == len(turn_2) - held and fresh.fed[0] == len(turn_2)


def test_off_by_default_and_off_means_a_fresh_prefill():
    target = Counting(random_table(64, 0, scale=2.0))
    generate(target, TURN_1, config(True))
    target.fed.clear()
    result = generate(target, TURN_1 + [9], config(False))
    assert target.fed[0] == len(TURN_1) + 1 and result.stats.cached_prompt_tokens == 0
    assert GenerationConfig().cache_prompt is False


def test_another_text_in_the_cache_is_kept_only_as_far_as_it_agrees():
    target = Counting(random_table(64, 0, scale=2.0))
    generate(target, TURN_1, config(True))
    target.fed.clear()
    other = TURN_1[:3] + [1, 2, 3, 4]
    result = generate(target, other, config(True))
    assert result.stats.cached_prompt_tokens == 3 and target.fed[0] == len(other) - 3
    assert result.token_ids == generate(TrigramBackend(target.table), other, config(False)).token_ids


def test_seeded_speculative_answers_with_a_cached_prompt_equal_a_fresh_prefill_on_transformers():
    """The hf backend counts its cache's tokens too; a cropped cache reused is exact."""
    target, draft = tiny_backend(0), tiny_backend(7)
    prompt = [5, 17, 3, 60, 42, 8, 11, 5, 17]
    first = generate(target, prompt, config(True), ModelDrafter(draft, SAMPLED), 3)
    assert target.cached_tokens() == (prompt + first.token_ids)[: target.length]
    follow_up = prompt + first.token_ids[:5] + [3, 4]
    cached = generate(target, follow_up, config(True, seed=9), ModelDrafter(draft, SAMPLED), 3)
    assert cached.stats.cached_prompt_tokens == len(prompt) + 5
    fresh = generate(tiny_backend(0), follow_up, config(False, seed=9), ModelDrafter(tiny_backend(7), SAMPLED), 3)
    assert cached.token_ids == fresh.token_ids


def test_each_slot_of_a_shared_backend_keeps_its_own_text():
    shared = TrigramSequences(random_table(64, 0, scale=2.0), 2)
    a, b = slots(shared)
    generate(a, TURN_1, config(True))
    generate(b, [1, 2, 3, 4], config(True))
    assert a.cached_tokens()[: len(TURN_1)] == TURN_1 and b.cached_tokens()[:4] == [1, 2, 3, 4]
    again = generate(a, TURN_1 + [7], config(True))
    assert again.stats.cached_prompt_tokens == len(TURN_1)


def test_a_backend_that_keeps_no_count_reuses_nothing():
    class Unknown(TrigramBackend):
        def cached_tokens(self):
            return None

    target = Unknown(random_table(64, 0, scale=2.0))
    generate(target, TURN_1, config(True))
    assert generate(target, TURN_1 + [9], config(True)).stats.cached_prompt_tokens == 0


def test_the_hf_backend_forgets_its_count_with_its_cache():
    target = tiny_backend(0)
    target.score([1, 2, 3, 4], 1)
    target.rollback(2)
    assert target.cached_tokens() == [1, 2]
    target.rollback(0)
    assert target.cached_tokens() == []
    assert torch.is_tensor(target.score([5, 6], 1))
    assert target.cached_tokens() == [5, 6]


@pytest.mark.parametrize("cache_prompt", [True, False])
def test_the_draft_model_keeps_what_its_cache_holds_too_when_asked(cache_prompt):
    """A new drafter on a draft model whose cache holds the last turn feeds only what
    it lacks (its numbers move acceptance only: rejection sampling, whose output does
    depend on them, gives the fresh answer on these exact models)."""
    target, draft = Counting(random_table(64, 0, scale=2.0)), Counting(random_table(64, 5, scale=2.0))
    run = dict(verifier="rejection")
    first = generate(target, TURN_1, config(cache_prompt, **run), ModelDrafter(draft, SAMPLED), 3)
    turn_2 = TURN_1 + first.token_ids + [9, 30, 2]
    draft.fed.clear()
    again = generate(target, turn_2, config(cache_prompt, seed=4, **run), ModelDrafter(draft, SAMPLED), 3)
    fresh = generate(Counting(target.table), turn_2, config(False, seed=4, **run),
                     ModelDrafter(Counting(draft.table), SAMPLED), 3)
    assert again.token_ids == fresh.token_ids
    if cache_prompt:
        assert draft.fed[0] <= len(turn_2) - len(TURN_1)
    else:
        assert draft.fed[0] == len(turn_2)

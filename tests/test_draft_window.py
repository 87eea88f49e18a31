"""The draft's context window: what the draft reads, and that the output does not change."""

import pytest
import torch

from specsample.decoding.drafters import ModelDrafter, draft_round
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import Sampler, SamplingConfig

from toy import TrigramBackend, random_table

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0.0)
TABLE = random_table(8, seed=3)


def drafter(window, head):
    return ModelDrafter(TrigramBackend(TABLE, name="draft"), GREEDY, window=window, head=head)


def draft_once(d, context, k=2):
    return draft_round(d, context, k, Sampler(len(context), torch.Generator().manual_seed(0)), FixedK(k).plan)


def test_a_long_prompt_is_read_as_its_head_and_its_last_window_tokens():
    d = drafter(window=3, head=2)
    context = list(range(1, 8)) * 2  # 14 tokens
    assert d.lag(context) == 5  # not 14
    draft = draft_once(d, context)
    assert d.backend.tokens[:5] == context[:2] + context[-3:]
    assert d.calls == 2 and d.backend.tokens[5:] == draft.tokens[:1].tolist()


def test_later_rounds_feed_only_the_new_tokens():
    d = drafter(window=3, head=2)
    context = list(range(1, 8)) * 2
    draft = draft_once(d, context).tokens.tolist()
    context += draft[:1] + [(draft[1] + 1) % 8]  # one draft accepted, then a recovered token
    assert d.lag(context) == 1  # the accepted draft is cached already
    draft_once(d, context)
    assert d.backend.tokens[:7] == context[:2] + context[-5:]  # the view kept growing from where it started


def test_more_unseen_text_than_the_window_restarts_the_view_and_keeps_the_head():
    d = drafter(window=3, head=2)
    context = list(range(1, 8)) * 2
    draft_once(d, context)
    context += [1, 2, 3, 4, 5]  # plain target steps while the draft sat idle
    assert d.lag(context) == 3  # the last 3 afresh; the head is still cached
    fed = []
    score = d.backend.score
    d.backend.score = lambda ids, num_logits: fed.append(len(ids)) or score(ids, num_logits)
    draft_once(d, context)
    assert fed[0] == 3  # the 3 unseen tokens, on top of the head still cached
    assert d.backend.tokens[:5] == context[:2] + context[-3:]


def test_a_new_sequence_starts_a_new_view():
    d = drafter(window=4, head=1)
    draft_once(d, [1, 2, 3, 4, 5, 6, 7, 1, 2, 3])
    other = [7, 6, 5, 4, 3, 2, 1, 7, 6, 5, 4]
    assert d.lag(other) == 5
    draft_once(d, other)
    assert d.backend.tokens[:5] == other[:1] + other[-4:]


def test_without_a_window_the_whole_context_is_read():
    d = drafter(window=None, head=0)
    context = list(range(1, 8)) * 2
    assert d.lag(context) == 14
    draft_once(d, context)
    assert d.backend.tokens[:14] == context


@pytest.mark.parametrize("window,head", [(0, 0), (4, -1)])
def test_bad_window_is_refused(window, head):
    with pytest.raises(ValueError):
        drafter(window, head)


def test_greedy_output_is_the_same_with_a_window():
    target = TrigramBackend(TABLE + 0.5 * random_table(8, seed=4))
    prompt = list(range(1, 8)) * 3
    config = GenerationConfig(max_new_tokens=40, sampling=GREEDY, seed=0)
    plain = generate(target, prompt, config)
    windowed = generate(target, prompt, config, drafter(window=2, head=1), 3)
    assert windowed.token_ids == plain.token_ids
    assert windowed.stats.drafted > 0

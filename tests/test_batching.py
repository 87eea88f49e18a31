"""Many sequences per model call (batching.py) on toy models: one target call serves
every live sequence, sequences join and leave between calls, a long prompt goes in
chunks, a failure stays in its sequence, and each sequence's output follows its own
target distribution whatever shares the batch (with a negative control that leaks
state between sequences)."""

import pytest
import torch

from specsample.decoding.batching import Scheduler, slots
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import generate_many
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import SamplingConfig

from toy import CrossTalk, TrigramBackend, TrigramSequences, assert_fits, assert_misfits, exact_distribution, random_table

pytestmark = pytest.mark.pure

VOCAB, LENGTH = 6, 4
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
DRAFT = TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0)
SAMPLED = SamplingConfig(temperature=1.0)
NUCLEUS = SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)


def pair(sequences: int, target_class=TrigramSequences):
    return target_class(TARGET, sequences), TrigramSequences(DRAFT, sequences, name="draft")


def model_drafter(sampling):
    return lambda slot: ModelDrafter(slot, sampling)


def config(sampling, seed=0, length=LENGTH, verifier="rejection"):
    return GenerationConfig(max_new_tokens=length, sampling=sampling, seed=seed, verifier=verifier)


def per_config_drafters(configs):
    """make_drafter for generate_many: each prompt's drafter draws from its own sampling.
    generate_many builds drafters in prompt order as slots free up, so a queue works."""
    queue = list(configs)
    return lambda slot: ModelDrafter(slot, queue.pop(0).sampling)


def test_one_target_call_serves_every_live_sequence_and_draft_steps_come_first():
    target, draft = pair(3)
    prompts = [PROMPT, [3, 4, 5], [0]]
    configs = [config(GREEDY, length=6)] * 3
    results, stats = generate_many(target, prompts, configs, draft, model_drafter(GREEDY), FixedK(2))
    assert [len(r.token_ids) for r in results] == [6, 6, 6]
    assert target.calls[0] == [(0, 2), (1, 3), (2, 1)]  # the three prefills in one call
    # Every target call while all three decode holds all three; they only thin out
    # as sequences finish.
    sizes = [len(call) for call in target.calls]
    assert sizes == sorted(sizes, reverse=True) and sizes[1] == 3
    assert stats.target_calls == len(target.calls) and sum(stats.sequences_per_call) == len(target.calls)
    # A round's draft calls are made before the target call that verifies them: the
    # draft model's calls of one step serve every sequence that drafts.
    assert max(len(call) for call in draft.calls) == 3


def test_batched_greedy_output_equals_each_sequence_alone_and_plain_decoding():
    prompts = [PROMPT, [3, 4, 5], [0], [5, 5], [2, 1, 0, 3]]
    lengths = [9, 4, 12, 1, 7]
    configs = [config(GREEDY, length=n) for n in lengths]
    target, draft = pair(2)  # five prompts on two slots: three join as others leave
    results, stats = generate_many(target, prompts, configs, draft, model_drafter(GREEDY), FixedK(3))
    for prompt, cfg, result in zip(prompts, configs, results):
        plain = generate(TrigramBackend(TARGET), prompt, GenerationConfig(max_new_tokens=cfg.max_new_tokens,
                                                                          sampling=GREEDY))
        assert result.token_ids == plain.token_ids
    assert stats.sequences_per_call[2] > 0  # sequences did share calls


def test_seeded_coupled_answers_equal_the_same_request_alone_whatever_shares_the_batch():
    configs = [config(SAMPLED, seed=7, verifier="coupled"), config(NUCLEUS, seed=3, length=9),
               config(GREEDY, length=5), config(SAMPLED, seed=11, verifier="coupled")]
    prompts = [PROMPT, [3, 4], [0, 1, 2], [5]]
    target, draft = pair(4)
    results, _ = generate_many(target, prompts, configs, draft, per_config_drafters(configs), FixedK(3))
    for prompt, cfg, result in zip(prompts, configs, results):
        if cfg.verifier != "coupled":
            continue
        alone = generate(TrigramBackend(TARGET), prompt, cfg, ModelDrafter(TrigramBackend(DRAFT), cfg.sampling), FixedK(2))
        assert result.token_ids == alone.token_ids


def mixed_batch_counts(target_class, n: int) -> tuple[dict, dict]:
    """n batches of four sequences on four slots: a sampled one (counted), a greedy
    one, a nucleus-sampled one (counted) and a longer sampled one; each batch's seeds
    are new. The counts of the two counted configurations."""
    target, draft = pair(4, target_class)
    counts = ({}, {})
    for i in range(n):
        configs = [config(SAMPLED, seed=4 * i), config(GREEDY, length=3), config(NUCLEUS, seed=4 * i + 2),
                   config(SAMPLED, seed=4 * i + 3, length=7)]
        prompts = [PROMPT, [3, 4, 5], PROMPT, [0]]
        results, _ = generate_many(target, prompts, configs, draft, per_config_drafters(configs), FixedK(3))
        for count, result in zip(counts, (results[0], results[2])):
            key = tuple(result.token_ids)
            count[key] = count.get(key, 0) + 1
    return counts


# 4,000 batches: each counted configuration gets 4,000 samples of 1,296 possible
# sequences (a fifth of test_distribution's N, as every batch runs four sequences).
# The leak's control needs a quarter of them: p ~ 2e-15 at 1,000 batches (3e-5 at 500,
# too near the level); a test's power grows with its sample, so it fails at 4,000 too.
N_MIXED, N_LEAK = 4000, 1000


def test_each_sequence_of_a_mixed_batch_follows_its_own_target_distribution():
    sampled, nucleus = mixed_batch_counts(TrigramSequences, N_MIXED)
    for counts, sampling in ((sampled, SAMPLED), (nucleus, NUCLEUS)):
        exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, sampling)
        assert_fits(counts, exact, N_MIXED)


def test_negative_control_state_leaking_between_sequences_is_caught():
    sampled, _ = mixed_batch_counts(CrossTalk, N_LEAK)
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, SAMPLED)
    assert_misfits(sampled, exact, N_LEAK)


def test_a_long_prompt_joins_in_chunks_while_the_others_keep_decoding():
    target, _ = pair(2)
    first, second = slots(target)
    heard = []
    scheduler = Scheduler(target, prefill_chunk=4, on_call=lambda *call: heard.append(call))
    long_prompt = [i % VOCAB for i in range(10)]
    out = {}
    scheduler.add(lambda: out.setdefault("a", generate(first, PROMPT, config(GREEDY, length=6))))
    scheduler.step()  # A's prefill alone
    scheduler.add(lambda: out.setdefault("b", generate(second, long_prompt, config(GREEDY, length=2))))
    scheduler.run()
    # B's 10 prompt tokens came as 4 + 4 + 2, each call also carrying A's next token.
    assert target.calls[1:4] == [[(0, 1), (1, 4)], [(0, 1), (1, 4)], [(0, 1), (1, 2)]]
    # /metrics counts the calls that carried a chunk apart from the rounds' own.
    assert [prompt for *_, prompt in heard] == [True] * 4 + [False] * (len(heard) - 4)
    assert heard[3] == (True, 2, 3, heard[3][3], True)
    alone = generate(TrigramBackend(TARGET), long_prompt, config(GREEDY, length=2))
    assert out["b"].token_ids == alone.token_ids and len(out["a"].token_ids) == 6


class FailsOnSequence(TrigramSequences):
    """A target whose calls fail for one sequence from its `after`-th call on."""

    def __init__(self, table, sequences, bad: int, after: int):
        super().__init__(table, sequences)
        self.bad, self.after, self.seen = bad, after, 0

    def score_many(self, requests):
        if any(seq == self.bad for seq, _, _ in requests):
            self.seen += 1
            if self.seen >= self.after:
                raise RuntimeError("engine failure")
        return super().score_many(requests)


def test_a_failing_call_reaches_every_sequence_in_it():
    target = FailsOnSequence(TARGET, 2, bad=1, after=3)
    first, second = slots(target)
    scheduler = Scheduler(target)
    a = scheduler.add(lambda: generate(first, PROMPT, config(GREEDY, length=8)))
    b = scheduler.add(lambda: generate(second, [3, 4], config(GREEDY, length=8)))
    scheduler.run()
    # The failing call held both: both hear it, as an engine error of that call.
    assert isinstance(b.error, RuntimeError) and isinstance(a.error, RuntimeError)
    assert scheduler.live == 0


def test_a_sequence_that_raises_between_calls_leaves_the_others_untouched():
    target, _ = pair(2)
    first, second = slots(target)
    scheduler = Scheduler(target)

    def cancelled_after_two_rounds():
        stream_ = iter(stream(first, PROMPT, config(GREEDY, length=20)))
        next(stream_), next(stream_)
        raise KeyboardInterrupt("client left")  # any exception: the job keeps it

    a = scheduler.add(cancelled_after_two_rounds)
    b = scheduler.add(lambda: generate(second, [3, 4], config(GREEDY, length=8)))
    scheduler.run()
    assert isinstance(a.error, KeyboardInterrupt)
    alone = generate(TrigramBackend(TARGET), [3, 4], config(GREEDY, length=8))
    assert b.result.token_ids == alone.token_ids


def test_each_sequence_rolls_back_alone():
    target, _ = pair(3)
    rows = target.score_many([(0, [1, 2, 3], 1), (1, [4, 5], 2), (2, [0], 1)])
    assert [r.shape[0] for r in rows] == [1, 2, 1]
    target.rollback_sequence(1, 1)
    assert [target.sequence_length(s) for s in range(3)] == [3, 1, 1]
    again = target.score_many([(1, [5], 1)])[0]
    assert torch.equal(again[0], rows[1][1])



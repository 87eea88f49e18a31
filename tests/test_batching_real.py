"""Batched decoding on the real default pair (llama.cpp, several sequences in one
context): each sequence rolls back alone, and with batch-invariant kernels a greedy
or seeded answer equals the same request decoded alone, to the token, whatever shares
its calls, as sequences join, leave and are cancelled."""

import pytest
import torch

from specsample.backends import load_backend
from specsample.decoding.batching import Scheduler, slots
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import generate_many
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import SamplingConfig

pytestmark = pytest.mark.real

TEXTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n\ndef softmax(x):",
         "Once upon a time", "class Stack:\n    def push(self, item):"]
GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=0.8, top_p=0.95)


@pytest.fixture(scope="module")
def batched(real_pair):
    """Target and draft holding three sequences each, batch-invariant kernels."""
    target = load_backend(real_pair.target, "llamacpp", batch_invariant=True, sequences=3)
    draft = load_backend(real_pair.draft, "llamacpp", batch_invariant=True, sequences=3)
    return target, draft


def drafter_for(sampling):
    return lambda slot: HybridDrafter(ModelDrafter(slot, sampling), NgramDrafter())


def test_each_sequence_rolls_back_alone(batched):
    target, _ = batched
    ids = [target.tokenizer.encode(t) for t in TEXTS[:3]]
    first = target.score_many([(s, p, 1) for s, p in enumerate(ids)])
    target.rollback_sequence(1, 2)
    assert [target.sequence_length(s) for s in range(3)] == [len(ids[0]), 2, len(ids[2])]
    again = target.score_many([(1, ids[1][2:], 1), (2, [ids[2][-1]], 1)])
    assert torch.equal(again[0], first[1])  # sequence 1 re-read its text, in a batch with another
    # Sequence 0 was left alone by the others' rollbacks and calls: its next row is its own.
    target.score_many([(0, [ids[0][-1]], 1)])
    for s in range(3):
        target.rollback_sequence(s, 0)


def test_greedy_and_seeded_answers_equal_each_request_alone_as_sequences_join_and_leave(batched):
    target, draft = batched
    prompts = [target.tokenizer.encode(t) for t in TEXTS]
    # Five requests of different lengths on three sequences: the fourth and fifth join as
    # the first ones leave, in the order they did with the 78 tokens before issue 53.
    configs = [GenerationConfig(max_new_tokens=n, sampling=s, seed=seed)
               for n, s, seed in ((12, GREEDY, 0), (7, SAMPLED, 5), (14, GREEDY, 0), (4, SAMPLED, 9), (10, GREEDY, 0))]
    queue = list(configs)
    results, stats = generate_many(target, prompts, configs, draft, lambda slot: drafter_for(queue.pop(0).sampling)(slot),
                                   FixedK(3))
    assert stats.sequences_per_call[3] > 0 and sum(stats.sequences_per_call[1:3]) > 0  # three at once, then fewer
    target_slot, draft_slot = slots(target)[0], slots(draft)[0]
    for prompt, config, result in zip(prompts, configs, results):
        alone = generate(target_slot, prompt, config, drafter_for(config.sampling)(draft_slot), FixedK(3))
        assert result.token_ids == alone.token_ids
        if config.sampling.greedy:
            assert result.token_ids == generate(target_slot, prompt, config).token_ids  # and plain decoding


def test_a_sequence_cancelled_mid_batch_leaves_the_others_exact(batched):
    target, draft = batched
    (t0, t1, _), (d0, d1, _) = slots(target), slots(draft)
    prompts = [target.tokenizer.encode(t) for t in TEXTS[:2]]
    config = GenerationConfig(max_new_tokens=16, sampling=GREEDY)
    scheduler = Scheduler(target)

    def cancelled():
        rounds = iter(stream(t0, prompts[0], config, drafter_for(GREEDY)(d0), FixedK(3)))
        next(rounds), next(rounds)
        raise TimeoutError("client left")

    gone = scheduler.add(cancelled)
    kept = scheduler.add(lambda: generate(t1, prompts[1], config, drafter_for(GREEDY)(d1), FixedK(3)))
    scheduler.run()
    assert isinstance(gone.error, TimeoutError)
    assert kept.result.token_ids == generate(t1, prompts[1], config).token_ids

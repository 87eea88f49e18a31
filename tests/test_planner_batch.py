"""-k auto on a batch: four sequences with mixed settings share each call and one
planner decides their rounds together, and each still follows its own target
distribution; a negative control whose drafter peeks at the current round's
verdict fails the same check."""

import dataclasses

import pytest
import torch

from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import generate_many
from specsample.decoding.generate import GenerationConfig
from specsample.decoding.sampling import SamplingConfig, logits_to_probs
from specsample.policy.control import Planner, Seat
from specsample.policy.curve import Curve
from specsample.policy.estimates import Goodput, Prices

from test_distribution import LENGTH, MIXED_DRAFT, MIXED_PROMPT, MIXED_TARGET, _Truncating
from toy import FakeClock, TrigramBackend, TrigramSequences, assert_fits, assert_misfits, exact_distribution

pytestmark = pytest.mark.pure

SAMPLED = SamplingConfig(temperature=1.0)
NUCLEUS = SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)
# Each batch counts two sampled sequences (pooled): 2 x 1,200 samples, tested on the
# whole 4-token sequences and on their first two tokens (36 cells, where a bias in
# the first drafted position shows most). A correct sampler fails either with
# probability ALPHA. The peeking drafter fails the two-token fit with p ~ 2e-12 on half
# as many batches (CONTROL_N = 600; 2e-24 at N, 2e-5 at 300): a test's power grows
# with its sample, so what fails at 600 fails at 1,200.
N, ALPHA = 1200, 1e-6
CONTROL_N = 600


class CostedSequences(TrigramSequences):
    """Sequences whose every call takes cost(tokens in the call) of a fake clock."""

    def __init__(self, table, sequences, clock, cost, name="trigram"):
        super().__init__(table, sequences, name)
        self.clock, self.cost = clock, cost

    def score_many(self, requests):
        self.clock.now += self.cost(sum(len(ids) for _, ids, _ in requests))
        return super().score_many(requests)


def target_cost(n):  # a memory-bound target: more tokens cost little more
    return 1.0 + 0.05 * (n - 1)


def draft_cost(n):
    return 0.1 + 0.005 * (n - 1)


def adaptive_batches(n, wrap=None, draft_table=MIXED_DRAFT):
    clock = FakeClock()
    target = CostedSequences(MIXED_TARGET, 4, clock, target_cost)
    draft = CostedSequences(draft_table, 4, clock, draft_cost, name="draft")
    prices = Prices(Curve({1: target_cost(1), 32: target_cost(32)}), Curve({1: draft_cost(1), 16: draft_cost(16)}))
    policy = Planner(4, prices, clock).seat()
    counts, lengths = {}, {}
    for i in range(n):
        configs = [GenerationConfig(max_new_tokens=LENGTH, sampling=SAMPLED, seed=4 * i, verifier="rejection"),
                   GenerationConfig(max_new_tokens=6, sampling=GREEDY),
                   GenerationConfig(max_new_tokens=LENGTH, sampling=NUCLEUS, seed=4 * i + 2),
                   GenerationConfig(max_new_tokens=LENGTH, sampling=SAMPLED, seed=4 * i + 3, verifier="rejection")]
        queue = list(configs)

        def make_drafter(slot):
            sampling = queue.pop(0).sampling
            model = ModelDrafter(slot, sampling)
            model.clock = clock
            drafter = HybridDrafter(model, NgramDrafter(max_ngram=2))
            return wrap(drafter, sampling) if wrap is not None else drafter

        prompts = [MIXED_PROMPT, [3, 4, 5], MIXED_PROMPT, MIXED_PROMPT]
        results, _ = generate_many(target, prompts, configs, draft, make_drafter, policy, clock=clock)
        for j in (0, 3):
            key = tuple(results[j].token_ids)
            counts[key] = counts.get(key, 0) + 1
        for result in results:
            for m, c in enumerate(result.stats.draft_length_histogram):
                lengths[m] = lengths.get(m, 0) + c
    return counts, lengths


def prefix(distribution: dict, k: int) -> dict:
    out = {}
    for sequence, value in distribution.items():
        out[sequence[:k]] = out.get(sequence[:k], 0) + value
    return out


def keeps_only_drafts_it_predicts_rejected(drafter, sampling):
    """Wrong: a draw made ahead of verification predicts the target's verdict on the
    first draft, and the round proposes it only where the prediction is a rejection:
    the draft length depends on the current round's verdict."""
    rng = torch.Generator().manual_seed(99)

    def cut_at(context, d):
        if not len(d):
            return 0
        token = int(d.tokens[0])
        target = logits_to_probs(TrigramBackend(MIXED_TARGET).next_logits(list(context))[None], sampling)[0]
        draft = 1.0 if d.probs is None else float(d.probs[0, token])
        return int(float(torch.rand(1, generator=rng)) * draft >= float(target[token]))

    return _Truncating(drafter, cut_at)


def test_four_sequences_planned_together_each_follow_the_target():
    counts, lengths = adaptive_batches(N)
    exact = exact_distribution(TrigramBackend(MIXED_TARGET), MIXED_PROMPT, LENGTH, SAMPLED)
    assert lengths.get(0, 0) > N // 20  # plain steps
    assert sum(1 for m, c in lengths.items() if m > 0 and c > N // 100) >= 2  # several draft lengths
    assert_fits(counts, exact, 2 * N)
    assert_fits(prefix(counts, 2), prefix(exact, 2), 2 * N)


def test_negative_control_a_drafter_that_peeks_at_the_verdict_fails_in_a_batch(monkeypatch):
    # The goodput guard is off: a drafter that throws drafts away realises less and
    # would be barred from drafting, hiding the bias this control must show.
    monkeypatch.setattr(Goodput, "barred", lambda self, size, kind: False)
    monkeypatch.setattr(Goodput, "probe", lambda self, size: False)
    # The first round may draft too: a sequence's first token is otherwise a plain step
    # (Offer.free), and drafting at the prompt, where every sequence shares one context,
    # is where N sequences show the bias plainest (from the second token on, spread over
    # the contexts the first token leads to, it is out of this N's reach).
    # (Seat.offered: where a seat, alone or in a scheduler, answers a free offer itself.)
    offered = Seat.offered
    monkeypatch.setattr(Seat, "offered", lambda self, offer: offered(self, dataclasses.replace(offer, free=False)))
    counts, _ = adaptive_batches(CONTROL_N, wrap=keeps_only_drafts_it_predicts_rejected)
    exact = exact_distribution(TrigramBackend(MIXED_TARGET), MIXED_PROMPT, LENGTH, SAMPLED)
    p = assert_misfits(prefix(counts, 2), prefix(exact, 2), 2 * CONTROL_N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance

"""Drafting during the target's call (decoding/overlap.py): the output is still the
target's.

A trigram toy pair placed apart (stream's `overlap`, as assembly places a target
on RPC workers: assemble.pair_overlaps) makes the loop take the overlapped path:
each model round's call runs on a thread while the draft drafts the next block, and
a round whose drafts were all accepted hands that block to the next round instead
of a bonus token. (The checks of a fixed K make the call on the loop's thread
instead, where it is handed over: CallsInline says why their outputs are the same.) The same
token-by-token check as tests/test_distribution.py (toy.assert_follows, SAMPLES
sequences of LENGTH tokens, p < 1e-6 fails) runs on that path, with fixed K, -k auto
and the coupled verifier; its negative controls keep the block in two wrong ways
and must fail it: verified against the row of the block's last draft instead of the
row after it (the classic off-by-one), and kept only when its first draft looks
acceptable (a decision that peeks at the next round's verdict). Dropping the block
after a rejection is what keeps rounds short, not what keeps them exact: a block
verified against the rows of the text it follows is exact whatever it was drafted
after (modified rejection sampling is exact for any proposal drawn before the
verification), so keeping it after a rejection is no negative control.
"""

import threading
import unittest.mock

import pytest
import torch

from specsample.decoding import overlap as overlap_module
from specsample.decoding.drafters import Draft, HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.overlap import CallThread, Overlap, TargetCall, next_block_size, stream_overlaps
from specsample.decoding.plans import FORCED, MODEL, lookup_source
from specsample.decoding.sampling import SamplingConfig, logits_to_probs
from specsample.policy.make import K_MAX, make_policy
from specsample.policy.curve import Curve, round_seconds

from toy import (ALPHA, CostedBackend, FakeClock, TrigramBackend, assert_does_not_follow, assert_follows, empirical,
                 mixed_tables, random_table)

pytestmark = pytest.mark.pure

VOCAB, LENGTH, SAMPLES = 6, 5, 4_000
CONTROL_SAMPLES = 2_000  # each negative control: half the checks' SAMPLES
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
DRAFTS = {
    "close": TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0),  # most blocks accepted whole: kept
    "far": random_table(VOCAB, seed=2),  # frequent rejections: blocks dropped
}


class CallsInline(CallThread):
    """Each target call run on the loop's own thread as it is handed over, before the
    drafting it overlaps. A fixed-K check draws the same outputs either way (the draft
    and the sampler are the loop thread's alone, and a fixed K never reads the
    clock: overlap.py), and on a toy target two thread handoffs a round cost more
    than the round. The call thread itself runs in the adaptive check (whose plans
    follow the threads' order), the greedy, error and counting tests below, and
    test_rpc_workers.py."""

    def run(self, call: TargetCall) -> None:
        call()


def overlapped(kind, sampling, k, verifier="rejection", n=SAMPLES):
    """n outputs of the remote target, the `kind` draft drafting K = k, its calls made
    inline (CallsInline); and the rounds whose drafts were drafted during the call
    before them (kept blocks)."""
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier=verifier)
    drafter, stats = ModelDrafter(TrigramBackend(DRAFTS[kind], name=kind), sampling), []
    with unittest.mock.patch.object(overlap_module, "CallThread", CallsInline):
        counts = empirical(n, TrigramBackend(TARGET), PROMPT, config, drafter, k, stats=stats, overlap=True)
    return counts, sum(s.predrafted_rounds for s in stats)


GREEDY = SamplingConfig(temperature=0)


def greedy(target, draft, k, tokens=10, prompt=PROMPT):
    """Greedy speculation with `draft` (a backend) drafting for `target`; k "auto": a
    planner timed on the pair and this prompt first, as the loop never times models."""
    policy = make_policy("auto", K_MAX, target, draft, context=prompt) if k == "auto" else k
    return generate(target, prompt, GenerationConfig(max_new_tokens=tokens, sampling=GREEDY),
                    ModelDrafter(draft, GREEDY), policy, overlap=True)


@pytest.mark.parametrize("kind,k,temperature,top_k,top_p,verifier", [
    ("close", 1, 0.8, 4, 0.9, "rejection"),
    ("far", 3, 1.0, 0, 1.0, "rejection"),
    ("close", 2, 1.0, 0, 1.0, "coupled"),
])
def test_the_overlapped_rounds_preserve_the_target_distribution(kind, k, temperature, top_k, top_p, verifier):
    sampling = SamplingConfig(temperature, top_k, top_p)
    counts, predrafted = overlapped(kind, sampling, k, verifier)
    assert predrafted > SAMPLES // 40  # the path under test: blocks drafted during a call were kept and verified
    assert_follows(counts, TrigramBackend(TARGET), PROMPT, sampling)


def test_the_adaptive_policy_on_the_overlapped_rounds_preserves_the_target_distribution():
    """-k auto over the hybrid drafter on a fake clock (toy.mixed_tables: a draft that
    is right on easy contexts only): lengths and sources change with the outcomes."""
    sampling = SamplingConfig(1.0)
    target_table, draft_table = mixed_tables(VOCAB, seed=3)
    clock = FakeClock()
    lock = threading.Lock()

    def cost(base):  # the clock moves from two threads at once: one at a time
        def tick(m):
            with lock:
                return base + 0.1 * (m - 1)
        return tick

    target = CostedBackend(TrigramBackend(target_table), clock, cost(1.0))
    draft = CostedBackend(TrigramBackend(draft_table), clock, cost(0.3))
    model = ModelDrafter(draft, sampling)
    model.clock = clock
    drafter = HybridDrafter(model, NgramDrafter(max_ngram=2))
    prompt = [1, 4, 3, 2, 5, 3, 1, 2, 1, 4]
    policy = make_policy("auto", 4, target, draft, context=prompt, clock=clock)
    config, stats = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier="rejection"), []
    counts = empirical(SAMPLES, target, prompt, config, drafter, policy, clock=clock, stats=stats, overlap=True)
    # The path under test was taken: kept blocks. How many depends on the threads' order
    # (both move the one clock, so a call's timed seconds, the prices and the blocks'
    # lengths follow the scheduling): 200 and more alone, 67-98 on a loaded machine, 24
    # in a fresh clone's run beside another model process. So the count only shows the
    # path was taken; the distribution check below is what holds it to exactness.
    assert sum(s.predrafted_rounds for s in stats) > 0
    assert policy.planner.prices.draft.hidden > 0  # kept blocks' calls were priced as hidden
    assert_follows(counts, TrigramBackend(target_table), prompt, sampling)


RIGHT_KEEP = Overlap.keep


def keep_with_the_last_drafts_row(self, block, draft, verdict, logits):
    """Wrong: the kept block starts from the row of the last draft (the target after
    all but one of the drafts) instead of the row after all of them."""
    verdict, carry = RIGHT_KEEP(self, block, draft, verdict, logits)
    return verdict, None if carry is None else logits[-2:-1]


def keep_when_the_block_looks_right(sampling):
    """Wrong: the block is kept only when its first draft would surely be accepted
    (target probability at least the draft's); else the bonus is drawn. Whether the
    position is drafted then depends on the drawn draft and the target's row for it."""

    def keep(self, block, draft, verdict, logits):
        if block is not None and len(block) and verdict.num_accepted == len(draft):
            token = int(block.tokens[0])
            target = logits_to_probs(logits[-1:], sampling)[0]
            if float(target[token]) < float(block.probs[0, token]):
                return verdict, None
        return RIGHT_KEEP(self, block, draft, verdict, logits)

    return keep


@pytest.mark.parametrize("wrong,kind", [("last-drafts-row", "far"), ("peek", "close")])
def test_negative_control_blocks_kept_the_wrong_way_fail_the_check(monkeypatch, wrong, kind):
    """At CONTROL_SAMPLES = 2,000, half the checks' N: p ~ 2e-28 for the last draft's
    row, 5e-13 for the peek (2e-102 and 4e-18 at SAMPLES; at 1,000 they land at 2e-6
    and 6e-5, too near the level). A test's power grows with its sample, so what fails
    at 2,000 fails at 4,000."""
    sampling = SamplingConfig()
    keep = keep_with_the_last_drafts_row if wrong == "last-drafts-row" else keep_when_the_block_looks_right(sampling)
    monkeypatch.setattr(Overlap, "keep", keep)
    counts, predrafted = overlapped(kind, sampling, 2, n=CONTROL_SAMPLES)
    assert predrafted > 0
    p = assert_does_not_follow(counts, TrigramBackend(TARGET), PROMPT, sampling)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_greedy_overlapped_speculation_equals_plain_greedy(k):
    target, predrafted = TrigramBackend(TARGET), 0
    for table in (DRAFTS["close"], TARGET):  # the target as its own draft: every block is kept
        for prompt in ([1, 2], [3, 3, 0], [5, 4, 1, 2]):
            plain = generate(TrigramBackend(TARGET), prompt, GenerationConfig(max_new_tokens=24, sampling=GREEDY))
            spec = greedy(target, TrigramBackend(table), k, 24, prompt)
            assert spec.token_ids == plain.token_ids
            predrafted += spec.stats.predrafted_rounds
    assert predrafted > 0


def test_a_kept_block_costs_no_bonus_and_the_counts_add_up():
    """Every emitted token is counted once: kept blocks' drafts are drafted and
    accepted in the round that verifies them, and their target calls are counted."""
    result = greedy(TrigramBackend(TARGET), TrigramBackend(TARGET), 3, 30)  # the target as its own draft: all accepted
    stats = result.stats
    assert stats.accepted == stats.drafted and len(result.token_ids) == 30
    # Blocks of 3, each verified in a call of its own; only the last round draws a bonus.
    assert stats.predrafted_rounds == stats.target_calls - 1
    assert stats.target_calls == 10


def test_an_error_in_the_target_call_reaches_the_caller():
    class Failing(TrigramBackend):
        def score(self, token_ids, num_logits):
            if self.length > len(PROMPT):
                raise RuntimeError("the workers are gone")
            return super().score(token_ids, num_logits)

    with pytest.raises(RuntimeError, match="the workers are gone"):
        greedy(Failing(TARGET), TrigramBackend(TARGET), 2)


def test_only_a_remote_target_with_a_draft_model_and_no_grammar_overlaps():
    sampling = SamplingConfig()
    model = ModelDrafter(TrigramBackend(DRAFTS["close"]), sampling)
    assert stream_overlaps(True, model, None)
    assert stream_overlaps(True, HybridDrafter(model), None)
    assert not stream_overlaps(False, model, None)  # placed together: the draft would take the target's cores
    assert not stream_overlaps(True, NgramDrafter(), None)  # lookups cost nothing to hide
    assert not stream_overlaps(True, None, None)
    assert not stream_overlaps(True, model, object())  # a grammar stands at the end of the accepted text


def test_the_next_block_has_the_drafts_the_policy_wants_within_k_and_the_budget():
    def draft(sources):
        return Draft(torch.zeros(len(sources), dtype=torch.long), None, list(sources), [None] * len(sources))

    assert next_block_size(draft([MODEL] * 3), 3, 8, 20) == 3
    assert next_block_size(draft([MODEL] * 3), 6, 8, 20) == 6
    assert next_block_size(draft([MODEL] * 3), 6, 2, 20) == 2  # K
    assert next_block_size(draft([MODEL] * 3), 8, 8, 5) == 1  # 3 emitted, then one draft and its bonus
    assert next_block_size(draft([MODEL] * 3), 8, 8, 4) == 0
    assert next_block_size(draft([lookup_source(2)] * 3), 8, 8, 20) == 0
    assert next_block_size(draft([FORCED, MODEL]), 8, 8, 20) == 0
    assert next_block_size(draft([]), 8, 8, 20) == 0


def test_the_planner_drafts_ahead_what_the_call_holds_so_one_draft_does_not_chain_blocks_of_one():
    """A round that drafted one token kept a block of one, whose round drafted one
    more: blocks of one verified a token a call, plain decoding's rate, for as long
    as they were accepted (seen on pinned workers). The planner now drafts ahead as
    many as fit in the call's time, and its next plan cuts the block."""
    from specsample.decoding.plans import FixedK

    assert FixedK(3).ahead(1, 2) == 1  # a fixed K drafts its K (its rounds have K drafts)
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(TARGET), clock, lambda m: 0.12 + 0.03 * (m - 1))
    draft = CostedBackend(TrigramBackend(TARGET), clock, lambda m: 0.02)  # the target as its own draft
    policy = make_policy("auto", 8, target, draft, context=PROMPT, clock=clock)
    assert policy.ahead(1, 1) == 6  # 120 ms of call holds six 20 ms steps
    assert policy.ahead(1, 5) == 8  # within K
    assert policy.ahead(7, 1) == 7  # never fewer than this round's
    model = ModelDrafter(draft, GREEDY)
    model.clock = clock
    result = generate(target, PROMPT, GenerationConfig(max_new_tokens=40, sampling=GREEDY), model, policy, clock,
                      overlap=True)
    assert result.stats.predrafted_rounds > 0
    assert result.stats.mean_tokens_per_target_call > 3


def test_a_round_is_priced_at_the_longer_of_call_and_drafting_as_far_as_drafting_hides():
    assert round_seconds(0.2, 0.16, 0.0) == pytest.approx(0.36)  # nothing overlaps: the sum
    assert round_seconds(0.2, 0.16, 1.0) == pytest.approx(0.2)  # all of it: the longer
    assert round_seconds(0.2, 0.3, 1.0) == pytest.approx(0.3)
    assert round_seconds(0.2, 0.16, 0.5) == pytest.approx(0.28)
    curve = Curve({1: 0.04})
    assert curve.hidden == 0.0
    for hidden in (True, False, True, True):
        curve.observe(1, 0.04, hidden)
    assert 0.5 < curve.hidden < 1.0


def test_an_error_while_drafting_during_the_call_waits_for_the_call_first():
    """The target is never left in the middle of a call by an error on the loop's side."""
    import time

    finished = []

    class Slow(TrigramBackend):
        def score(self, token_ids, num_logits):
            if self.length >= len(PROMPT):  # a call after the prefill
                time.sleep(0.2)
                finished.append(True)
            return super().score(token_ids, num_logits)

    class Breaking(TrigramBackend):
        def score(self, token_ids, num_logits):
            if self.length > len(PROMPT) + 1:  # a step of the next block
                raise RuntimeError("the draft broke")
            return super().score(token_ids, num_logits)

    with pytest.raises(RuntimeError, match="the draft broke"):
        greedy(Slow(TARGET), Breaking(TARGET), 2)
    assert finished

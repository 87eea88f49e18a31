"""The draft-length policies, on fake costs: what they choose and why."""

import json

import pytest
import torch

from specsample.calibrate import cost_cache_path
from specsample.control import AdaptiveController, FixedK, make_policy
from specsample.drafters import HybridDrafter, ModelDrafter
from specsample.plans import MODEL, DraftCall, Offer, RoundReport, lookup_source
from specsample.generate import GenerationConfig, generate
from specsample.sampling import SamplingConfig

from toy import CostedBackend, FakeClock, TrigramBackend, random_table

pytestmark = pytest.mark.pure


def controller(target_costs, draft_step, accept=None, **kw):
    """A calibrated controller: target_costs[n - 1] seconds for n tokens."""
    c = AdaptiveController(k_max=len(target_costs) - 1, **kw)
    c.costs.warm_start(target_costs, draft_step, draft_step / 10)
    if accept is not None:
        for i in range(c.k_max):
            rate = c.acceptance[MODEL].at(i)
            rate.hits, rate.trials = accept * 50, 50
    return c


def choose(policy, available, lag, lookup=None):
    """(source, planned length) of the policy's plan for this offer."""
    plan = policy.plan(Offer(available, lag, lookup))
    return plan.source, plan.length


NGRAM2, NGRAM3 = lookup_source(2), lookup_source(3)


FLAT = [1.0, 1.05, 1.1, 1.12, 1.2, 1.3, 1.4, 1.5, 1.6]  # memory-bound: drafts are nearly free to verify
LINEAR = [1.0, 1.7, 2.2, 2.8, 3.4, 3.9, 4.5, 4.8, 5.4]  # compute-bound: this project's CPU on llama.cpp


def test_drafts_long_when_verification_is_flat_and_acceptance_high():
    source, m = choose(controller(FLAT, 0.1, accept=0.9), {MODEL: 8}, lag=1)
    assert source == MODEL and m >= 4


def test_draft_length_falls_with_acceptance_and_reaches_plain_steps():
    lengths = [choose(controller(FLAT, 0.3, accept=a), {MODEL: 8}, lag=1)[1] for a in (0.95, 0.8, 0.6, 0.4, 0.1)]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] >= 3 and lengths[-1] == 0


def test_no_drafting_when_verification_costs_grow_linearly():
    # Scoring n tokens costs ~0.55 n single calls and a draft step 0.4 of one: at
    # 90% acceptance no draft length pays (at 100% the best is about even).
    assert choose(controller(LINEAR, 0.4, accept=0.9), {MODEL: 8}, lag=1) == (None, 0)


def test_free_lookup_pays_where_the_model_does_not():
    c = controller(LINEAR, 0.4, accept=0.9)
    for i in range(8):
        rate = c.acceptance[NGRAM3].at(i)
        rate.hits, rate.trials = 0.97 * 50, 50
    source, m = choose(c, {MODEL: 8, NGRAM3: 8}, lag=1)
    assert source == NGRAM3 and m >= 4


def test_confidence_cuts_a_round_short_before_the_token_is_drawn():
    c = controller(FLAT, 0.3, accept=0.9)
    bins = c.acceptance[MODEL]
    for b in range(10):  # acceptance tracks confidence
        rate = bins.given_confidence((b + 0.5) / 10)
        rate.hits, rate.trials = (b + 0.5) / 10 * 50, 50
    plan = c.plan(Offer({MODEL: 8}, 1))
    assert plan.length >= 2
    assert plan.extent(0, 0.97) > 0  # sure: keep drafting
    assert plan.extent(1, 0.05) == 1  # unsure at position 1: end with one draft


def test_draft_prefill_is_paid_only_when_the_answer_is_long_enough():
    c = controller(FLAT, 0.3, accept=0.9)
    c.costs.warm_start(FLAT, 0.3, 0.2)  # each unseen token costs the draft 0.2 of a target call
    c.begin([], max_new_tokens=6)
    assert choose(c, {MODEL: 5}, lag=200)[1] == 0  # 40 target calls of prefill for 6 tokens
    c.begin([], max_new_tokens=2000)
    assert choose(c, {MODEL: 8}, lag=200)[1] > 0


def test_a_failing_source_sits_out_then_is_probed_again():
    c = controller(FLAT, 0.3)
    report = RoundReport([MODEL] * 3, [0.5] * 3, 0, 4, 1.12, [DraftCall(1, 0.3)] * 3, 2.1, (7,))
    for _ in range(30):  # every draft rejected
        choose(c, {MODEL: 8}, lag=1)
        c.observe(report)
    assert choose(c, {MODEL: 8}, lag=1) == (None, 0)
    rounds = 0
    while choose(c, {MODEL: 8}, lag=1) == (None, 0):
        rounds += 1
        assert rounds < 5000
    assert rounds > 50  # not at once: a probe is not free


def test_costs_follow_the_rounds_and_the_load():
    c = controller(FLAT, 0.3)
    for _ in range(40):  # the machine got twice as slow
        c.observe(RoundReport([], [], 0, 1, 2.0, [], 2.0, (7,)))
    assert c.costs.target_call(1) == pytest.approx(2.0, rel=0.01)
    assert c.costs.target_call(4) == pytest.approx(2.0 * 1.12, rel=0.01)  # the shape is kept


def test_unmeasured_sizes_are_interpolated():
    c = AdaptiveController(k_max=8)
    c.costs.warm_start([1.0, 2.0, 3.0])
    assert c.costs.target_call(5) == pytest.approx(5.0)


def test_calibration_is_measured_once_then_read_from_the_cache(tmp_path):
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(random_table(5, 0)), clock, lambda n: 1.0 + 0.5 * (n - 1))
    draft = CostedBackend(TrigramBackend(random_table(5, 1)), clock, lambda n: 0.2 + 0.05 * (n - 1))
    target.score([1, 2, 3], 1)
    cache = tmp_path / "costs.json"

    c = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert c.costs.target_call(3) == pytest.approx(2.0) and c.costs.draft_step.value == pytest.approx(0.2)
    assert c.costs.draft_token.value == pytest.approx(0.05) and c.costs.draft_first.value == pytest.approx(0.2)
    assert target.length == 3 and draft.length == 0  # measurements leave the caches as they were
    assert json.loads(cache.read_text())["target"] == pytest.approx([1.0, 1.5, 2.0, 2.5])
    calls = target.calls
    again = make_policy("auto", 3, target, draft, context=[1, 2, 3], cost_cache=cache, clock=clock)
    assert target.calls == calls and again.costs.target_call(2) == pytest.approx(1.5)


def test_cost_cache_is_keyed_by_both_models_and_needs_a_key(tmp_path):
    class B:
        def __init__(self, key):
            self.cost_key = key

    a = cost_cache_path(tmp_path, B("t1"), B("d1"))
    assert a != cost_cache_path(tmp_path, B("t1"), B("d2"))
    assert cost_cache_path(tmp_path, B("t1"), B(None)) is None


def test_fixed_k_prefers_a_lookup_and_respects_its_length():
    policy = FixedK(4)
    assert choose(policy, {MODEL: 6, NGRAM2: 2}, lag=1) == (NGRAM2, 2)
    assert choose(policy, {MODEL: 6}, lag=1) == (MODEL, 4)
    assert policy.plan(Offer({MODEL: 6}, 1)).extent_at(3, 0.0) == 4
    with pytest.raises(ValueError):
        FixedK(-1)


def test_a_lookup_is_scored_in_the_shadow_of_plain_steps():
    import torch

    c = controller(LINEAR, 0.4, accept=0.1)
    before = c.acceptance[NGRAM2].at(0).value
    lookup = [3, 4, 5, 6]
    for i in range(3):  # the emitted text follows the lookup, which the target gives p = 0.9
        probs = torch.full((8,), 0.1 / 7)
        probs[lookup[i]] = 0.9
        choose(c, {MODEL: 8, NGRAM2: 4 - i}, lag=1, lookup=(NGRAM2, tuple(lookup[i:])))
        c.observe(RoundReport([], [], 0, 1, 1.0, [], 1.0, (lookup[i],), probs[None]))
    model = c.acceptance[NGRAM2]
    assert model.at(0).value > before and model.at(1).trials > 0 and model.at(2).trials > 0
    assert model.at(0).hits == pytest.approx(0.9 * model.at(0).trials / 1.0, rel=0.2)


def test_a_lookup_is_scored_in_the_shadow_of_a_model_round():
    import torch

    c = controller(FLAT, 0.1, accept=0.9)
    lookup = [3, 4, 5, 6]
    assert choose(c, {MODEL: 8, NGRAM2: 4}, lag=1, lookup=(NGRAM2, tuple(lookup)))[0] == MODEL
    rows = torch.full((4, 8), 0.05)
    rows[0, 3], rows[1, 4], rows[2, 5] = 0.9, 0.8, 0.2
    # Two drafts accepted, then token 9 where the lookup said 5: rows 0-2 each follow
    # the text emitted before them; row 3 (after a rejection) is not the target's.
    c.observe(RoundReport([MODEL] * 3, [0.9] * 3, 2, 4, 1.1, [DraftCall(1, 0.1)] * 3, 1.5, (3, 4, 9), rows))
    model = c.acceptance[NGRAM2]
    assert (model.at(0).hits, model.at(0).trials) == (pytest.approx(0.9), 1)
    assert (model.at(1).hits, model.at(1).trials) == (pytest.approx(0.8 * 0.9 + 0.2), pytest.approx(1.9))  # one rate, decayed
    assert c.shadow.followed is None  # the text left the lookup


def test_a_lookups_later_drafts_share_one_rate_and_the_models_do_not():
    c = controller(FLAT, 0.1)
    lookup, model = c.acceptance[NGRAM3], c.acceptance[MODEL]
    assert lookup.at(1) is lookup.at(7) and lookup.at(0) is not lookup.at(1)
    assert model.at(1) is not model.at(2)


def test_lookups_that_fail_after_their_first_token_stop_costing_a_compute_bound_target():
    """Code repeats a name or a bracket, then goes its own way: a lookup's first token is
    often right, the rest not. Each failed rate must count against every later draft of
    the source, or untried positions keep promising long runs (and wide calls, which a
    compute-bound target pays for in full)."""
    c = controller(LINEAR, 0.4, accept=0.1)
    for _ in range(6):
        source, m = choose(c, {MODEL: 8, NGRAM3: 8}, lag=1, lookup=(NGRAM3, (1, 2, 3, 4, 5, 6, 7, 8)))
        if source is None:
            break
        c.observe(RoundReport([source] * m, [None] * m, 1, m + 1, 2.0, [], 2.0, (1, 9)))
    assert choose(c, {MODEL: 8, NGRAM3: 8}, lag=1) == (None, 0)


def test_a_capped_warm_up_does_not_make_the_draft_prefill_look_unpayable():
    # A warm-up (or any request) cut by its token budget says nothing about how long
    # answers run. Taken as typical, its 8 tokens made the controller spread a long
    # prompt's draft prefill over 8 tokens, so it never drafted with the model.
    c = controller(FLAT, 0.3, accept=0.9)
    c.costs.warm_start(FLAT, 0.3, 0.02)  # each unseen token costs the draft 0.02 of a target call
    c.begin([], max_new_tokens=8)
    for _ in range(8):
        choose(c, {MODEL: 8}, lag=1)
        c.observe(RoundReport([], [], 0, 1, 1.0, [], 1.0, (7,)))
    c.begin([], max_new_tokens=512)
    assert c.length.typical.value is None
    assert choose(c, {MODEL: 8}, lag=400)[1] > 0


def test_an_answer_longer_than_typical_is_expected_to_keep_going():
    c = controller(FLAT, 0.3)
    c.length.typical.value = 10.0
    c.begin([], max_new_tokens=512)
    assert c.length.expected_remaining() == 10
    c.length.generated = 40
    assert c.length.expected_remaining() == 40  # not the floor of 8: it has outrun typical answers
    c.length.generated = 500
    assert c.length.expected_remaining() == 12  # never past the budget


def test_the_first_draft_call_of_a_round_is_priced_apart():
    c = controller(FLAT, 0.2)
    for _ in range(40):  # the first call runs cold, after the target's
        calls = [DraftCall(1, 0.5)] + [DraftCall(1, 0.2)] * 3
        c.observe(RoundReport([MODEL] * 4, [0.9] * 4, 4, 5, 1.2, calls, 2.3, (1, 2, 3, 4, 5)))
    assert c.costs.drafting(1) == pytest.approx(0.5, rel=0.01)
    assert c.costs.drafting(4) == pytest.approx(0.5 + 3 * 0.2, rel=0.01)


def test_one_timing_spike_does_not_price_the_draft_out_for_the_rest_of_the_run():
    """A draft step descheduled by another process took 0.53 s instead of 0.035: taken at
    a fifth of its size it made the draft look unpayable, and only model rounds time
    the draft, so nothing brought the estimate back."""
    c = controller(LINEAR, 0.02, accept=0.9)
    assert choose(c, {MODEL: 8}, lag=1)[0] == MODEL
    spike = [DraftCall(1, 0.02), DraftCall(1, 0.02), DraftCall(1, 0.3)]  # 15x the step
    c.observe(RoundReport([MODEL] * 3, [0.9] * 3, 3, 4, 2.8, spike, 3.14, (1, 2, 3, 4)))
    assert c.costs.draft_step.value == pytest.approx(0.02 * 1.2)
    assert choose(c, {MODEL: 8}, lag=1)[0] == MODEL


def test_a_real_slowdown_of_the_draft_is_followed():
    c = controller(FLAT, 0.1)
    for _ in range(25):  # every draft step now takes 5x as long
        calls = [DraftCall(1, 0.5)] * 4
        c.observe(RoundReport([MODEL] * 4, [0.9] * 4, 4, 5, 1.2, calls, 3.2, (1, 2, 3, 4, 5)))
    assert c.costs.draft_step.value == pytest.approx(0.5, rel=0.01)


def memory_bound_pair(clock):
    """A target whose calls cost little more for more tokens, and a 0.1-cost draft
    that agrees with it on most tokens."""
    table = random_table(12, seed=5, scale=4.0)
    target = CostedBackend(TrigramBackend(table), clock, lambda n: 1.0 + 0.05 * (n - 1))
    draft = CostedBackend(TrigramBackend(table + 0.3 * random_table(12, seed=6), name="draft"), clock,
                          lambda n: 0.1 + 0.01 * (n - 1))
    return target, draft


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8, top_p=0.95)])
def test_auto_keeps_up_with_the_best_fixed_k_on_a_memory_bound_target_after_a_warm_up(sampling):
    # As the bench runs it: one controller, a short capped warm-up, then a long prompt.
    prompt = [int(t) for t in torch.randint(0, 12, (300,), generator=torch.Generator().manual_seed(0))]
    config = GenerationConfig(max_new_tokens=120, k="auto", sampling=sampling, seed=1)

    def seconds(k):
        clock = FakeClock()
        target, draft = memory_bound_pair(clock)
        policy = make_policy("auto", 8, target, draft, context=prompt[:16], clock=clock) if k == "auto" else FixedK(k)
        def drafter(s):
            model = ModelDrafter(draft, s)
            model.clock = clock
            return HybridDrafter(model)

        if k == "auto":
            warm = GenerationConfig(max_new_tokens=8, k="auto", sampling=SamplingConfig(temperature=0.0))
            generate(target, prompt[:16], warm, drafter(warm.sampling), policy, clock)
        start = clock.now
        result = generate(target, prompt, config, drafter(sampling), policy, clock)
        return (clock.now - start) / result.stats.new_tokens

    best_fixed = min(seconds(k) for k in (2, 4, 6))
    assert seconds("auto") <= best_fixed / 0.95
def test_a_new_sequence_starts_without_the_last_ones_lookup():
    """The shadow lookup of one request must not be scored against the next request's
    first distribution: that token follows a different text."""
    import torch

    c = controller(LINEAR, 0.4, accept=0.1)
    c.begin([1, 2], 10)
    lookup = [3, 4, 5]
    probs = torch.full((8,), 0.1 / 7)
    probs[3] = 0.9
    choose(c, {MODEL: 8, NGRAM2: 3}, lag=1, lookup=(NGRAM2, tuple(lookup)))
    c.observe(RoundReport([], [], 0, 1, 1.0, [], 1.0, (3,), probs[None]))  # the text followed the lookup's first token
    second = c.acceptance[NGRAM2].at(1)
    seen = (second.hits, second.trials)
    c.begin([7, 7], 10)  # the next request
    other = torch.full((8,), 1 / 8)
    other[4] = 0.0  # where the old lookup's second token would be scored
    choose(c, {MODEL: 8}, lag=1)
    c.observe(RoundReport([], [], 0, 1, 1.0, [], 1.0, (6,), other[None]))
    assert (second.hits, second.trials) == seen
    assert c.shadow.followed is None and c.shadow.offered is None

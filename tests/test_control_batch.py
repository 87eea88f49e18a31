"""-k auto for sequences decoded together: each sequence's policy prices its round
against the whole call the batch shares (control.py), on fake costs."""

import dataclasses

import pytest

from specsample.control import AdaptiveController, FixedK, slots_that_pay
from specsample.estimates import BatchLoad, Costs, Posted, timing
from specsample.plans import MODEL, DraftCall, Offer, RoundReport, lookup_source

pytestmark = pytest.mark.pure

# Target calls measured on llama.cpp, 2 threads, in ms: {tokens scored: ms}.
Q4_K_M = {1: 32.7, 2: 58.5, 3: 78.4, 4: 102.7, 8: 175.8}
BF16 = {1: 92.5, 2: 112.8, 3: 121.9, 4: 141.7, 8: 178.4}
DRAFT_STEP = 10.0  # ms


def costs_of(curve: dict[int, float]) -> Costs:
    costs = Costs()
    costs.warm_start([curve[n] for n in (1, 2, 3, 4)], DRAFT_STEP, DRAFT_STEP / 10, wide={8: curve[8]})
    return costs


def set_acceptance(policy, accept):
    for i in range(policy.k_max):
        rate = policy.acceptance[MODEL].at(i)
        rate.hits, rate.trials = accept * 50, 50


def bf16_controller(accept, load=None):
    c = AdaptiveController(k_max=8, costs=costs_of(BF16), load=load)
    set_acceptance(c, accept)
    return c


def with_draft_widths(costs: Costs, widths: dict[int, float]) -> None:
    """The draft's steps as if timed at these widths ({tokens: seconds})."""
    for width, seconds in widths.items():
        costs.draft_wide[width] = timing()
        costs.draft_wide[width].value = seconds


def planned(policy, available=8):
    return policy.plan(Offer({MODEL: available}, 1)).length


def post_others(load, count, tokens=5, expected=3.0, draft_steps=0):
    keys = [object() for _ in range(count)]
    for key in keys:
        load.post(key, tokens, expected, draft_steps)
    return keys


def test_heavy_load_shrinks_k():
    alone = planned(bf16_controller(0.9))
    c = bf16_controller(0.9)
    post_others(c.load, 3)  # three sequences adding 5 tokens each to the call
    busy = planned(c)
    post_others(c.load, 4)
    full = planned(c)
    assert alone >= 5 and 0 < busy < alone and full < busy


def test_alone_it_maximises_one_sequences_tokens_per_second():
    """With nobody else posting, the plan is the argmax of E(m) / T(m) over m, T(m)
    today's single-sequence price: the target call of m + 1 tokens and m draft steps."""
    for accept in (0.95, 0.9, 0.8, 0.6, 0.3):
        c = bf16_controller(accept)
        costs = c.costs

        def rate(m):
            expected = sum(accept ** j for j in range(m + 1))
            return expected / (costs.target_call(m + 1) + costs.drafting(m))

        assert planned(c) == max(range(9), key=rate)


def test_a_sequence_whose_drafts_do_not_pay_gets_0_while_others_draft():
    parent = bf16_controller(0.9)
    sequences = [parent] + [parent.fork() for _ in range(3)]
    poor = sequences[-1]
    set_acceptance(poor, 0.4)
    assert planned(bf16_controller(0.4)) > 0  # alone, its drafts pay
    for s in sequences:
        s.begin([1, 2], 64)
    for _ in range(3):  # each plan a step of coordinate ascent, the others' plans held
        lengths = [planned(s) for s in sequences]
    assert lengths[-1] == 0 and all(m > 0 for m in lengths[:-1])
    assert lengths[0] < planned(bf16_controller(0.9))  # the good ones draft less than alone, too


def test_end_removes_a_sequence_from_the_load_and_the_rest_plan_as_alone():
    c = bf16_controller(0.9)
    forks = [c.fork() for _ in range(3)]
    for s in [c, *forks]:
        s.begin([1], 64)
    for s in [c, *forks]:
        planned(s)
    assert len(c.load) == 4 and planned(c) < planned(bf16_controller(0.9))
    for s in forks:
        s.end()
    assert len(c.load) == 1 and c.load.others(c).tokens == 0
    lone = bf16_controller(0.9)
    lone.begin([1], 64)
    for confidence in (0.9, 0.2):  # the same plan, and the same in-round revisions
        mine, theirs = c.plan(Offer({MODEL: 8}, 1)), lone.plan(Offer({MODEL: 8}, 1))
        assert (mine.source, mine.length, mine.limit) == (theirs.source, theirs.length, theirs.limit)
        assert [mine.extent(i, confidence) for i in range(3)] == [theirs.extent(i, confidence) for i in range(3)]


def test_a_plan_posts_what_it_adds_to_the_call():
    c = bf16_controller(0.9)
    c.begin([1], 64)
    someone = object()
    assert c.load.others(someone).tokens == 1  # begun: its pending token
    plan = c.plan(Offer({MODEL: 8}, 1))
    posted = c.load.others(someone)
    assert (posted.tokens, posted.draft_steps) == (plan.length + 1, plan.length)
    reach = [1.0]
    for i in range(plan.length):
        reach.append(reach[-1] * c.acceptance[MODEL].at(i).value)
    assert posted.expected == pytest.approx(sum(reach))
    ngram = lookup_source(3)
    for i in (0, 1):  # a sure lookup: drafted, with no draft-model steps
        c.acceptance[ngram].at(i).hits, c.acceptance[ngram].at(i).trials = 50, 50
    plan = c.plan(Offer({ngram: 2}, 1))
    assert (plan.source, plan.length) == (ngram, 2)
    assert c.load.others(someone).tokens == 3 and c.load.others(someone).draft_steps == 0
    c.end()
    assert len(c.load) == 0


def with_confidence_bins(c):
    for b in range(10):  # acceptance tracks confidence
        rate = c.acceptance[MODEL].given_confidence((b + 0.5) / 10)
        rate.hits, rate.trials = (b + 0.5) / 10 * 50, 50
    c.begin([1], 64)
    return c


def test_the_in_round_extent_is_priced_against_the_batch_and_posts_its_revision():
    alone = with_confidence_bins(bf16_controller(0.9))
    busy = with_confidence_bins(bf16_controller(0.9))
    post_others(busy.load, 3)
    assert busy.plan(Offer({MODEL: 8}, 1)).length > 0
    # The same sure first drafts: the batch's tokens per second price each further
    # draft higher, so the round ends sooner (a rule follows one round: a plan each).
    for confidence in (0.95, 0.85, 0.75):
        fresh = [c.plan(Offer({MODEL: 8}, 1)).extent(0, confidence) for c in (alone, busy)]
        assert fresh[1] < fresh[0], confidence
    alone_plan = alone.plan(Offer({MODEL: 8}, 1))
    assert alone_plan.extent(0, 0.95) > 1
    assert alone_plan.extent(1, 0.05) == 1  # unsure at position 1: end with one draft, and say so
    revised = alone.load.others(object())
    assert (revised.tokens, revised.draft_steps) == (2, 1)
    assert revised.expected == pytest.approx(1 + alone.acceptance[MODEL].given_confidence(0.95).value)


def slow_draft_controller():
    """A draft step costs a third of a 1-token target call: alone, drafting seldom pays."""
    costs = Costs()
    costs.warm_start([BF16[n] for n in (1, 2, 3, 4)], 30.0, 3.0, wide={8: BF16[8]})
    c = AdaptiveController(k_max=8, costs=costs)
    set_acceptance(c, 0.8)
    with_confidence_bins(c)
    return c


def test_the_others_draft_steps_cost_only_their_widening_up_to_their_longest_run():
    """Draft steps are batched: while another sequence drafts 8 with the model, this
    one's first 8 steps add only what one more token costs in each of those calls
    (measured widths unknown here: the catch-up cost per token), and target tokens;
    beside a lookup drafting 8 (as many tokens in the call, no draft-model steps)
    they cost as much as alone."""
    c = slow_draft_controller()
    widening = 8 * (c.costs.draft_call(2) - c.costs.draft_call(1))
    assert 0 < widening < c.costs.drafting(8) / 4
    for steps, drafting in ((0, c.costs.drafting(8)), (8, widening)):
        other = Posted(9, 4.0, steps)
        added = c._seconds(8, MODEL, 1, 4.0, other) - c._seconds(0, None, 0, others=other)
        assert added == pytest.approx(c.costs.target_call(18) - c.costs.target_call(10) + drafting)
    # In the round too: planned alone, revised once the other has posted its run.
    extents = {}
    for steps in (0, 8):
        for confidence in (0.95, 0.75, 0.55):
            c = slow_draft_controller()
            plan = c.plan(Offer({MODEL: 8}, 1))
            c.load.post("other", 9, 4.0, steps)
            extents[steps, confidence] = plan.extent(0, confidence)
    assert all(extents[8, q] > extents[0, q] for q in (0.95, 0.75, 0.55))


def test_the_in_round_extent_sees_who_joined_the_call_since_the_plan():
    """Where each further token costs more in a fuller call, others posting after the
    plan make this round's further drafts dearer, and it ends sooner."""
    def planned_alone():
        costs = Costs()
        costs.warm_start([1.0, 1.05, 1.1, 1.12, 1.2, 1.3, 1.4, 1.5, 1.6], 0.1, 0.01, wide={16: 3.0, 32: 8.0})
        c = AdaptiveController(k_max=8, costs=costs)
        set_acceptance(c, 0.9)
        with_confidence_bins(c)
        return c, c.plan(Offer({MODEL: 8}, 1))

    for confidence in (0.95, 0.75):
        _, alone = planned_alone()
        c, joined = planned_alone()
        post_others(c.load, 3)
        assert joined.extent(0, confidence) < alone.extent(0, confidence)


def test_forks_share_the_costs_and_the_load_and_keep_their_own_text_state():
    c = bf16_controller(0.9)
    c.length.typical.value = 40.0
    twin = c.fork()
    assert twin.costs is c.costs and twin.load is c.load and twin.k_max == c.k_max
    assert twin.length is not c.length and twin.shadow is not c.shadow
    assert twin.length.typical.value == 40.0  # how long answers run is learnt once
    assert twin.acceptance[MODEL].at(0).value == pytest.approx(0.9, abs=0.01)  # a copy of what was learnt
    set_acceptance(twin, 0.2)
    assert c.acceptance[MODEL].at(0).value == pytest.approx(0.9, abs=0.01)  # not shared
    assert twin.acceptance.decay == c.acceptance.decay and twin.acceptance.priors == c.acceptance.priors
    fixed = FixedK(3).fork()
    assert isinstance(fixed, FixedK) and fixed.k_max == 3


def test_a_call_shared_by_the_batch_counts_once_in_the_costs():
    def after(reporters):
        c = bf16_controller(0.9)
        sequences = [c] + [c.fork() for _ in range(reporters - 1)]
        for s in sequences:
            s.begin([1], 64)
        for s in sequences:  # each reports the call they shared: 8 tokens, twice the calibrated time
            s.observe(RoundReport([MODEL], [0.9], 1, 8, 2 * BF16[8], [DraftCall(1, DRAFT_STEP)], 400.0, (1, 2)))
        return c.costs.target_call(8)

    one, four = after(1), after(4)
    assert BF16[8] < one and four == pytest.approx(one, rel=0.02)
    # Negative control: four full reports of the one call would move it much further.
    c = bf16_controller(0.9)
    for _ in range(4):
        c.observe(RoundReport([MODEL], [0.9], 1, 8, 2 * BF16[8], [DraftCall(1, DRAFT_STEP)], 400.0, (1, 2)))
    assert c.costs.target_call(8) - BF16[8] > 2 * (one - BF16[8])


def test_a_batch_of_more_tokens_than_calibrated_is_priced_from_the_wide_calls():
    costs = Costs()
    costs.warm_start([1.0, 1.1, 1.2], wide={8: 1.5, 16: 2.3})
    assert costs.target_call(8) == pytest.approx(1.5) and costs.target_call(16) == pytest.approx(2.3)
    assert costs.target_call(12) == pytest.approx(1.9)  # between measured sizes: interpolated
    assert costs.target_call(20) == pytest.approx(2.7)  # past them: extrapolated from the last two


# Q4_K_M on the AMD EPYC, 2 threads (ms by tokens scored): as calibrated, one
# sequence over 32 tokens, and the same sizes as a batch's calls, 4 sequences each
# holding 300 tokens (unified cache: every token attends over the others' cells too).
Q4_CALIBRATED = {1: 35, 2: 63.4, 3: 83.1, 4: 100, 5: 144.4, 6: 151.2, 7: 197.9, 8: 196, 9: 231.1, 12: 351, 16: 340,
                 24: 505, 32: 613}
Q4_UNDER_LOAD = {4: 128, 8: 265, 12: 410, 16: 415}


def q4_calibrated() -> Costs:
    costs = Costs()
    costs.warm_start([Q4_CALIBRATED[n] for n in range(1, 10)], 17.8, 2.8, 20.7,
                     wide={n: Q4_CALIBRATED[n] for n in (12, 16, 24, 32)})
    return costs


def test_sizes_the_rounds_never_scored_follow_the_drift_of_those_they_did():
    """Under load only the batch's own sizes are timed again; a size priced from the
    calibration alone moves with the nearest sizes that were."""
    costs = q4_calibrated()
    assert costs.target_call(16) == pytest.approx(340)  # nothing scored yet: as calibrated
    for _ in range(30):
        costs.observe_target(4, Q4_UNDER_LOAD[4])
    drift = Q4_UNDER_LOAD[4] / Q4_CALIBRATED[4]
    assert costs.target_call(4) == pytest.approx(Q4_UNDER_LOAD[4], rel=0.01)
    assert costs.target_call(16) == pytest.approx(340 * drift, rel=0.01)  # measured 415 under this load
    assert costs.target_call(3) == pytest.approx(83.1 * drift, rel=0.01)  # below the scored size too
    assert costs.target_call(1) == 35  # the scale is not a size's shape
    # Between two scored sizes the drift is interpolated; a scored size keeps its own price.
    for _ in range(30):
        costs.observe_target(8, Q4_CALIBRATED[8])  # as calibrated: no drift at 8
    assert costs.target_call(8) == pytest.approx(196, rel=0.01)
    assert costs.target_call(6) == pytest.approx(151.2 * (1 + (drift - 1) / 2), rel=0.01)
    assert costs.target_call(16) == pytest.approx(340, rel=0.01)
    # The first time a size is scored it moves from its drifted price, not the calibrated one.
    costs = q4_calibrated()
    for _ in range(30):
        costs.observe_target(4, Q4_UNDER_LOAD[4])
    costs.observe_target(12, Q4_UNDER_LOAD[12])
    assert costs.target_call(12) == pytest.approx(351 * drift + 0.2 * (410 - 351 * drift), rel=0.01)


def test_without_a_calibration_a_size_is_learnt_from_its_first_call_as_before():
    costs = Costs()
    costs.observe_target(1, 30.0)
    costs.observe_target(4, 90.0)
    assert costs.target_call(4) == pytest.approx(90.0)
    assert costs.target_call(8) == pytest.approx(30.0 + (90.0 - 30.0) / 3 * 7)


def test_a_batch_under_load_does_not_draft_together_on_the_stale_price_of_a_wide_call():
    """The Q4_K_M server under 4 clients (explain): its 4-token calls ran 28% dearer
    than calibrated, while the 8- to 16-token calls of drafting together kept their
    calibrated price; at an acceptance of 0.9 all four sequences then drafted (or one
    after another paid a draft call the in-round rule threw away). Priced with the
    drift, the batch stays plain: at the load's measured prices (Q4_UNDER_LOAD, draft
    steps for 4 sequences 43 ms) drafting together loses."""
    def last_turn(drift: bool):
        costs = q4_calibrated()
        with_draft_widths(costs, {2: 36.0, 3: 40.7, 4: 43.2, 5: 51.7, 6: 60.6})
        costs.overhead[False].value = costs.overhead[True].value = 1.5  # own work apart (its own test)
        for _ in range(30):
            costs.observe_target(4, Q4_UNDER_LOAD[4])
        if not drift:  # the negative control: unscored sizes priced as calibrated
            costs._drift = lambda n: 1.0
        parent = AdaptiveController(k_max=8, costs=costs)
        set_acceptance(parent, 0.9)
        sequences = [parent] + [parent.fork() for _ in range(3)]
        for s in sequences:
            s.begin(list(range(300)), 128)
        lengths = []
        for _ in range(3):
            lengths = [planned(s) for s in sequences]
        return lengths

    assert last_turn(drift=True) == [0, 0, 0, 0]
    assert sum(last_turn(drift=False)) >= 4


def test_the_joint_move_pays_for_the_others_catching_up():
    """The Q4_K_M server under 4 clients (HumanEval, sampled): one sequence, whose
    draft had read its text, planned "every sequence drafts 3" 52 times; the other
    three had never drafted, their drafts 150 tokens behind, so none followed and the
    in-round rule, priced against the real (plain) call, cut the drafts to 0-2 (0 in
    23 of them): draft calls paid alone, 0.71x our plain batching. The others' catch-up
    is the move's cost too, and with it the move is not taken."""
    def planned_beside(others_lag: int, accept: float) -> int:
        costs = Costs()  # as this machine's cost cache holds them, then the load's prices
        costs.warm_start([34.0, 63.4, 83.1, 106.9, 144.4, 151.2, 197.9, 217.0, 231.1], 15.9, 2.5, 13.0,
                         wide={12: 350, 16: 302, 24: 505, 32: 613})
        costs.draft_step.value, costs.draft_first.value, costs.draft_token.value = 18.6, 16.2, 2.83
        with_draft_widths(costs, {3: 45.2, 4: 42.6})
        costs.overhead[False].value = costs.overhead[True].value = 6.0  # own work apart (its own test)
        for _ in range(30):
            costs.observe_target(1, 40.1)
            for n, ratio in ((2, 2.55), (4, 3.89), (5, 4.89), (6, 5.61), (8, 7.83)):
                costs.observe_target(n, ratio * 40.1)
        c = AdaptiveController(k_max=8, costs=costs)
        set_acceptance(c, accept)
        c.begin(list(range(150)), 40)
        for key in post_others(c.load, 3, tokens=1, expected=1.0):
            c.load.post(key, 1, 1.0, 0, others_lag)
        return planned(c)

    for accept in (0.9, 0.95):
        assert planned_beside(others_lag=150, accept=accept) == 0
        assert planned_beside(others_lag=0, accept=accept) > 0  # with drafts that had read it all


def test_a_sequence_posts_how_far_its_draft_is_behind():
    c = bf16_controller(0.9)
    other = c.fork()
    c.begin(list(range(50)), 64)
    other.begin(list(range(70)), 64)
    assert c.load.others(c).lag == 70  # begun: its draft has read nothing
    other.plan(Offer({MODEL: 8}, 12))
    assert c.load.others(c).lag == 0  # drafting from the model: it reads those 12 first
    plain = c.fork()
    plain.begin([1, 2], 64)
    plain.plan(Offer({lookup_source(1): 0}, 30))  # nothing to draft: a plain step, the draft falls behind
    assert c.load.others(c).lag == 30


def test_slots_that_pay_on_the_measured_curves():
    # BF16 (memory-bound here): throughput still grows by more than 5% up to 8.
    assert slots_that_pay(costs_of(BF16)) == 8 and slots_that_pay(costs_of(BF16), most=4) == 4
    # Q4_K_M: 1.49x one sequence's throughput at 8 (4 and 8 measured, 5 to 7 between);
    # 7 is the first within 5% of that, and among 1 to 4 the best is 4 (1.27x), with 3
    # (1.25x) within 5% of it.
    q4 = costs_of(Q4_K_M)
    assert slots_that_pay(q4) == 7 and slots_that_pay(q4, most=4) == 3


def test_slots_that_pay_stops_where_a_bending_curve_stops_paying():
    bent = Costs()  # 2, 4 and 8 tokens as serve measured them on an AMD EPYC; 3, 5, 6, 7 between
    bent.warm_start([1.0, 1.84, 2.05, 2.23, 2.85, 3.45, 4.05, 4.68])
    throughput = [n / bent.target_call(n) for n in range(1, 9)]
    assert max(throughput) == throughput[3]
    assert slots_that_pay(bent) == 4


def test_slots_that_pay_is_1_where_calls_cost_in_proportion_or_nothing_is_measured():
    proportional = Costs()
    proportional.warm_start([n * 30.0 for n in range(1, 10)])
    assert slots_that_pay(proportional) == 1
    assert slots_that_pay(Costs()) == 1
    nearly = Costs()  # eight sequences serve 4% more than one: not enough
    nearly.warm_start([n / (1.04 ** ((n - 1) / 7)) for n in range(1, 10)])
    assert slots_that_pay(nearly) == 1


def test_a_load_with_one_sequence_has_no_others():
    load = BatchLoad()
    load.post("a", 3, 2.5, 2)
    assert load.others("a").tokens == 0 and load.others("a").expected == 0.0
    load.post("b", 4, 3.0, 3)
    load.post("c", 1, 1.0, 0)
    others = load.others("a")
    assert (others.tokens, others.expected, others.draft_steps) == (5, 4.0, 3)
    load.leave("b")
    load.leave("b")  # leaving twice is harmless: end() may follow an abandoned sequence
    assert load.others("a").draft_steps == 0 and len(load) == 2


def test_a_batched_round_prices_its_own_work_without_the_time_it_slept():
    """In a batch a round's clock also runs while the others draft and do their own work;
    the time it slept (RoundReport.waited_seconds) is taken out, so a plain round is not
    priced with the others' draft calls in it."""
    def overhead_after(waited):
        c = bf16_controller(0.9)
        for _ in range(40):  # a plain round: 1 token scored, no drafts, 300 ms on its clock
            c.observe(RoundReport([], [], 0, 1, BF16[1], [], 300.0, (1,), waited_seconds=waited))
        return c.costs.overhead[False].value

    assert overhead_after(290.0) == pytest.approx(10.0, rel=0.05)  # its own 10 ms
    # Negative control: without the time it slept, the others' work counts as its own.
    assert overhead_after(0.0) == pytest.approx(300.0 - BF16[1], rel=0.05)


def test_the_others_own_work_is_in_the_price_of_a_round():
    """Every sequence's work between calls runs on one thread: beside 3 others, a
    round waits for their plain rounds' overhead too."""
    c = bf16_controller(0.9)
    c.costs.overhead[False].update(20.0)
    own = c.costs.overhead[False].value
    c.begin([1], 64)
    alone = c._seconds(0, None, 0)
    keys = post_others(c.load, 3, tokens=1, expected=1.0)
    busy = c._seconds(0, None, 0, others=c.load.others(c))
    assert busy - c.costs.target_call(4) == pytest.approx(alone - c.costs.target_call(1) + 3 * own)
    assert own > 0
    for key in keys:
        c.load.leave(key)
    assert c._seconds(0, None, 0) == pytest.approx(alone)
    # Others that draft do a drafting round's work: its overhead, not a plain one's.
    c.costs.overhead[True].value = 3 * own
    drafting = post_others(c.load, 3, tokens=3, expected=2.5, draft_steps=2)
    assert c.load.others(c).drafters == 3
    priced = c._seconds(0, None, 0, others=c.load.others(c))
    assert priced - c.costs.target_call(10) - c.costs.drafting_widths([3, 3]) == pytest.approx(
        alone - c.costs.target_call(1) + 3 * 3 * own)
    for key in drafting:
        c.load.leave(key)


def test_a_herd_pays_for_every_drafting_rounds_own_work():
    """BF16 under 4 clients, sampled (the load's own prices: 4-request calls of 4 tokens
    166 ms and of 13 tokens 329 ms, draft steps 25-60 ms by width, own work of a
    drafting round 32 ms against 6 plain): with the others' own work priced as plain
    rounds, a herd of 4 drafting 3 kept two of them drafting, and the load ran 0.80x
    our plain batching; priced as the drafting rounds they are, all four step plain."""
    def last_turn(others_own_priced: bool):
        costs = Costs()
        costs.warm_start([BF16_EPYC[n] for n in range(1, 10)], 25.0, 3.0, 25.0,
                         wide={n: BF16_EPYC[n] for n in (12, 16, 24, 32)})
        with_draft_widths(costs, {2: 44.0, 3: 55.0, 4: 60.0})
        costs.overhead[False].value, costs.overhead[True].value = 6.0, 32.0
        for _ in range(30):
            costs.observe_target(4, 166.0)
            costs.observe_target(13, 329.0)
        parent = AdaptiveController(k_max=8, costs=costs)
        set_acceptance(parent, 0.86)
        sequences = [parent] + [parent.fork() for _ in range(3)]
        if not others_own_priced:  # the negative control: the others' own work as plain rounds'
            others = parent.load.others
            parent.load.others = lambda key: dataclasses.replace(others(key), drafters=0)
        for s in sequences:
            s.begin(list(range(100)), 40)
            s.load.post(s, 4, 3.2, 3)  # drafting 3, caught up
        lengths = []
        for _ in range(3):
            lengths = [planned(s) for s in sequences]
        return lengths

    assert last_turn(others_own_priced=True) == [0, 0, 0, 0]
    assert sum(last_turn(others_own_priced=False)) > 0


# Q4_K_M target calls measured under 4 clients on this project's Intel Xeon, 2 threads
# (ms), where every token of a call costs nearly what a call of its own does.
Q4_WIDE = {1: 97, 2: 150, 3: 165, 4: 172, 5: 255, 6: 300, 7: 340, 8: 380, 9: 413, 10: 496, 11: 545, 12: 643,
           16: 800, 24: 1150, 32: 1500}


def test_a_herd_of_drafting_sequences_breaks_up_where_plain_steps_serve_the_batch_more():
    """4 sequences drafting 2 tokens each, on a target whose calls cost by their tokens:
    for each of them alone stepping out changes the batch's rate by a few per cent
    (the wide call and the others' draft steps are paid anyway), but with all four
    plain the batch makes about twice the tokens per second."""
    def batch(herd_test: bool):
        costs = Costs()
        costs.warm_start([Q4_WIDE[n] for n in range(1, 10)], 35.0, 4.0, 37.0,
                         wide={n: Q4_WIDE[n] for n in (10, 11, 12, 16, 24, 32)})
        parent = AdaptiveController(k_max=8, costs=costs)
        set_acceptance(parent, 0.87)
        sequences = [parent] + [parent.fork() for _ in range(3)]
        for s in sequences:
            s.begin([1, 2], 512)
            if not herd_test:  # the negative control: coordinate ascent alone
                s._all_plain = lambda others: 0.0
            s.load.post(s, 3, 2.6, 2)  # every sequence drafting 2
        return [[planned(s) for s in sequences] for _ in range(3)]

    assert batch(herd_test=True)[-1] == [0, 0, 0, 0]
    stuck = batch(herd_test=False)[-1]
    assert sum(stuck) >= 4  # without the test the herd keeps drafting


def test_beside_a_sequence_whose_drafts_pay_the_batch_a_plain_batch_does_not_stop_drafting():
    """Where calls cost little more for more tokens (BF16), drafting beats all-plain and
    the test never fires: sequences keep the lengths of coordinate ascent."""
    parent = bf16_controller(0.9)
    sequences = [parent] + [parent.fork() for _ in range(3)]
    for s in sequences:
        s.begin([1, 2], 64)
    lengths = [[planned(s) for s in sequences] for _ in range(3)][-1]
    assert all(m > 0 for m in lengths)


# Calibrated on this AMD EPYC (2 threads, 4 sequences): the BF16 target, ms by tokens
# scored, and its draft model's step.
BF16_EPYC = {1: 90.5, 2: 104.3, 3: 120.1, 4: 133.4, 5: 135.5, 6: 144.8, 7: 160.2, 8: 165.4, 9: 174.7, 12: 204.6,
             16: 239.7, 24: 316.6, 32: 436.4}


# The draft model's step (Q4_0 0.5B) on that machine, ms by the call's width: one
# token for each of 4 sequences holding 200 tokens, and 2 for each.
DRAFT_WIDE_EPYC = {4: 48.7, 8: 80.8}
# A draft whose wide steps cost about what one does (memory-bound, as on a GPU).
DRAFT_WIDE_FLAT = {4: 13.5, 8: 14.5}


def _batch_from_plain(curve, joint: bool, prompt=194, answer=128, draft_wide=DRAFT_WIDE_FLAT):
    """4 sequences at the model's prior acceptance, each just begun on a prompt the
    draft has not seen, planning in turn three times; the lengths of the last turn."""
    costs = Costs()
    costs.warm_start([curve[n] for n in range(1, 10)], 12.7, 12.9 / 4, 12.9,
                     wide={n: curve[n] for n in (12, 16, 24, 32)})
    with_draft_widths(costs, draft_wide)
    costs.overhead[False].value, costs.overhead[True].value = 2.0, 5.0  # own work of a plain / drafting round
    parent = AdaptiveController(k_max=8, costs=costs)
    sequences = [parent] + [parent.fork() for _ in range(3)]
    for s in sequences:
        s.begin(list(range(prompt)), answer)
        if not joint:  # the negative control: coordinate ascent alone
            best_length = s._best_length
            s._best_length = lambda *a, alike=False, f=best_length: (0, 0.0, 1.0) if alike else f(*a)
    lengths = []
    for _ in range(3):
        lengths = [s.plan(Offer({MODEL: 8}, prompt)).length for s in sequences]
    return lengths


def test_a_batch_of_plain_steps_starts_drafting_together_where_that_pays_the_batch():
    """On the BF16 curve, with a draft whose steps for 4 sequences cost about one
    step, one sequence drafting beside three plain ones pays its draft steps alone and
    loses a little, so coordinate ascent stays plain; with all four drafting the batch
    makes more tokens per second, and the joint move finds it."""
    assert _batch_from_plain(BF16_EPYC, joint=False) == [0, 0, 0, 0]
    together = _batch_from_plain(BF16_EPYC, joint=True)
    assert all(m > 0 for m in together), together


def test_drafting_together_is_priced_at_the_draft_steps_measured_width():
    """The same batch with the draft's steps as measured on the CPU (4 sequences' step
    3.8x one: a Q4_0 draft is compute-bound there): drafting together costs about what
    it gains (at the prior acceptance, 3% more tokens a second for one draft each), so
    after one sequence drafts one token the others gain more by stepping plain beside
    it. Priced at one step, as before widths were measured, every sequence drafted
    (the BF16 run's 4-request draft calls then cost 52-59 ms)."""
    assert sum(_batch_from_plain(BF16_EPYC, joint=True, draft_wide=DRAFT_WIDE_EPYC)) <= 1
    one_step = {4: 12.7, 8: 12.7}
    assert all(m > 0 for m in _batch_from_plain(BF16_EPYC, joint=True, draft_wide=one_step))


def test_the_joint_move_leaves_a_target_whose_calls_cost_by_their_tokens_plain():
    assert _batch_from_plain(Q4_WIDE, joint=True) == [0, 0, 0, 0]


def test_a_batchs_draft_steps_are_learnt_by_their_width():
    """A draft call that other sequences' drafts shared is timed for its width, apart
    from the 1-token step; widths not seen are interpolated between those that were,
    and beyond the widest go on at the slope of the widest two."""
    costs = Costs()
    costs.draft_step.value, costs.draft_first.value, costs.draft_token.value = 10.0, 12.0, 2.0
    assert costs.draft_call(4) == pytest.approx(10.0 + 3 * 2.0)  # nothing seen: the catch-up price per token
    calls = [DraftCall(2, 50.0, 8), DraftCall(1, 40.0, 4), DraftCall(1, 40.0, 4)]
    costs.observe_round(RoundReport([MODEL] * 3, [0.9] * 3, 3, 16, 300.0, calls, 500.0, (1, 2, 3, 4)))
    assert costs.draft_step.value == 10.0 and costs.draft_first.value == 12.0  # a lone step's price is kept
    assert costs.draft_call(4) == 40.0 and costs.draft_call(8) == 50.0
    assert costs.draft_call(2) == pytest.approx(10.0 + 30.0 / 3)
    assert costs.draft_call(6) == pytest.approx(45.0)
    assert costs.draft_call(12) == pytest.approx(50.0 + 4 * 2.5)
    # A round of 3 steps beside 3 others drafting 2: calls 4, 4 and 1 wide, the first cold.
    widths = Posted(6, 5.0, 2, 3).step_widths(3)
    assert widths == [4, 4, 1]
    assert costs.drafting_widths(widths) == pytest.approx(12.0 + 30.0 + 40.0 + 10.0)
    # Alone, the price is what it always was.
    assert costs.drafting_widths([1, 1, 1]) == costs.drafting(3) == 12.0 + 2 * 10.0

"""The planner (control.py) on its own: what it plans from given prices and
acceptance, how its prices follow the calls of the run, the goodput guard, the
catch-up of a draft that has not read a long prompt, and plain steps that cost what
plain decoding's do."""

import pytest

from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.plans import MODEL, ModelCall, Offer, Plan, lookup_source
from specsample.decoding.sampling import Sampler, SamplingConfig
from specsample.policy.control import PLAIN, Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Goodput, Prices

from toy import CostedBackend, FakeClock, TrigramBackend, random_table

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0)
TABLE = random_table(8, seed=3)


def prices(target, draft=0.1):
    """Target calls costing target(n), draft calls 0.1 + 0.01 per extra token."""
    return Prices(Curve({n: target(n) for n in (1, 2, 3, 4, 5, 8, 16, 32)}), Curve({1: draft, 16: draft + 0.15}))


def flat(n):  # memory-bound: a call of a few more tokens costs little more
    return 1.0 + 0.02 * (n - 1)


def linear(n):  # compute-bound: every token costs as much as the first
    return 1.0 * n


def solo(planner, lag=1, available=6, tokens=200):
    seat = planner.seat()
    seat.begin([1] * 10, tokens)
    return seat, seat.plan(Offer({MODEL: available}, lag))


def test_one_sequence_drafts_where_calls_cost_the_same_and_steps_plain_where_they_cost_by_the_token():
    _, drafting = solo(Planner(6, prices(flat)))
    assert drafting.source == MODEL and drafting.length >= 3 and drafting.extent is not None
    _, plain = solo(Planner(6, prices(linear)))
    assert plain.source is None and plain.length == 0 and plain.catch_up == 0


def test_a_lookup_is_chosen_over_the_model_when_its_acceptance_is_higher():
    planner = Planner(6, prices(flat, draft=0.3))
    seat = planner.seat()
    seat.begin([1] * 10, 200)
    source = lookup_source(3)
    for _ in range(30):  # a lookup that has always been right
        seat.acceptance.held(source).held_at(0).update(True, 0.9)
        seat.acceptance.held(source).held_at(1).update(True, 0.9)
    plan = seat.plan(Offer({MODEL: 6, source: 5}, 1))
    assert plan.source == source and plan.length == 5


def test_prices_follow_the_calls_of_the_run_within_a_few_calls():
    """A busy neighbour makes every draft call 8x dearer: within RECENT calls the
    planner prices them so and steps plain; once it leaves, drafting comes back."""
    planner = Planner(6, prices(flat))
    seat, first = solo(planner)
    assert first.source == MODEL
    for _ in range(6):
        planner.record(ModelCall(False, 1, 1, 0.8))
        planner.record(ModelCall(False, 2, 1, 0.8))
    assert seat.plan(Offer({MODEL: 6}, 1)).source is None
    for _ in range(6):
        planner.record(ModelCall(False, 1, 1, 0.1))
        planner.record(ModelCall(False, 2, 1, 0.1))
    assert seat.plan(Offer({MODEL: 6}, 1)).source == MODEL


def test_a_lone_spike_moves_a_price_a_little_and_a_lasting_slowdown_fully():
    curve = Curve({1: 1.0, 8: 2.0})
    for _ in range(8):
        curve.observe(1, 1.0)
    curve.observe(1, 30.0)  # descheduled once
    assert 1.0 < curve(1) <= 1.0 + 3.0 / 8 and curve(8) <= 2.0 * (1 + 3.0 / 8)
    for _ in range(8):
        curve.observe(1, 1.0)
    assert curve(1) == pytest.approx(1.0)
    for _ in range(6):  # a neighbour takes the cores: every call 3x
        curve.observe(1, 3.0)
    assert curve(1) > 2.4 and curve(8) > 4.8  # every size moves with the machine


def test_a_size_not_called_lately_is_priced_by_the_recent_calls_of_any_size():
    curve = Curve({1: 1.0, 8: 2.0})
    for _ in range(4):
        curve.observe(1, 1.0)
    for _ in range(20):  # only 8-token calls, at twice their prior
        curve.observe(8, 4.0)
    assert curve(1) == pytest.approx(2.0)


def test_without_a_calibration_each_size_is_learnt_from_its_first_call():
    curve = Curve()
    curve.observe(1, 0.5)
    curve.observe(4, 1.0)
    assert curve(1) == pytest.approx(0.5) and curve(4) == pytest.approx(1.0) and curve(2) == pytest.approx(2 / 3)


def test_a_wider_call_is_never_priced_below_a_narrower_one():
    """Calibration noise (5 tokens timed below 4) or two bands scaled apart (the 2-4
    band slowed by its own recent calls, the 5-8 band by every size's) would make a
    wider call look cheaper, and a planner then chose four drafts over three."""
    noisy = Curve({1: 1.0, 4: 3.0, 5: 2.9, 8: 4.0})
    assert noisy(4) == pytest.approx(3.0) and noisy(5) >= noisy(4)
    banded = Curve({1: 1.0, 4: 2.0, 5: 2.2, 8: 3.0})
    for _ in range(3):
        banded.observe(4, 4.0)  # the 2-4 band at twice its prior
    for _ in range(5):
        banded.observe(1, 1.0)
    assert banded(4) == pytest.approx(4.0) and banded(5) >= banded(4) and banded(6) >= banded(5)
    assert all(banded(n + 1) >= banded(n) for n in range(1, 40))


def test_a_drafting_rounds_own_work_is_priced_as_a_plain_ones_until_timed():
    """Plain rounds' own work is known (0.5 s) and no drafting round has been timed: a
    one-token lookup at its prior acceptance (0.6) then costs 2 + 0.5 s for 1.6 tokens,
    less than plain's 1 token in 1.5 s. Priced at no work it looked better than plain."""
    planner = Planner(6, prices(linear))
    planner.prices.work[False].update(0.5)
    seat = planner.seat()
    seat.begin([1] * 10, 200)
    assert seat.plan(Offer({lookup_source(3): 1})).source is None
    assert planner.prices.own(True) == pytest.approx(0.5)
    planner.prices.work[True].update(0.01)  # once timed, its own figure
    assert planner.prices.own(True) == pytest.approx(0.01)


EVIDENCE = 7  # rounds of each kind: enough for the guard to judge (PlannerConfig.evidence)


def test_the_goodput_guard_bars_drafting_where_it_realised_less_then_tries_again():
    guard = Goodput()
    for _ in range(EVIDENCE):
        guard.add(1, None, 1, 1.0)  # plain: 1 token/s
        guard.add(1, "model", 2, 3.0)  # drafting with the model: 0.67 token/s
    assert guard.barred(1, "model") and not guard.barred(1, "lookup") and not guard.barred(2, "model")
    rounds = 0
    while guard.barred(1, "model"):
        guard.add(1, None, 1, 1.0)
        rounds += 1
    assert 20 < rounds < 100  # tried again once its evidence is stale
    for _ in range(4):
        guard.add(1, "model", 3, 1.0)  # now drafting pays: no bar
    assert not guard.barred(1, "model")


def test_lookups_that_lose_do_not_bar_the_model():
    guard = Goodput()
    for _ in range(EVIDENCE + 1):
        guard.add(1, None, 1, 1.0)
        guard.add(1, "lookup", 1, 2.0)
        guard.add(1, "model", 3, 1.0)
    assert guard.barred(1, "lookup") and not guard.barred(1, "model")


def test_a_source_that_plays_one_round_in_twenty_and_loses_is_barred_then_tried_again():
    """Lookups on chat: a round now and then, each realising less than plain steps.
    Decayed with every round, their evidence never reached EVIDENCE and they were
    never barred; decayed with their own rounds, a dozen are enough."""
    guard = Goodput()
    played = 0
    while not guard.barred(1, "lookup") and played < 12:  # a barred source plays no rounds
        for _ in range(19):
            guard.add(1, None, 1, 1.0)
        guard.add(1, "lookup", 2, 3.0)  # 0.67 token/s against plain's 1
        played += 1
    assert guard.barred(1, "lookup") and not guard.barred(1, "model")
    rounds = 0
    while guard.barred(1, "lookup"):
        guard.add(1, None, 1, 1.0)
        rounds += 1
    assert rounds < 100  # a bar still ages with every round


def test_a_sparse_source_that_pays_is_not_barred():
    guard = Goodput()
    for _ in range(12):
        for _ in range(19):
            guard.add(1, None, 1, 1.0)
        guard.add(1, "lookup", 3, 1.5)  # 2 tokens/s
    assert not guard.barred(1, "lookup")


def test_where_drafting_is_all_a_size_plays_a_plain_round_is_asked_for_now_and_then():
    guard = Goodput()
    rounds = []
    for i in range(200):
        if guard.probe(1):
            rounds.append(i)
            guard.add(1, None, 1, 1.0)
        else:
            guard.add(1, "model", 3, 1.0)  # drafting pays: it is never barred
    assert not guard.barred(1, "model") and 2 <= len(rounds) <= 6 and rounds[0] == EVIDENCE


def test_a_barred_kind_is_left_out_of_the_plans():
    planner = Planner(6, prices(flat))
    for _ in range(EVIDENCE):
        planner.goodput.add(1, None, 1, 1.0)
        planner.goodput.add(1, "model", 1, 2.0)
    assert solo(planner)[1].source is None


def test_the_planner_records_round_windows_into_goodput_and_own_work():
    clock = FakeClock()
    planner = Planner(6, prices(flat), clock)
    for i in range(6):  # rounds of 1.2 s: a 1 s target call, 0.2 s of own work, 2 tokens each
        clock.now += 1.2
        planner.record(ModelCall(True, 1, 1, 1.0))
        planner.emitted(2)
    assert planner.prices.work[False].value == pytest.approx(0.2)
    assert planner.goodput._sums[1][None][0] > 0


def test_a_draft_behind_a_long_prompt_is_not_offered_and_catches_up_in_chunks_after_the_second_token():
    planner = Planner(6, prices(flat))
    seat, first = solo(planner, lag=4000, tokens=2000)
    assert first.source is None and first.catch_up == 0  # the second token is not held back
    seat.length.generated = 2
    later = seat.plan(Offer({MODEL: 6}, 4000))
    # The chunk is the largest the draft reads in about a plain round's call (target(1)
    # = 1 s here): 64 tokens cost 0.73 s, 128 would cost 1.37.
    costs = planner.prices
    assert costs.draft(64) <= costs.target(1) < costs.draft(128)
    assert later.source is None and later.catch_up == 64
    # An answer expected to end before the reading pays back: no catch-up at all.
    seat.length.begin(8)
    seat.length.generated = 2
    assert seat.plan(Offer({MODEL: 6}, 4000)).catch_up == 0


def test_a_draft_behind_its_prompt_reads_in_rounds_that_draft_from_a_lookup_too():
    """Seen on BF16 HumanEval (docs/results/auto-bf16-starved): a draft model that had not
    read its ~150-token prompt was held back (stalls), one-token lookups took most
    rounds, and only plain rounds fed it chunks, so it caught up near the answer's end:
    -k auto 1.02x plain decoding where K = 4 made 1.28x. A lookup round feeds it too."""
    planner = Planner(6, prices(flat))
    seat = planner.seat()
    seat.begin([1] * 10, 2000)
    seat.length.generated = 2
    source = lookup_source(1)  # a one-token match: it pays a little, the model (once it has read) more
    plan = seat.plan(Offer({MODEL: 6, source: 2}, 4000))
    assert plan.source == source and plan.length >= 1  # the lookup pays; the model cannot draft yet
    assert plan.catch_up == 64  # and the draft reads beside it, as in a plain round
    for _ in range(EVIDENCE):  # barred: no reading, lookup round or not
        planner.goodput.add(1, None, 1, 1.0)
        planner.goodput.add(1, "model", 1, 2.0)
    assert seat.plan(Offer({MODEL: 6, source: 2}, 4000)).catch_up == 0


def test_a_lookup_round_that_catches_up_reads_with_the_model_and_drafts_the_lookup():
    model = ModelDrafter(TrigramBackend(TABLE, name="draft"), GREEDY)
    drafter = HybridDrafter(model, NgramDrafter(max_ngram=2))
    context = [1, 2, 3, 4, 5, 6, 7, 2, 3]  # [2, 3] was followed by [4, 5]
    assert drafter.offer(context, 2).available[lookup_source(2)] == 2
    draft = drafter.draft(context, Plan(lookup_source(2), 2, 2, catch_up=4), Sampler(len(context)))
    assert draft.tokens.tolist() == [4, 5] and draft.sources == [lookup_source(2)] * 2
    assert [(c.tokens_fed, c.reads) for c in draft.calls] == [(4, True)]  # the model read 4 tokens, drafting none
    assert model.backend.length == 4
    plain = drafter.draft(context, Plan(None, 0, catch_up=3), Sampler(len(context)))  # a plain round's, as before
    assert len(plain) == 0 and [c.tokens_fed for c in plain.calls] == [3] and model.backend.length == 7


def test_a_barred_model_is_not_fed_the_text_it_has_not_read():
    """Seen in a trace on one core: with the model barred by the goodput guard, plain
    rounds went on reading chunks for a model that could not draft, and those rounds,
    counted as the model's, kept it barred: 0.3-0.6 s of reading a prompt, no draft."""
    planner = Planner(6, prices(flat))
    seat, _ = solo(planner, lag=4000, tokens=2000)
    seat.length.generated = 2
    assert seat.plan(Offer({MODEL: 6}, 4000)).catch_up >= 16  # free to draft, it reads
    for _ in range(EVIDENCE):
        planner.goodput.add(1, None, 1, 1.0)
        planner.goodput.add(1, "model", 1, 2.0)
    assert planner.goodput.barred(1, "model")
    assert seat.plan(Offer({MODEL: 6}, 4000)).catch_up == 0


def test_the_seats_of_a_planner_learn_how_long_answers_run_together():
    """A server's first answer in one slot tells the others how long answers run: a
    slot whose own first answer is still going expects what the finished one ran, not
    its budget; a capped answer says nothing, and an answer ended twice counts once."""
    first = Planner(6, prices(flat)).seat()
    second = first.fork()
    for seat in (first, second):
        seat.begin([1] * 10, 128)
    second.length.generated = 2
    assert second.length.expected_remaining() == 126  # nothing finished yet: the budget
    first.length.generated = 34
    first.end()
    first.end()
    assert second.length.expected_remaining() == 32
    first.begin([1] * 10, 128)  # begun after its end: the answer is not counted again
    assert first.length.typical.value == 34
    third = second.fork()
    third.begin([1] * 10, 16)
    third.length.generated = 16  # cut by its budget: says nothing
    third.end()
    assert third.length.typical.value == 34


def test_a_catch_up_that_pays_alone_is_not_made_where_it_holds_back_a_batch():
    # Reading 1,000 tokens pays back over 100 tokens for a sequence alone; beside three
    # that draft, the batch forgoes their tokens too while the draft reads, and it does not.
    def catch_up(n):
        planner = Planner(6, prices(flat))
        seats = [planner.seat() for _ in range(n)]
        for seat in seats:
            seat.begin([1] * 10, 100)
            seat.length.generated = 2
        plans = planner.plan({seat: Offer({MODEL: 6}, 1000 if i == 0 else 1) for i, seat in enumerate(seats)})
        assert all(plans[seat].source == MODEL for seat in seats[1:])
        return plans[seats[0]].catch_up
    assert catch_up(1) >= 16 and catch_up(4) == 0


def test_a_prompt_read_in_the_same_call_does_not_make_a_catch_up_look_cheap():
    # Small calls cost by the token (drafting never pays), a prompt's tokens little each.
    points = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0, 8: 8.0, 16: 10.0, 64: 14.0, 256: 26.0}
    planner = Planner(6, Prices(Curve(points), Curve({1: 0.1, 16: 0.25})))
    seat = planner.seat()
    seat.begin([1] * 10, 200)
    seat.length.generated = 2
    for load in (0, 200):  # beside another sequence's 200-token prompt, as alone
        plan = planner.plan({seat: Offer({MODEL: 6}, 1000)}, load)[seat]
        assert plan.source is None and plan.catch_up == 0


def test_a_round_in_which_the_draft_read_unread_text_is_left_out_of_the_goodput_guard():
    clock = FakeClock()
    planner = Planner(6, prices(flat), clock)
    planner.restart()  # a sequence starts: its first round's window opens now
    for catch_up in (True, False, False):
        clock.now += 1.0
        if catch_up:  # a plain round in which the draft read 64 tokens
            planner.record(ModelCall(False, 64, 1, 0.5, prompt=True))
        planner.record(ModelCall(True, 1, 1, 0.4))
        planner.emitted(1)
    planner.restart()  # the next sequence: the last round's tokens are not lost
    sums = planner.goodput._sums[1]
    assert sums["model"] == [0.0, 0.0, 0.0] and sums[None][2] == pytest.approx(2, rel=0.05)


def test_rounds_in_which_the_draft_reads_never_bar_the_model_however_slow():
    """The trace that showed it (BF16 HumanEval): the model's first rounds after each
    prompt carried the prompt's reading, about six plain steps, looked slower than plain
    steps and barred the model before it had drafted long enough to be judged; barred,
    it read no more: -k auto 1.02x plain decoding where K = 4 made 1.28x. Negative
    control: the same slow rounds without reading (drafting that loses) bar it."""
    def barred(reads: bool) -> bool:
        clock = FakeClock()
        planner = Planner(6, prices(flat), clock)
        planner.restart()
        for _ in range(3 * EVIDENCE):
            for model in (False, True):
                clock.now += 2.0 if model else 1.0  # a model round: 1 token in twice a plain step's time
                planner._window[2] = "model" if model else None
                if model:
                    planner.record(ModelCall(False, 64 if reads else 1, 1, 0.5, prompt=reads))
                planner.record(ModelCall(True, 2 if model else 1, 1, 0.4))
                planner.emitted(1)
        planner.restart()
        return planner.goodput.barred(1, "model")
    assert not barred(reads=True) and barred(reads=False)


def test_a_long_prompt_streams_plain_steps_while_the_draft_reads_it_in_chunks():
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(TABLE), clock, flat)
    draft = CostedBackend(TrigramBackend(TABLE, name="draft"), clock, lambda n: 0.05 + 0.005 * (n - 1))
    drafter = ModelDrafter(draft, GREEDY)
    drafter.clock = clock
    planner = Planner(6, prices(flat, draft=0.05), clock)
    prompt = [i % 8 for i in range(3000)]
    s = stream(target, prompt, GenerationConfig(max_new_tokens=400, sampling=GREEDY), drafter, planner.seat(), clock)
    chunks = iter(s)
    next(chunks)  # the first token: the prompt's last row
    draft_calls = draft.calls
    next(chunks)  # the second: one plain target call, no draft call
    assert draft.calls == draft_calls
    for _ in chunks:
        pass
    stats = s.result.stats
    assert stats.plain_rounds > 0 and sum(stats.draft_length_histogram[1:]) > 0  # it caught up, then drafted
    plain = generate(TrigramBackend(TABLE), prompt, GenerationConfig(max_new_tokens=400, sampling=GREEDY))
    assert s.result.token_ids == plain.token_ids


def test_plain_steps_under_auto_make_the_calls_plain_decoding_makes():
    """Where drafting does not pay, -k auto's rounds are plain decoding's: one
    1-token target call each, no draft call."""
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(TABLE), clock, linear)
    draft = CostedBackend(TrigramBackend(TABLE, name="draft"), clock, lambda n: 0.3)
    drafter = ModelDrafter(draft, GREEDY)
    planner = Planner(6, prices(linear, draft=0.3), clock)
    result = generate(target, [1, 2, 3], GenerationConfig(max_new_tokens=30, sampling=GREEDY), drafter,
                      planner.seat(), clock)
    assert draft.calls == 0 and target.calls == 1 + 29  # the prefill, then one call per token
    assert result.stats.plain_rounds == 30


def _batch_plan(curve, n=4, available=4):
    planner = Planner(available, prices(curve, draft=0.1))
    seats = [planner.seat() for _ in range(n)]
    for seat in seats:
        seat.begin([1] * 10, 200)
    return planner.plan({seat: Offer({MODEL: available}, 1) for seat in seats})


def test_a_batch_where_a_call_costs_by_the_token_steps_plain_together():
    plans = _batch_plan(linear)
    assert all(p.source is None for p in plans.values())


def test_a_batch_on_a_memory_bound_target_drafts_together():
    plans = _batch_plan(flat)
    assert all(p.source == MODEL and p.length >= 1 for p in plans.values())


def test_a_batch_plans_with_the_prompts_in_its_call():
    """Four sequences beside a 128-token prompt chunk on a compute-bound curve: the
    chunk's cost is the same whatever they draft, and what each draft adds is priced
    at the call's size."""
    planner = Planner(4, prices(lambda n: 1.0 + 0.1 * n))
    seats = [planner.seat() for _ in range(2)]
    for seat in seats:
        seat.begin([1] * 10, 200)
    plans = planner.plan({seat: Offer({MODEL: 4}, 1) for seat in seats}, load=128)
    assert set(plans) == set(seats)


def test_beside_a_prompt_a_batch_drafts_only_what_pays_at_its_own_rate():
    """Beside a 300-token prompt the call is slow whatever the batch drafts: a draft
    adds a tenth of a second to a 14-second round, which its own rate would call nearly
    free; but those seconds are the batch's, worth 16 tokens each on this curve without
    a prompt, and a draft that does not pay there does not pay beside a prompt either
    (on a memory-bound curve, where drafting pays, it drafts beside one too)."""
    def bound(n):  # 4 sequences' steps cost about one; past 8 tokens each costs 47 ms
        points = {1: 0.2, 2: 0.2, 4: 0.25, 5: 0.3, 8: 0.45, 16: 0.8, 64: 3.0, 256: 12.0, 512: 24.0}
        return Curve(points)(n)

    def plans(curve, load):
        planner = Planner(4, prices(curve, draft=0.1))
        seats = [planner.seat() for _ in range(4)]
        for seat in seats:
            seat.begin([1] * 10, 200)
        return planner.plan({seat: Offer({MODEL: 4}, 1) for seat in seats}, load).values()

    assert all(p.source is None for p in plans(bound, 0))
    assert all(p.source is None for p in plans(bound, 300))
    assert all(p.source == MODEL for p in plans(flat, 300))


def test_the_plain_option_is_first_in_every_menu():
    planner = Planner(4, prices(flat))
    seat = planner.seat()
    seat.begin([1], 10)
    assert seat.menu(Offer({MODEL: 4}, 1))[0] == PLAIN
    assert seat.menu(Offer({MODEL: 4}, 1), barred={"model"}) == [PLAIN]


def test_the_first_round_is_a_plain_step_so_the_first_token_waits_for_no_draft_or_call():
    """The prefill's last row is the first token's distribution: under -k auto the first
    chunk streams before the draft model drafts or the target is called again, however
    well drafting would pay (issue 51), and later rounds draft. Greedy output equals
    plain greedy."""
    table = random_table(8, seed=3)
    target, draft = Counting(table), Counting(table + 0.1 * random_table(8, seed=4))
    prices = Prices(target=Curve({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}), draft=Curve({1: 0.01, 8: 0.08}))
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=0))
    s = stream(target, [1, 2, 3], config, ModelDrafter(draft, config.sampling), Planner(4, prices).seat())
    chunks = iter(s)
    first = next(chunks)
    assert len(first.token_ids) == 1
    assert target.calls == 1 and draft.calls == 0  # the prefill alone
    rest = [t for chunk in chunks for t in chunk.token_ids]
    assert draft.calls > 0 and s.result.stats.drafted > 0  # later rounds draft
    assert first.token_ids + rest == generate(TrigramBackend(table), [1, 2, 3], config).token_ids


class Counting(TrigramBackend):
    def __init__(self, table):
        super().__init__(table)
        self.calls = 0

    def score(self, token_ids, num_logits):
        self.calls += 1
        return super().score(token_ids, num_logits)

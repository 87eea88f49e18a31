"""Planner.plan is a function of the planner's state and the offers (issue 52): asked
twice, or on a deep copy, it gives the same plans and leaves every estimate as it was;
only decide(), which takes the plans as the round's, and the round's calls and reports
change the state. The negative control is the planner as it was before: a plan() that
decides (sources left out decay, the round's kind is noted), which the check catches."""

import copy
import random

import pytest

from specsample.decoding.plans import MODEL, DraftCall, ModelCall, Offer, RoundReport, lookup_source
from specsample.policy.control import Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Prices

from toy import FakeClock

pytestmark = pytest.mark.pure

# Memos of a pure function of the rest of a Curve (cleared whenever it observes a call):
# filling them is not a change of state.
MEMOS = {"_prices", "_raws"}


def state(value, seen=None):
    """Everything `value` holds, recursively, as plain values that compare equal
    exactly when the estimates are equal."""
    seen = set() if seen is None else seen
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in seen:
        return "<seen>"
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return [(state(k, seen), state(v, seen)) for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ == "deque":
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [type(value).__name__] + [state(v, seen) for v in items]
    if hasattr(value, "__dict__") and not callable(getattr(value, "__func__", None)):
        fields = {k: v for k, v in vars(value).items() if k not in MEMOS and k != "clock"}
        return [type(value).__name__, state(fields, seen)]
    return repr(value)


def describe(plans: dict) -> list:
    """A plan as what it tells a round: source, lengths, catch-up, and its extent's
    answers at a few confidences (each asked of a fresh plan: an extent keeps its reach)."""
    return [(str(p.source), p.length, p.limit, p.catch_up) for p in plans.values()]


def extents(plans: dict) -> list:
    return [[p.extent_at(i, c) for i in range(p.length) for c in (0.1, 0.5, 0.95)] for p in plans.values()]


def history(planner_type=Planner, seats=3, rounds=30, seed=0):
    """A planner with a past: seats that drafted from the model and a lookup and were
    told how it went, calls recorded, goodput evidence gathered; and the next offers."""
    rng, clock = random.Random(seed), FakeClock()
    lookup = lookup_source(2)
    prices = Prices(Curve({n: 0.05 * (1 + 0.1 * (n - 1)) for n in (1, 2, 4, 8, 16, 32)}),
                    Curve({1: 0.01, 16: 0.03, 128: 0.2}))
    planner = planner_type(6, prices, clock)
    first = planner.seat()
    table = [first] + [first.fork() for _ in range(seats - 1)]
    for seat in table:
        seat.begin([1] * 10, 200)

    def offers():
        return {seat: Offer({MODEL: rng.randint(2, 6), lookup: rng.randint(1, 4)}, rng.choice([1, 1, 300]),
                            ((lookup, (1, 2, 3)),)) for seat in table}

    for _ in range(rounds):
        plans = planner.decide(offers(), rng.choice([0, 64]))
        for seat, plan in plans.items():
            clock.now += 0.01 * plan.length
            planner.record(ModelCall(False, plan.length, 1, 0.01 * plan.length))
        clock.now += 0.1
        planner.record(ModelCall(True, sum(p.length + 1 for p in plans.values()), len(plans), 0.09), clock.now)
        for seat, plan in plans.items():
            accepted = rng.randint(0, plan.length)
            emitted = tuple(range(accepted + 1))
            confidences = [rng.random() if plan.source == MODEL else None for _ in range(plan.length)]
            seat.learn(RoundReport([plan.source] * plan.length, confidences, accepted, emitted,
                                   [[0.25] * 4 for _ in emitted], plan.length + 1, 0.09,
                                   [DraftCall(1, 0.01)] * plan.length, 0.1))
    return planner, table, offers()


def changes_nothing(planner, seats, offers, load=0) -> bool:
    """Whether plan() leaves the planner and its seats as they were, and gives the
    same plans asked twice and on a deep copy of them."""
    before = state((planner, seats))
    twin, twin_seats = copy.deepcopy((planner, seats))
    first = planner.plan(offers, load)
    second = planner.plan(offers, load)
    copied = twin.plan({twin_seats[seats.index(seat)]: offer for seat, offer in offers.items()}, load)
    same_plans = describe(first) == describe(second) == describe(copied)
    same_plans = same_plans and extents(first) == extents(second) == extents(copied)
    return same_plans and state((planner, seats)) == before


@pytest.mark.parametrize("seed", range(4))
def test_plan_changes_nothing_and_gives_the_same_plans_twice_and_on_a_copy(seed):
    planner, seats, offers = history(seed=seed)
    assert changes_nothing(planner, seats, offers)
    assert changes_nothing(planner, seats, offers, load=64)
    unseen = {seat: Offer({MODEL: 6, lookup_source(3): 4}, 1) for seat in seats}  # read at its priors, kept nowhere
    assert changes_nothing(planner, seats, unseen)
    alone = planner.seat()
    alone.begin([1] * 10, 50)
    assert changes_nothing(planner, [alone], {alone: Offer({MODEL: 6}, 3000)})  # a long unread text: catch-up


def test_decide_plays_what_plan_planned_and_then_the_state_moves():
    planner, seats, offers = history(seed=5)
    planned = planner.plan(offers)
    before = state((planner, seats))
    decided = planner.decide(offers)
    assert describe(decided) == describe(planned) and extents(decided) == extents(planned)
    assert state((planner, seats)) != before  # sources sat out decayed: the check sees a change


class Stateful(Planner):
    """Wrong, as plan() was before issue 52: planning also takes the plans as the round's."""

    def plan(self, offers, load=0):
        return self.decide(offers, load)


def test_negative_control_a_plan_that_changes_state_fails_the_check():
    planner, seats, offers = history(Stateful, seed=0)
    assert not changes_nothing(planner, seats, offers)

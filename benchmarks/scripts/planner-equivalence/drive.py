"""Drive the planner with random prices, offers and reports and print every decision,
one line each: run it on two commits and diff the outputs to show that a change
meant to keep the plans (issue 52: moving the numbers into policy/config.py) keeps
them. It uses only what both sides have (Planner, its seats, Prices, Curve, the
plans' types), never a monkeypatch.

    PYTHONPATH=src python benchmarks/scripts/planner-equivalence/drive.py > after.txt
    (the same on the other commit's tree) > before.txt; diff before.txt after.txt
"""

import random
import sys

from specsample.decoding.plans import MODEL, DraftCall, ModelCall, Offer, RoundReport, lookup_source
from specsample.policy.control import Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Prices


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def random_prices(rng: random.Random, k_max: int) -> Prices:
    if rng.random() < 0.2:
        return Prices()  # no calibration: the curves learn from the calls
    slope = rng.choice([0.01, 0.1, 0.5, 1.0])
    target = {n: 0.05 * (1 + slope * (n - 1)) * rng.uniform(0.9, 1.1) for n in range(1, 2 * (k_max + 1) + 1)}
    step = rng.uniform(0.002, 0.03)
    draft = {1: step, 16: step + 15 * step * rng.uniform(0.05, 0.5), 128: step * rng.uniform(5, 40)}
    return Prices(Curve(target), Curve(draft))


def offer(rng: random.Random) -> Offer:
    available = {}
    if rng.random() < 0.8:
        available[MODEL] = rng.randint(1, 10)
    lookups = ()  # Offer.lookups: the lookups found, one a kind (a tuple of them since the suffix index, d8af68f)
    if rng.random() < 0.5:
        source = lookup_source(rng.randint(1, 3))
        available[source] = rng.randint(1, 6)
        lookups = ((source, tuple(rng.randrange(50) for _ in range(available[source]))),)
    lag = rng.choice([0, 1, 2, 3, 20, 300, 3000])
    return Offer(available, lag, lookups, free=rng.random() < 0.05)


def describe(plan, rng: random.Random) -> str:
    extent = ""
    if plan.extent is not None:
        extent = " extent " + ",".join(str(plan.extent_at(i, round(rng.random(), 3))) for i in range(plan.length))
    return f"{plan.source} m={plan.length} limit={plan.limit} catch_up={plan.catch_up}{extent}"


def report(rng: random.Random, plan, clock: Clock) -> RoundReport:
    m = plan.length
    accepted = rng.randint(0, m)
    sources = [plan.source] * m
    confidences = [round(rng.random(), 3) if plan.source == MODEL else None for _ in range(m)]
    emitted = tuple(rng.randrange(50) for _ in range(accepted + 1))
    probs = [[1 / 50] * 50 for _ in emitted]
    target_seconds = 0.05 * (1 + 0.1 * m) * rng.uniform(0.5, 3.0)
    drafts = [DraftCall(rng.choice([1, 1, 2, 16]), rng.uniform(0.002, 0.05), rng.random() < 0.1)
              for _ in range(m if plan.source == MODEL else 0)]
    if plan.catch_up:
        drafts.append(DraftCall(plan.catch_up, plan.catch_up * 0.002))
    own = rng.uniform(0.0005, 0.005)
    clock.now += target_seconds + sum(d.seconds for d in drafts if not d.hidden) + own
    return RoundReport(sources, confidences, accepted, emitted, probs, m + 1, target_seconds, drafts,
                       target_seconds + own)


def alone(rng: random.Random, case: int) -> None:
    clock, k_max = Clock(), rng.choice([2, 4, 8])
    planner = Planner(k_max, random_prices(rng, k_max), clock)
    seat = planner.seat()
    for sequence in range(3):
        seat.begin([1] * 10, rng.choice([16, 64, 256]))
        for r in range(rng.randint(5, 60)):
            o = offer(rng)
            plan = seat.plan(o)
            print(f"alone {case}.{sequence}.{r}: {describe(plan, rng)} ahead={seat.ahead(plan.length, plan.length + 1)}")
            seat.observe(report(rng, plan, clock))


def batch(rng: random.Random, case: int) -> None:
    clock, k_max = Clock(), rng.choice([4, 8])
    planner = Planner(k_max, random_prices(rng, k_max), clock)
    seats = [planner.seat()]
    seats += [seats[0].fork() for _ in range(rng.randint(1, 3))]
    for seat in seats:
        seat.begin([1] * 10, 128)
    planner.restart(clock.now)
    for r in range(40):
        offers = {seat: offer(rng) for seat in seats if rng.random() < 0.9}
        if not offers:
            continue
        load = rng.choice([0, 0, 0, 64])
        # The plans a round plays: since issue 52's pure plan(), decide() takes them as the round's.
        plans = (planner.decide if hasattr(planner, "decide") else planner.plan)(offers, load)
        for i, (seat, plan) in enumerate(plans.items()):
            print(f"batch {case}.{r}.{i}: {describe(plan, rng)}")
        tokens = load + sum(p.length + 1 for p in plans.values())
        steps = max((p.length for p in plans.values() if p.source == MODEL), default=0)
        for j in range(steps):
            seconds = rng.uniform(0.002, 0.03)
            clock.now += seconds
            planner.record(ModelCall(False, sum(p.length > j for p in plans.values()), len(plans), seconds))
        seconds = 0.05 * (1 + 0.05 * tokens) * rng.uniform(0.7, 2.0)
        clock.now += seconds + rng.uniform(0.0005, 0.005)
        planner.record(ModelCall(True, tokens, len(plans) + (load > 0), seconds, prompt=load > 0), clock.now)
        for seat, plan in plans.items():
            rep = report(rng, plan, Clock())
            seat.acceptance.observe(rep)
            seat.length.generated += len(rep.emitted_tokens)
            planner.emitted(len(rep.emitted_tokens))


def main(cases: int = 200) -> None:
    for case in range(cases):
        rng = random.Random(case)
        (alone if case % 2 == 0 else batch)(rng, case)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)

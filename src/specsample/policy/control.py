"""How many tokens to draft next under -k auto: one planner for every sequence that
shares the target's calls (a batch of one is the single stream). A fixed K is
plans.FixedK.

A round drafts from one source (the draft model, an n-gram lookup of a given match
length), m tokens of it, m = 0 being a plain target step. Each sequence's policy is
a `Seat` of one `Planner`. A seat offers what its drafter could draft; the
scheduler (batching.py) collects the offers of every sequence about to play a round
and the planner decides them together, maximising the batch's expected tokens per
second of wall time: sum_s E_s / T, where a sequence drafting m tokens at
per-position acceptance a_1, a_2, ... (each conditional on the previous ones being
accepted) expects E = 1 + a_1 + a_1 a_2 + ... tokens, and T prices the whole round:

    T = target(tokens of every sequence, and any prompt in the call)
        + sum over draft steps j of draft(sequences drafting at step j)
        + each sequence's own work between calls (plain or drafting)
        + the share of the draft's reading of unread text that this round carries

A round whose call also reads a prompt (`load`) is slow whatever the batch drafts, so
its own rate would price any draft as nearly free; its seconds are valued instead at
R*, the rate of the batch's best round without the prompt, and the round plays the
options of the most E - R* T (Planner._search).

The prices are curves over a call's size (estimates.Prices): the start-up
calibration is their prior, and every call of the run moves them (Planner.record,
once per call: by the scheduler in a batch; alone, a batch of one, the seat records
the calls its round reports), so a busy neighbour or a slower clock is priced within
a few calls. The search is coordinate ascent over the
sequences' options from all-plain, and, with several sequences, also from "every
sequence drafts L" (a joint move no single sequence would make alone, since it
would pay the draft's steps by itself). A realised-goodput guard (estimates.Goodput)
bars drafting at a batch size where rounds with drafts realised fewer tokens per
second than rounds without, and lets it be tried again once that evidence is stale.

Inside a round the length is revised at each drafted position from the draft's
confidence there (`ConfidenceExtent`), with E - R* T, R* the rate the plan promised, the sunk
cost of drafts already made left out.

A round whose first token a row already held predicts (Offer.free: a sequence's first
round, after the prefill's last row) is a plain step: it costs no call, and a round
that drafted would keep the user waiting for its drafts, a verify call and any reading
of the prompt by the draft (issue 51: 0.2-0.3 s before the first token of a short
prompt).

A draft model that has not read a long text (a prompt of thousands of tokens) does
not hold the stream back: while reading its unread text would cost more than `stall`
plain steps it is not offered, plain steps (or drafts from a lookup) stream, and where
drafting is expected to pay back the reading before the answer is likely to end, each
round that drafts nothing from the model feeds it a chunk that costs about one plain
round (never before the second token, nor while the goodput guard bars the model).

Every plan, call and report can be followed round by round: a trace.Trace on the
planner (`--trace FILE`) writes each round as a line of JSON. Every number it decides
with is in config.py: a field of PlannerConfig, derived from one, or a constant, each
with why it is what it is.

Why the output is exactly the target's
--------------------------------------
Every decision above is a function of the past only: tokens already emitted, earlier
rounds' drafts, verdicts and timings (all of which decide the planner's state, and
the other sequences' offers, which follow from their own pasts), and the draft
distribution q_i, which the draft model computes from the prefix before anything is
drawn at position i. Condition on all of it. Then either position i is drafted,
x_i ~ q_i is proposed and verified (accepted with min(1, p_i/q_i), else a token is
drawn from norm(max(0, p_i - q_i))), which emits a token distributed exactly as p_i;
or it is not drafted, and the target samples position i from p_i itself (the bonus
or the next round's token). Either way token i follows p_i given everything before
it, so the joint distribution of the output is the target's, whatever the planner
decides. Two ways to break this, both tested as negative controls: looking at the
drawn token x_i before deciding to propose it, or at the verdict of the current
round (tests/test_distribution.py, tests/test_batching.py).
"""

from __future__ import annotations

import copy
import time
from typing import NamedTuple

from .config import ASCENT_PASSES, JOINT_LENGTHS, PLANNER, PlannerConfig, catch_up_chunks
from .curve import round_seconds
from .estimates import Acceptance, AnswerLength, Goodput, Prices, ShadowLookup, SourceModel, kind_of
from ..decoding.plans import MODEL, ModelCall, Offer, Plan, RoundReport, Seated, Source, reads_text


class Option(NamedTuple):
    """One way a sequence could play the coming round."""

    source: Source | None
    m: int  # drafts (0: a plain step)
    expected: float  # tokens it expects to emit
    steps: int  # draft-model steps it takes
    extra: float  # seconds of reading unread text charged to this round


PLAIN = Option(None, 0, 1.0, 0, 0.0)


class Planner:
    """The draft-length decisions of every sequence that shares the target's calls,
    made together (module docstring), from the prices and goodput it keeps for the
    machine. `seat()` makes the policy of one sequence. `config`: its numbers; `k_max`
    overrides the config's (--k-max)."""

    def __init__(self, k_max: int | None = None, prices: Prices | None = None, clock=time.perf_counter, trace=None,
                 config: PlannerConfig = PLANNER):
        k_max = config.k_max if k_max is None else k_max
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.clock, self._closed, self._tokens = k_max, clock, None, 0
        self.config, self.chunks = config, catch_up_chunks()
        self.prices, self.goodput = prices or Prices.empty(config), Goodput(config)
        self.trace = trace  # a trace.Trace that hears every plan, call and report; None: no work at all
        self._window = [None, 0.0, None, False, False]  # no round window before the first call or start

    def seat(self) -> Seat:
        return Seat(self)

    def plan(self, offers: dict[Seat, Offer], load: int = 0) -> dict[Seat, Plan]:
        """Every offering seat's plan for the coming round; `load`: tokens of other
        sequences (prompts being read) in the same target call. A function of the
        planner's state and the offers: it changes nothing, so it may be asked again
        or on a copy (decide() takes its plans as the round's)."""
        return self._choose(offers, load)[-1]

    def decide(self, offers: dict[Seat, Offer], load: int = 0) -> dict[Seat, Plan]:
        """plan(), taken as the coming round's plans: the round's window notes what it
        drafts from (for the goodput guard: the model's if any sequence drafts from
        it), each seat's sources left out drift back to their priors, and the trace
        hears why. Whoever plays the round calls it: the scheduler, or a seat alone."""
        barred, menus, chosen, plans = self._choose(offers, load)
        self._window[2] = max((kind_of(o.source) for o in chosen if o.m), key=lambda k: k == "model", default=None)
        for seat, plan in plans.items():
            seat.acceptance.sat_out(plan.source)
        if self.trace is not None:
            self.trace.planned(self, offers, load, barred, menus, chosen, plans)
        return plans

    def _choose(self, offers: dict[Seat, Offer], load: int) -> tuple[set, list[list[Option]], list[Option], dict]:
        """What plan() decides, and from what: the goodput kinds barred, each seat's
        menu, the options chosen, and the plans."""
        seats, guard = list(offers), self.goodput
        size, drafting = len(seats) + (load > 0), guard.KINDS[1:]
        barred = set(drafting) if guard.probe(size) else {kind for kind in drafting if guard.barred(size, kind)}
        menus = [seat.menu(offers[seat], barred) for seat in seats]
        chosen, rate = self._search(menus, load)
        tokens = load + sum(o.m + 1 for o in chosen)
        widths = [sum(o.steps > j for o in chosen) for j in range(self.k_max)]  # sequences drafting at step j
        reads = "model" not in barred  # no reading for a model that may not draft: its rounds would keep it barred
        plans = {seat: seat.to_plan(option, offers[seat], rate, tokens - option.m - 1,
                                    [width - (option.steps > j) for j, width in enumerate(widths)],  # the others'
                                    self._catch_up(chosen, i, seat, offers[seat]) if reads else 0)
                 for i, (seat, option) in enumerate(zip(seats, chosen))}
        return barred, menus, chosen, plans

    def _catch_up(self, chosen: list[Option], i: int, seat: Seat, offer: Offer) -> int:
        """Tokens of unread text the draft reads for seat i this round, which drafts
        nothing from the model (a plain step, or a lookup's drafts): where that
        text is too long to read in a drafting round, and the batch's tokens gained once
        seat i drafts, over what it has left to emit, outweigh the batch's tokens forgone
        while the draft reads it all: a chunk, the largest that costs about what the
        round's target call does; else none. (Alone: where the time it saves exceeds the
        reading's.) Priced at the batch's rounds to come, without a prompt the target
        reads this round: beside a prompt, extra tokens in the call look nearly free and
        the batch's rate looks low, which made reading look cheap where it did not pay."""
        if chosen[i].steps or MODEL not in offer.available or seat.length.generated < self.config.catch_up_after \
                or not seat.stalls(offer):
            return 0
        call, now = self.prices.target(sum(o.m + 1 for o in chosen)), self._rate(chosen, 0)
        chunk = max([self.chunks[0]] + [c for c in self.chunks if self.prices.draft(c) <= call])
        best, then = max(((o, self._rate(chosen[:i] + [o] + chosen[i + 1:], 0))
                          for o in seat.menu(Offer({MODEL: offer.available[MODEL]}))), key=lambda found: found[1])
        rounds = (seat.length.expected_remaining() - offer.lag / chunk) / best.expected
        span = rounds * (sum(o.expected for o in chosen) - 1 + best.expected) / then  # seconds those rounds take
        return chunk if (then - now) * span > self.prices.draft(offer.lag) * now else 0

    def _rate(self, chosen: list[Option], load: int) -> float:
        """Expected tokens per second of a round in which the sequences play `chosen`."""
        return sum(o.expected for o in chosen) / max(self.seconds(chosen, load), 1e-9)

    def seconds(self, chosen: list[Option], load: int) -> float:
        """Expected seconds of that round (module docstring: T)."""
        prices = self.prices
        call = prices.target(load + sum(o.m + 1 for o in chosen))
        # The draft steps: with runs sorted longest first, k sequences step together for as many
        # steps as the k-th longest run exceeds the (k+1)-th; some may hide under a call (overlap).
        runs = sorted((o.steps for o in chosen if o.steps), reverse=True) + [0]
        drafting = sum((runs[k - 1] - runs[k]) * prices.draft(k) for k in range(1, len(runs)))
        own = sum(o.extra + prices.own(o.m > 0) for o in chosen)
        return round_seconds(call, drafting, prices.draft.hidden) + own

    def _search(self, menus: list[list[Option]], load: int) -> tuple[list[Option], float]:
        """The round's options, and the rate R* its time is worth (tokens a second).
        Without a prompt in the call: the options of the highest rate, R* that rate.
        Beside one, a round is slow whatever it drafts, and the rate of the round
        itself would make any drafts look nearly free (0.5 s of drafts and reading
        for 3 tokens beside a 14 s prompt call, where the batch makes 17 tokens a
        second: a 4-slot BF16 server lost 4.5 s of 47 so): its time is worth what the
        batch makes without a prompt, R* = that round's rate, and the round plays the
        options of the most tokens less R* times its seconds."""
        best, rate = self._best(menus, lambda chosen: self._rate(chosen, 0))
        if not load:
            return best, rate
        return self._best(menus, lambda chosen: sum(o.expected for o in chosen) - rate * self.seconds(chosen, load))[0], rate

    def _best(self, menus: list[list[Option]], worth) -> tuple[list[Option], float]:
        """The options of the highest `worth`, and that worth: a sequence alone, its best;
        else coordinate ascent from all-plain and from each joint length."""
        if len(menus) == 1:
            return max((([o], worth([o])) for o in menus[0]), key=lambda found: found[1])
        starts = [[menu[0] for menu in menus]] + [
            [max((o for o in menu if o.steps <= length), key=lambda o: o.steps) for menu in menus]
            for length in JOINT_LENGTHS]
        return max((self._ascend(menus, start, worth) for start in starts), key=lambda found: found[1])

    def _ascend(self, menus: list[list[Option]], choice: list[Option], worth) -> tuple[list[Option], float]:
        """Coordinate ascent from `choice`: each sequence's best option, the others held."""
        value = worth(choice)
        for _ in range(ASCENT_PASSES):
            before = value
            for i, menu in enumerate(menus):
                for option in menu:
                    trial = choice[:i] + [option] + choice[i + 1:]
                    if (trial_value := worth(trial)) > value + 1e-9 * abs(value):
                        choice, value = trial, trial_value
            if value == before:
                break
        return choice, value

    def record(self, call: ModelCall, ended: float | None = None) -> None:
        """One model call, recorded once by whoever made it. A target call closes the
        round window (from the previous target call's end to its own): the time in it
        that no call took is the sequences' own work, and the window's tokens (told by
        the seats' reports after it) go to the goodput guard, unless the target read a
        prompt or the draft read unread text in it (estimates.Goodput says why)."""
        (self.prices.target if call.target else self.prices.draft).observe(call.tokens, call.seconds, call.hidden)
        window = self._window
        window[1] += 0.0 if call.hidden else call.seconds  # a hidden call took none of the window's time
        window[3 if call.target else 4] |= call.prompt
        if not call.target:
            if self.trace is not None:
                self.trace.called(call)
            return
        ended = self.clock() if ended is None else ended
        if self.trace is not None:  # the round's seconds: from the last target call's end (or its start) to this one's
            self.trace.called(call, None if window[0] is None else ended - window[0])
        closed = None
        if window[0] is not None and not window[3]:
            seconds = ended - window[0]
            own = seconds - window[1]
            if 0 <= own < seconds:
                self.prices.work[window[2] is not None].update(own / call.sequences)
                if not window[4]:  # the draft read unread text: an outlay the planner priced, no goodput (estimates.Goodput)
                    closed = (call.sequences, window[2], seconds)
        self.restart(ended)
        self._closed = closed

    def record_round(self, report: RoundReport) -> None:
        """The calls of a round played alone, as its own clock timed them (in a
        scheduler, the scheduler records each shared call instead)."""
        for d in report.draft_calls:
            self.record(ModelCall(False, d.tokens_fed, 1, d.seconds, d.reads, d.hidden))
        if report.target_tokens:
            self.record(ModelCall(True, report.target_tokens, 1, report.target_seconds))

    def restart(self, now: float | None = None) -> None:
        """Hand the last closed window, with the tokens its round emitted, to the goodput
        guard, and open one `now` (by default: a sequence starts alone, its prompt
        read). A window: since the last target call, [its end, the seconds of calls in
        it, what the round it holds drafted from (estimates.kind_of), whether the target
        read a prompt, whether the draft read unread text]."""
        if self._closed is not None and self._tokens:
            self.goodput.add(*self._closed[:2], self._tokens, self._closed[2])
        self._window = [self.clock() if now is None else now, 0.0, None, False, False]
        self._closed, self._tokens = None, 0

    def emitted(self, tokens: int) -> None:
        self._tokens += tokens


class Seat(Seated):
    """One sequence's policy: its own acceptance, lookup and answer-length estimates,
    and a place at its planner, which decides its rounds with everyone else's. Played
    as it is, a stream is a batch of one; in a scheduler, batching.Scheduled plays it
    (plans.Seated)."""

    def __init__(self, planner: Planner):
        self.planner, self.k_max = planner, planner.k_max
        self.acceptance, self.length = Acceptance(planner.config), AnswerLength()
        self.shadow = ShadowLookup()

    def fork(self) -> Seat:
        """Another sequence's seat at the same planner, starting from what this one has
        learnt of acceptance (then its own: acceptance belongs to the text a sequence
        decodes), and sharing what every seat learns of answer lengths."""
        twin = Seat(self.planner)
        twin.acceptance = copy.deepcopy(self.acceptance)
        twin.length.typical = self.length.typical  # shared: how long answers run (estimates.AnswerLength)
        return twin

    def begin(self, context, max_new_tokens) -> None:
        self.start(max_new_tokens)
        self.planner.restart()  # alone, its first round's window opens now, after its prompt

    def start(self, max_new_tokens: int) -> None:
        self.length.begin(max_new_tokens)
        self.shadow.reset()
        if self.planner.trace is not None:
            self.planner.trace.begun(self)

    def end(self) -> None:
        self.length.end()

    def plan(self, offer: Offer) -> Plan:
        plan = self.offered(offer)
        return plan if plan is not None else self.planner.decide({self: offer})[self]

    def offered(self, offer: Offer) -> Plan | None:
        self.shadow.offered = offer.lookups
        if offer.free:  # a plain step that costs no call: no drafting round's rate comes near it
            return Plan(None, 0)
        return None

    def menu(self, offer: Offer, barred: set = frozenset()) -> list[Option]:
        """Its options this round: a plain step, then each source and length it offers
        whose goodput kind is not `barred`."""
        options, horizon = [PLAIN], self.length.expected_remaining()
        # Text the draft's next call would read beyond what a round feeds it (the pending
        # token, and after a full accept the last draft): the one rule of plans.reads_text.
        lag = self.reading(offer) if reads_text(offer.lag, 1, target=False) else 0.0
        for source, available in offer.available.items():
            model = source == MODEL
            if kind_of(source) in barred or model and self.stalls(offer):
                continue  # barred, or the draft reads that text in plain rounds first (Planner._catch_up)
            expected, reach = 1.0, 1.0
            for m in range(1, min(available, self.k_max) + 1):
                reach *= self.acceptance[source].at(m - 1).value
                expected += reach
                extra = lag * expected / max(expected, horizon) if model else 0.0
                options.append(Option(source, m, expected, m if model else 0, extra))
        return options

    def reading(self, offer: Offer) -> float:
        """Seconds the draft takes to read the text it has not read."""
        return self.planner.prices.draft(offer.lag + 1) - self.planner.prices.draft(1)

    def stalls(self, offer: Offer) -> bool:
        """Whether that reading would hold a drafting round back by more than `stall` plain steps."""
        return self.reading(offer) > self.planner.config.stall * self.planner.prices.target(1)

    def ahead(self, drafted: int, call_tokens: int) -> int:
        """As many drafts as the call's time holds (drafted meanwhile, they cost nothing
        beside it), within K, and no fewer than this round's. The next round's plan cuts
        the block to the length that pays; a block of this round's length would cap it
        there: a round of one draft chained blocks of one, a token a call."""
        prices = self.planner.prices
        fits = int(prices.target(call_tokens) / prices.draft(1)) if prices.draft(1) > 0 else drafted
        return max(drafted, min(self.k_max, fits))

    def to_plan(self, option: Option, offer: Offer, rate: float, others: int, widths: list[int], catch_up: int) -> Plan:
        if option.source is None:
            return Plan(None, 0, catch_up=catch_up)
        limit = min(offer.available[option.source], self.k_max)
        if option.source != MODEL:  # a lookup's drafts, and the draft model may read beside them
            return Plan(option.source, option.m, limit, catch_up=catch_up)
        extent = ConfidenceExtent(self.acceptance[option.source], self.planner.prices, rate, limit, others, widths)
        return Plan(option.source, option.m, limit, extent)

    def observe(self, report: RoundReport) -> None:
        self.planner.record_round(report)  # alone, the round's own clock timed its calls
        self.learn(report)

    def learn(self, report: RoundReport) -> None:
        self.acceptance.observe(report)
        self.shadow.observe(report, self.acceptance)
        self.length.generated += len(report.emitted_tokens)
        self.planner.emitted(len(report.emitted_tokens))
        if self.planner.trace is not None:
            self.planner.trace.reported(self, report)


class ConfidenceExtent:
    """A round's `extent` (plans.Extent, the rule any policy may hand a round) as the
    planner makes it: the length re-made at each drafted position from the draft's
    confidence there, maximising E - R* T with R* the rate the plan promised and the
    sunk cost of drafts already made left out; the other sequences' tokens and draft
    steps in the same calls as planned (`widths`: how many of them draft at each step)."""

    def __init__(self, model: SourceModel, prices: Prices, rate: float, limit: int, others: int, widths: list[int]):
        self.model, self.prices, self.rate, self.limit = model, prices, rate, limit
        self.others, self.widths, self.reach = others, widths, 1.0  # reach: chance that all drafts so far are accepted

    def __call__(self, i: int, confidence: float) -> int:
        here = self.model.given_confidence(confidence).value
        target, draft = self.prices.target, self.prices.draft
        best_m, best_value = i, -self.rate * target(self.others + i + 1)
        gain, chain, drafting = 0.0, self.reach, 0.0
        for m in range(i + 1, self.limit + 1):
            chain *= here if m == i + 1 else self.model.at(m - 1).value
            gain += chain
            if m > i + 1:  # the call that feeds draft m - 1 to draw draft m, beside the others drafting then
                drafting += draft(self.widths[m - 1] + 1) - draft(self.widths[m - 1])
            value = gain - self.rate * round_seconds(target(self.others + m + 1), drafting, draft.hidden)
            if value > best_value:
                best_m, best_value = m, value
        if best_m > i:
            self.reach *= here
        return best_m

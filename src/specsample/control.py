"""How many tokens to draft next: a fixed K, or an adaptive controller fed with
measured costs and each round's outcome.

A policy plans each round from what the drafter offers (plans.py): which source
drafts (model, n-gram lookup of a given match length) and how many tokens it is
planned to draft, 0 meaning a plain target step; and, for the draft model, a rule
(the plan's `extent`) it applies during drafting, once the draft distribution q_i at
position i is known and *before* x_i is drawn from it: how many drafts the round
should end with. x_i is drawn and proposed iff the answer is > i.

Why the adaptive policy keeps the output exactly the target's
-------------------------------------------------------------
Every decision above is a function of the past only: tokens already emitted, earlier
rounds' drafts, verdicts and timings (all of which decide the controller's state),
and the draft distribution q_i, which the draft model computes from the prefix
before anything is drawn at position i. Condition on all of it. Then either position
i is drafted, x_i ~ q_i is proposed and verified (accepted with min(1, p_i/q_i),
else a token is drawn from norm(max(0, p_i - q_i))), which emits a token
distributed exactly as p_i; or it is not drafted, and the target samples position
i from p_i itself (the bonus or the next round's token). Either way token i follows
p_i given everything before it, so the joint distribution of the output is the
target's, whatever the controller decides.

Two ways to break this, both tested as negative controls: looking at the drawn token
x_i (dropping x_i when q_i(x_i) is small makes the real proposal q_i restricted to
confident tokens, while verification still divides by q_i), or at the verdict of the
current round (leaving out a draft because it would be rejected turns the
recovered-token distribution into p_i instead of the residual).

The adaptive policy maximises expected tokens per second. A round drafting m tokens
with per-position acceptance a_1, a_2, ... (each conditional on the previous ones
being accepted) yields E(m) = 1 + a_1 + a_1 a_2 + ... tokens and costs
T(m) = draft_first + (m - 1) * draft_step + target_call(m + 1) + overhead (the first draft
call of a round runs cold, after the target's call); m = 0 is a plain target step.
Inside a round the sunk cost of drafts already made is irrelevant, so the choice is
re-made with E - R* T, R* being the best rate found at the start of the round.

Many sequences in one call
--------------------------
Sequences decoded together share each target call, and each has its own policy
(AdaptiveController.fork). The policies post their plans to a shared BatchLoad: tokens
added to the call (m + 1), tokens expected (E) and draft-model steps. A sequence then
maximises the batch's rate, (E(m) + E_others) / T, where T prices the whole call,
target_call(N_others + m + 1), the round's draft time, that of max(m, the others'
longest model run) draft calls, each as wide as the sequences drafting at that step
(Costs.draft_call: a batch's step is timed by its width), and every sequence's own work between calls (which runs on
one thread: the others' at the plain rounds' overhead) (SmartSpec's goodput). A round's
own work is its time less what it slept in the batch (RoundReport.waited_seconds):
priced with the others' draft calls in it, a plain round looked dearer than it was. Each plan is one step of coordinate
ascent on that objective: the others' plans held fixed, this sequence's source and
length chosen best. As the call fills, a draft's marginal cost is paid at the whole
batch's rate, so K falls, first for the sequences whose drafts are seldom accepted,
to 0. With no others it is the single-sequence objective above, to the bit.
Coordinate ascent finds a plan no single sequence can better alone, not always the
best joint one: sequences that already draft together each see the others' draft
steps and wide call as paid whatever they do, and stay in a herd. On the Q4_K_M
target under 4 clients that herd halved the server's rate: 4 sequences drafting 2
tokens each made calls of 12 tokens (643 ms) and draft steps for 10.5 tokens, where
4 plain steps make 4 in 172 ms; for each sequence alone, stepping out changed the
batch's rate by under 2%. So each plan is also held against the batch with every
sequence plain: when that rate is at least the best this sequence can reach given
the others, it steps plain, and as every sequence applies the same test the herd
breaks up. From there the ascent climbs again only to plans that beat all-plain,
so a batch is never planned below its plain steps' rate. Alone, the test is the
plain option itself and changes nothing.

The same trap holds the other way round. Where a call of a few more tokens costs
little (the BF16 target), drafting pays for the batch when every sequence drafts,
since the draft model's steps are batched too, but not for one sequence alone, which
pays those steps for itself: on this AMD EPYC's curve, beside three plain sequences
one drafting 1 or 2 tokens at the model's prior acceptance makes 29-30 tokens/s
against 30 plain, while all four drafting 2 make about 37, with the draft's step for
4 sequences priced at one sequence's. Coordinate ascent from
all-plain never leaves it, and under 4 clients the server took plain steps where
one sequence alone drafted at 2x. So each plan is also held against the batch with
every sequence drafting the model's best length at this sequence's acceptance:
where that is the best rate, it drafts that length, the others then find the draft
steps paid, and the batch is drafting from the next call on. Alone, there is no
such move. The move is only as good as the price of those wide draft steps: before
they were timed by width, it priced a step for 4 sequences at one sequence's (12.7 ms)
where it cost 52-59 ms (a Q4_0 draft is compute-bound on 2 cores), and on the
Q4_K_M target under 4 clients it drafted at a loss (HumanEval: 0.86 of plain
batching). Until a width has been timed it is priced from the catch-up cost per
token, which is optimistic: the move is tried, timed, and dropped where it loses.
The others' drafts must first read what they have not (each sequence posts its
draft's lag), and that catch-up is the move's cost too: priced as free, a sequence
whose draft had kept up planned the move beside three whose drafts were 150 tokens
behind, none followed, and its draft calls were paid alone (Q4_K_M, HumanEval
sampled, 4 clients: 0.71x plain batching).

All of this is a model of what a round will cost, and under load its sums fell short
of what drafting cost: on the BF16 target under 4 clients -k auto ran at 0.80-0.87 of
plain batching, every plan predicting a gain. So the load also keeps what the batch
realised (estimates.RealisedRates): tokens per second from one call to the next, by
batch size, in rounds with draft-model steps and in rounds without. Where drafting
realised less, it is barred for that batch size: every sequence's plan leaves the
draft model out (lookups still widen the call), and drafting is tried again in a
block of rounds once that evidence is stale (Nightjar's and AdaSpec's switch). A
batch of one is never barred: one client keeps the cost model's choices.

The load holds the others' plans, which follow from their own pasts and draft
distributions, never from this sequence's current draws or verdicts, and the rates
it realised, which follow from rounds already played: the argument above holds for
each sequence whatever shares its batch.

The estimates it decides from (acceptance rates, the cost model, answer lengths)
are in estimates.py; calibrate.py measures the costs where the models are put
together (make_policy) and caches them.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from .calibrate import cached_or_measured, wide_costs, wide_sizes
from .estimates import NOTHING_POSTED, Acceptance, AnswerLength, BatchLoad, Costs, Posted, ShadowLookup, SourceModel
from .plans import MODEL, NO_DRAFTS, Offer, Plan, Policy, RoundReport, Source


class FixedK:
    """Always K drafts (fewer when the budget or the lookup is shorter). A lookup match
    is preferred to the draft model: the hybrid drafter's fixed-K behaviour."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k_max = k

    def begin(self, context, max_new_tokens) -> None:
        pass

    def plan(self, offer: Offer) -> Plan:
        for source, available in sorted(offer.available.items(), key=lambda kv: kv[0] == MODEL):
            if available > 0:
                m = min(self.k_max, available)
                return Plan(source, m, limit=available)
        return NO_DRAFTS

    def observe(self, report) -> None:
        pass

    def end(self) -> None:
        pass

    def fork(self) -> FixedK:
        return FixedK(self.k_max)


class AdaptiveController:
    """Plans each round's source and draft length (0 ... k_max) to maximise expected
    tokens per second, of the whole batch where several sequences share each target
    call (`load`; fork() makes the policy of another sequence). One instance may serve
    many sequences in turn: its cost and acceptance estimates carry over (the
    per-sequence state is reset by `begin`)."""

    def __init__(self, k_max: int = 8, *, decay: float = 0.9, idle_decay: float = 0.998,
                 priors: dict[Source, tuple[float, float]] | None = None, costs: Costs | None = None,
                 load: BatchLoad | None = None):
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.acceptance = Acceptance(priors, decay, idle_decay)
        self.costs = costs or Costs()
        self.load = load if load is not None else BatchLoad()
        self.length = AnswerLength()
        self.shadow = ShadowLookup()

    @property
    def sources(self) -> dict[Source, SourceModel]:
        return self.acceptance.sources

    def fork(self) -> AdaptiveController:
        """The policy of another sequence decoded in the same batch.

        Shared: the cost model (one machine, and the calls the sequences share: every
        sequence's rounds refine it) and the load. Its own: the answer-length and shadow
        lookup state (they follow one sequence's text; the typical answer length learnt
        so far is copied in), and a copy of the acceptance estimates. Acceptance is a
        property of the text a sequence decodes, so shared rates would let one request's
        repeating code make another's chat draft long lookups; the copy starts the new
        sequence from what was learnt so far instead of from the priors."""
        twin = AdaptiveController(self.k_max, costs=self.costs, load=self.load)
        twin.acceptance = copy.deepcopy(self.acceptance)
        twin.length.typical.value = self.length.typical.value
        return twin

    def begin(self, context, max_new_tokens) -> None:
        self.length.begin(max_new_tokens)
        self.shadow.reset()
        # The least a sequence adds: its pending token; and its draft has read nothing of it yet.
        self.load.post(self, 1, 1.0, lag=len(context))

    def plan(self, offer: Offer) -> Plan:
        self.shadow.offered = offer.lookup
        others = self.load.others(self)
        plain = (1.0 + others.expected) / self._seconds(0, None, 0, others=others)
        best = (None, 0, plain, 1.0)  # a plain target step
        n = len(self.load)
        barred = n > 1 and self.load.realised.barred(n)  # drafting realised less than plain steps
        offered = {s: a for s, a in offer.available.items() if not (barred and s == MODEL)}
        for source, available in offered.items():
            m, rate, expected = self._best_length(self.acceptance[source], source, min(available, self.k_max),
                                                  offer.lag, others)
            if m > 0 and rate > best[2]:
                best = (source, m, rate, expected)
        if MODEL in offered and n > 1:  # the way into drafting together
            m, rate, expected = self._best_length(self.acceptance[MODEL], MODEL, min(offered[MODEL], self.k_max),
                                                  offer.lag, others, alike=True)
            if m > 0 and rate > best[2]:
                best = (MODEL, m, rate, expected)
        if best[0] is not None and n > 1 and self._all_plain(others) >= best[2]:
            best = (None, 0, plain, 1.0)
        source, m, rate, expected = best
        self.acceptance.sat_out(source)
        self.load.post(self, m + 1, expected, m if source == MODEL else 0, 0 if source == MODEL else offer.lag)
        if source is None:
            return NO_DRAFTS
        limit = min(offer.available[source], self.k_max)
        rule = ConfidenceRule(self.acceptance[source], self.costs, rate, limit, self.load, self)
        return Plan(source, m, limit, rule)

    def _best_length(self, model: SourceModel, source: Source, available: int, lag: int,
                     others: Posted, alike: bool = False) -> tuple[int, float, float]:
        """(length, batch rate, this sequence's expected tokens) of the best round drafting
        from source; `alike`: with every other sequence of the batch drafting the same
        length at this one's acceptance (the module docstring's joint move)."""
        best_m, best_rate, best_expected, expected, reach = 0, 0.0, 1.0, 1.0, 1.0
        n = len(self.load)
        if alike:  # the others' drafts first read what they have not: their catch-up is the move's too
            lag += others.lag
        for m in range(1, available + 1):
            reach *= model.at(m - 1).value
            expected += reach
            if alike:
                others = Posted((n - 1) * (m + 1), (n - 1) * expected, m, n - 1, drafters=n - 1)
            rate = (expected + others.expected) / self._seconds(m, source, lag, expected, others)
            if rate > best_rate:
                best_m, best_rate, best_expected = m, rate, expected
        return best_m, best_rate, best_expected

    def _all_plain(self, others: Posted) -> float:
        """The batch's rate if every sequence in it took a plain step: the way out of a
        herd (the module docstring)."""
        n = len(self.load)
        return n / self._seconds(0, None, 0, others=Posted(n - 1, n - 1.0, 0))

    def _seconds(self, m: int, source: Source | None, lag: int, expected: float = 1.0,
                 others: Posted = NOTHING_POSTED) -> float:
        """Predicted wall time of a round drafting m tokens from source, with the others'
        plans in the same call."""
        c = self.costs
        seconds = c.target_call(others.tokens + m + 1) + (c.overhead[m > 0].value or 0.0)
        # The others' own work runs on the same thread, one sequence after another, a
        # drafting round's for those that draft (sampled: 32 ms a round against 6 plain,
        # BF16 under 4 clients).
        drafters = min(others.drafters, len(self.load) - 1)
        seconds += (len(self.load) - 1 - drafters) * (c.overhead[False].value or 0.0)
        seconds += drafters * (c.overhead[True].value or 0.0)
        # The draft's steps are batched across sequences: the round drafts for its
        # longest run, each call as wide as the sequences drafting at that step.
        steps = m if source == MODEL else 0
        seconds += c.drafting_widths(others.step_widths(steps))
        if steps:
            # Feeding tokens the draft has not seen (its prompt prefill, or text made
            # during plain steps) is paid once and serves the rest of the sequence:
            # charge this round its share of the expected remaining tokens.
            horizon = max(expected, self.length.expected_remaining())
            seconds += c.catch_up(lag) * expected / horizon
        return max(seconds, 1e-9)

    def observe(self, report: RoundReport) -> None:
        # Each sequence of a batch reports the calls they shared: together, once.
        self.costs.observe_round(report, 1.0 / max(1, len(self.load)))
        self.acceptance.observe(report)
        self.shadow.observe(report, self.acceptance)
        self.length.generated += len(report.emitted_tokens)
        self.load.realised.observe(self, len(self.load), len(report.emitted_tokens), report.round_seconds,
                                   bool(report.draft_calls), report.shared_prompt)

    def end(self) -> None:
        self.load.leave(self)


class ConfidenceRule:
    """A round's `extent`: re-made at each drafted position from the draft's confidence
    there, with E - R* T (R* the best rate found when the round was planned), the
    sunk cost of drafts already made left out, priced against what the rest of the
    batch has posted by then; the revised plan is posted in turn."""

    def __init__(self, model: SourceModel, costs: Costs, rate: float, limit: int, load: BatchLoad | None = None,
                 key: object = None):
        self.model, self.costs, self.rate, self.limit = model, costs, rate, limit
        self.load, self.key = load if load is not None else BatchLoad(), key if key is not None else self
        self.reach = 1.0  # chance that every draft so far is accepted
        self.banked = 1.0  # tokens expected from the drafts kept so far, the bonus or recovered one included

    def __call__(self, i: int, confidence: float) -> int:
        here = self.model.given_confidence(confidence).value
        others = self.load.others(self.key)
        # Value of ending the round with m drafts (m >= i), costs already paid left out:
        # the batch drafts max(others' run, i + 1) steps whatever this sequence does; each
        # further call of this sequence's costs what its token adds to that step's call.
        best_m, best_value, best_gain = i, -self.rate * self.costs.target_call(others.tokens + i + 1), 0.0
        gain, chain, drafting = 0.0, self.reach, 0.0
        for m in range(i + 1, self.limit + 1):
            chain *= here if m == i + 1 else self.model.at(m - 1).value
            gain += chain
            if m > i + 1:  # the call that feeds draft m - 1 to draw draft m
                width = others.drafting if m - 1 < others.draft_steps else 0
                drafting += self.costs.draft_call(width + 1) - self.costs.draft_call(width)
            cost = drafting + self.costs.target_call(others.tokens + m + 1)
            value = gain - self.rate * cost
            if value > best_value:
                best_m, best_value, best_gain = m, value, gain
        self.load.post(self.key, best_m + 1, self.banked + best_gain, best_m)
        if best_m > i:
            self.reach *= here
            self.banked += self.reach
        return best_m


def make_policy(k: int | str, k_max: int = 8, target=None, draft=None, *, drafts: bool = True,
                context: list[int] | None = None, cost_cache: Path | None = None,
                clock=time.perf_counter, parallel: int = 1) -> Policy:
    """The one place that decides a generation's draft-length policy: `k` from the
    configuration, an int (fixed K) or "auto". For "auto" with something that drafts
    (`drafts`), an adaptive controller warm-started with the costs of `target` and
    the `draft` model's backend (None: lookup alone), measured now on top of
    `context` or read from `cost_cache` (calibrate.py); without a target to time,
    it starts from nothing and learns the costs from the rounds. `parallel`: the
    most sequences decoded together (the policy's fork() serves each), whose calls
    of up to parallel * (k_max + 1) tokens are timed too."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    if k != "auto" or not drafts:
        return FixedK(k_max if k == "auto" else int(k))
    controller = AdaptiveController(k_max)
    if target is not None:
        measured = cached_or_measured(cost_cache, target, draft, context or probe_context(target), k_max + 1, clock,
                                      wide_sizes(k_max + 1, parallel))
        controller.costs.warm_start(measured["target"], measured.get("draft_step"), measured.get("draft_token"),
                                    measured.get("draft_first"), wide_costs(measured))
    return controller


SLOT_GAIN = 1.05


def slots_that_pay(costs: Costs, most: int = 8) -> int:
    """How many sequences to decode together by default on this machine: the fewest
    that serve, with one token each per call, within 5% of the best throughput
    n / T(n) over n <= most, and 1 unless that best beats one sequence by 5%. The
    fewest, because every further sequence in a call slows each one down: where calls
    cost the same whatever their size (memory-bound) it is `most`; where they cost in
    proportion to their tokens (compute-bound) it is 1; and where the curve bends, as
    llama.cpp's does at its groups of 4 rows, it is where the gain stops."""
    if costs.single.value is None:
        return 1  # nothing measured: no ground for more
    throughput = [n / costs.target_call(n) for n in range(1, most + 1)]
    best = max(throughput)
    if best < SLOT_GAIN * throughput[0]:
        return 1
    return next(n for n, t in enumerate(throughput, start=1) if t * SLOT_GAIN >= best)


def probe_context(target) -> list[int]:
    """Tokens to time calls on before any prompt is known: the ids themselves do not
    change what a call costs."""
    return [i % target.vocab_size for i in range(1, 33)]

"""Online estimates the adaptive draft-length policy (control.py) decides from:
acceptance rates per draft source, position and confidence (Acceptance, with
ShadowLookup scoring a lookup nobody proposed), the cost model of target and draft
calls (Costs), how long answers run (AnswerLength), all refreshed by every round,
what the other sequences decoded in the same batch plan for the call they share
(BatchLoad), and what the batch's rounds realised with and without drafting
(RealisedRates). Reading an estimate never changes it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .plans import FORCED, MODEL, RoundReport, Source, lookup_source


@dataclass
class Rate:
    """A probability estimated from decayed counts, shrunk towards a prior."""

    prior: float
    strength: float = 2.0  # pseudo-observations behind the prior
    hits: float = 0.0
    trials: float = 0.0

    @property
    def value(self) -> float:
        return (self.hits + self.prior * self.strength) / (self.trials + self.strength)

    def update(self, hit: bool, decay: float) -> None:
        self.hits = self.hits * decay + hit
        self.trials = self.trials * decay + 1

    def forget(self, decay: float) -> None:
        """Drift back towards the prior while unobserved, so a source that stopped
        paying is probed again now and then."""
        self.hits *= decay
        self.trials *= decay


class Ema:
    """An exponential moving average. With `ceiling`, an observation counts for at most
    `ceiling` times the current value: a timing spike (a call descheduled by another
    process or the hypervisor: 0.53 s for a 35 ms draft step, seen here) moves the
    estimate by a fifth of the value, not a fifth of the spike, while a real slowdown
    still doubles the estimate within a few observations."""

    def __init__(self, value: float | None = None, weight: float = 0.2, ceiling: float | None = None):
        self.value, self.weight, self.ceiling = value, weight, ceiling

    def update(self, x: float, share: float = 1.0) -> None:
        """`share` < 1: one of several reports of the same measurement (a batched call
        that each of its sequences reports), which together move the average as one."""
        if self.value is None:
            self.value = x
            return
        if self.ceiling is not None and self.value > 0:
            x = min(x, self.ceiling * self.value)
        self.value += self.weight * share * (x - self.value)


def timing() -> Ema:
    """The average of a call's seconds (Costs): spikes clipped at twice the estimate.
    Such an estimate matters most once it is wrong: a draft step inflated by one
    spike made the draft model look unpayable, and as only model rounds time the
    draft, the estimate stayed there for the rest of the run (Q4_K_M explain: model
    drafting stopped after the third answer)."""
    return Ema(ceiling=2.0)


CONFIDENCE_BINS = 10


@dataclass
class SourceModel:
    """Acceptance of one draft source: per position in the round (conditional on the
    previous drafts being accepted), and, for the draft model, per confidence bin."""

    prior: tuple[float, float]  # first position, later positions
    # A lookup's later drafts are one copied text going on: right or wrong together, so
    # they share one rate. Per position, the rates past its usual first miss would hardly
    # ever be observed and would keep their prior, promising long runs that never come.
    pooled: bool = False
    positions: list[Rate] = field(default_factory=list)
    by_confidence: list[Rate] = field(default_factory=list)

    def at(self, i: int) -> Rate:
        if self.pooled:
            i = min(i, 1)
        while len(self.positions) <= i:
            self.positions.append(Rate(self.prior[0] if not self.positions else self.prior[1]))
        return self.positions[i]

    def given_confidence(self, confidence: float) -> Rate:
        if not self.by_confidence:
            # Prior: a draft that is sure of its token is usually right.
            self.by_confidence = [Rate((b + 0.5) / CONFIDENCE_BINS) for b in range(CONFIDENCE_BINS)]
        b = min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))
        return self.by_confidence[b]

    def all_rates(self) -> list[Rate]:
        return self.positions + self.by_confidence


@dataclass
class Costs:
    """Seconds per call, measured. A target call scoring n tokens costs
    single * shape[n]: the shape of the curve is a property of the engine and the
    machine, while its scale moves with context length and with other load, and is
    refreshed by every plain step.

    A batch's plain step scores one token for each sequence, so under load the 1-token
    call that refreshes the scale is rare, and the drift lands on the shape of the
    sizes the rounds score. The sizes they have not scored yet keep the calibration's
    ratio, timed on one sequence over a short context, and fall behind: on a 2-core AMD
    EPYC (Q4_K_M) 4 sequences holding 300 tokens each made 4-token calls 28% dearer
    than calibrated and 16-token calls 22% dearer, while 16 tokens stayed priced as
    calibrated; drafting together looked cheap, and the server planned it in 238
    rounds, whose drafts the in-round rule then cut to one or none in nearly all
    (explain, 4 clients). So a size never scored in a
    round is priced at its calibrated ratio times the drift of the nearest sizes that
    have been (`_drift`)."""

    single: Ema = field(default_factory=timing)  # a target call scoring 1 token
    shape: list[Ema] = field(default_factory=list)  # [n - 1]: cost of n tokens / cost of 1
    # A round's first draft call runs just after a target call that pushed the draft's
    # weights out of the CPU caches, so it costs more than the calls that follow it.
    draft_first: Ema = field(default_factory=timing)  # a round's first draft call, feeding 1-2 tokens
    draft_step: Ema = field(default_factory=timing)  # each later draft call of the round
    draft_token: Ema = field(default_factory=timing)  # each extra token fed in one call
    # {w: seconds} of a draft call that a batch's steps made w tokens wide (several
    # sequences' drafts at once). A wide step costs the draft model's per-token work,
    # which catching up on a short context under-prices: 4 sequences' step cost 2.3-3x
    # one sequence's on a 2-core AMD EPYC (Q4_0 draft), against 1.5x priced from the
    # catch-up cost. Learnt from the batches' steps alone; unmeasured widths are
    # interpolated (draft_call).
    draft_wide: dict[int, Ema] = field(default_factory=dict)
    overhead: dict[bool, Ema] = field(default_factory=lambda: {False: Ema(0.0), True: Ema(0.0)})
    warm_started: bool = False  # started from measured costs rather than from nothing
    calibrated: list[tuple[int, float]] = field(default_factory=list)  # (n, shape) as warm_start set them
    # {n: calibrated shape}: the sizes (> 1) a round's call has refreshed, with the price
    # the calibration gives them (it never changes, so _drift need not interpolate it again)
    scored: dict[int, float] = field(default_factory=dict)

    def target_call(self, n: int) -> float:
        return (self.single.value or 0.0) * self.ratio(n)

    def warm_start(self, target: list[float], draft_step: float | None = None, draft_token: float | None = None,
                   draft_first: float | None = None, wide: dict[int, float] | None = None) -> None:
        """Start from measured costs (calibrate.py): target[n - 1] seconds for a call
        scoring n tokens, `wide` {n: seconds} for a few larger calls (a batch's), and
        the draft's per-call costs where there is a draft model."""
        self.single.value = target[0]
        sizes = dict(enumerate(target[1:], start=2)) | dict(wide or {})
        for n, seconds in sorted(sizes.items()):
            self._shape(n).value = seconds / target[0]
        self.calibrated = [(1, 1.0)] + [(n, seconds / target[0]) for n, seconds in sorted(sizes.items())]
        self.scored = {}
        for ema, value in ((self.draft_step, draft_step), (self.draft_token, draft_token),
                           (self.draft_first, draft_first)):
            if value is not None:
                ema.value = value
        self.warm_started = True

    def _shape(self, n: int) -> Ema:
        while len(self.shape) < n:
            self.shape.append(timing())
        return self.shape[n - 1]

    def ratio(self, n: int) -> float:
        if n == 1:
            return 1.0
        if n in self.scored or not self.calibrated:
            known = self.shape[n - 1].value if n <= len(self.shape) else None
            if known is not None:
                return known
            # Unmeasured size: interpolate linearly between the nearest measured sizes
            # (or extrapolate from the last two); unmeasured entirely: flat, the
            # optimistic guess that the first rounds then correct.
            measured = [(1, 1.0)] + [(i + 1, e.value) for i, e in enumerate(self.shape) if i and e.value is not None]
            return interpolated(measured, n)
        return interpolated(self.calibrated, n) * self._drift(n)

    def _drift(self, n: int) -> float:
        """How far the rounds' calls have moved from the calibration near size n: the
        ratio of scored to calibrated shape at the nearest scored sizes, linear between
        them and held flat beyond; 1 until a size has been scored."""
        drifts = sorted((m, self.shape[m - 1].value / calibrated) for m, calibrated in self.scored.items())
        below = [d for d in drifts if d[0] < n]
        above = [d for d in drifts if d[0] > n]
        if below and above:
            (x0, y0), (x1, y1) = below[-1], above[0]
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return below[-1][1] if below else above[0][1] if above else 1.0

    def observe_target(self, n: int, seconds: float, share: float = 1.0) -> None:
        if n == 1 or self.single.value is None:
            self.single.update(seconds / self.ratio(n), share)
        else:
            shape = self._shape(n)
            if self.calibrated and n not in self.scored:  # from where it is priced now, drift included
                shape.value = self.ratio(n)
                self.scored[n] = interpolated(self.calibrated, n)
            shape.update(seconds / self.single.value, share)

    def observe_round(self, report: RoundReport, share: float = 1.0) -> None:
        """Refresh every cost a round measured: its target call, its draft calls (a
        round's first apart, a catching-up call per extra token) and what else it took.
        In a batch every sequence reports the calls they shared, with `share` 1 / the
        number of sequences, so that a call counts once however many took part."""
        m = sum(source != FORCED for source in report.sources)  # forced tokens add no drafting work
        if report.target_tokens:  # 0: the first token came from the prompt's prefill
            self.observe_target(report.target_tokens, report.target_seconds, share)
        draft_seconds = 0.0
        for i, call in enumerate(report.draft_calls):
            draft_seconds += call.seconds
            if call.tokens_fed > 2:  # catching up: what the extra tokens cost beyond a first call
                first = self.drafting(1)
                if first:
                    self.draft_token.update(max(0.0, call.seconds - first) / (call.tokens_fed - 1), share)
            elif call.width > call.tokens_fed:  # a step shared with other sequences' drafts
                self.draft_wide.setdefault(call.width, timing()).update(call.seconds, share)
            else:
                (self.draft_step if i else self.draft_first).update(call.seconds, share)
        # What else the round took: in a batch, its own work alone (the time it slept
        # covers the calls and the others' work, which their own reports count).
        if report.waited_seconds:
            own = report.round_seconds - report.waited_seconds
        else:
            own = report.round_seconds - report.target_seconds - draft_seconds
        self.overhead[m > 0].update(max(0.0, own), share)

    def drafting(self, m: int) -> float:
        """Draft time of a round that drafts m tokens (its first call cold)."""
        return self.drafting_widths([1] * m)

    def drafting_widths(self, widths: list[int]) -> float:
        """Draft time of a round whose draft calls are `widths` tokens wide in turn (a
        batch's: one token for each sequence drafting at that step); the first call
        runs cold, dearer by what a round's first 1-token call costs over a later one."""
        if not widths:
            return 0.0
        step = self.draft_step.value or 0.0
        first = self.draft_first.value if self.draft_first.value is not None else step
        if widths[0] > 1:
            first += self.draft_call(widths[0]) - step
        later = Counter(widths[1:])  # one sequence alone: first + (m - 1) * step, as ever
        return first + sum(n * self.draft_call(w) for w, n in sorted(later.items()))

    def draft_call(self, width: int) -> float:
        """A draft call's seconds at `width` tokens: a 1-token step, a batch's step as
        measured at that width, or else interpolated between the nearest measured widths
        (beyond the widest, on at the slope of the widest two, or at the catch-up cost
        per token: optimistic, as an unmeasured call is tried and then timed)."""
        if width <= 0:
            return 0.0
        step = self.draft_step.value or 0.0
        measured = [(1, step)] + sorted((w, e.value) for w, e in self.draft_wide.items() if e.value is not None)
        return interpolated(measured, width, least_slope=self.draft_token.value or 0.0)

    def catch_up(self, lag: int) -> float:
        """Extra draft time to feed `lag` tokens it has not seen (beyond the usual 1-2)."""
        return max(0, lag - 2) * (self.draft_token.value or 0.0)


def interpolated(points: list[tuple[int, float]], x: int, least_slope: float = 0.0) -> float:
    """The cost at size x from measured (size, cost) points, sorted, the first at or
    below x: a measured one as it is, else linear between its nearest neighbours, and
    beyond the largest on at the slope of the largest two, or `least_slope` if that is
    steeper or there is only one point."""
    below = [p for p in points if p[0] <= x]
    above = [p for p in points if p[0] > x]
    x0, y0 = below[-1]
    if x0 == x:
        return y0
    if above:
        x1, y1 = above[0]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    slope = least_slope
    if len(below) >= 2:
        xa, ya = below[-2]
        slope = max(slope, (y0 - ya) / (x0 - xa))
    return y0 + slope * (x - x0)


@dataclass(frozen=True)
class Posted:
    """What a sequence plans for the coming target call (or several, summed)."""

    tokens: int = 0  # tokens it adds to the call: its drafts and its pending token
    expected: float = 0.0  # tokens it expects to emit
    draft_steps: int = 0  # draft-model steps it needs (0: a lookup, forced tokens, a plain step)
    drafting: int = 0  # sequences among them that take those steps (the width of the draft calls)
    lag: int = 0  # tokens their draft models have not read: what drafting would first feed them
    drafters: int = 0  # sequences among them that draft anything this round (their own work is a drafting round's)

    def step_widths(self, steps: int) -> list[int]:
        """The widths of a round's draft calls when one more sequence drafts `steps`
        tokens beside these: this one's token in its first `steps` calls, the others' in
        their first draft_steps (all taken as long as the longest run)."""
        drafting = max(self.drafting, int(self.draft_steps > 0))
        return [(drafting if j < self.draft_steps else 0) + (j < steps) for j in range(max(steps, self.draft_steps))]


NOTHING_POSTED = Posted()


class BatchLoad:
    """What the sequences decoded together plan for the call they share, so that each
    prices its own plan against the whole call. A sequence's policy posts when it
    begins (the least it adds: its pending token), whenever it plans or revises a
    round, and leaves at its end; it reports every round it played to `realised`. Keys
    are the policies themselves."""

    def __init__(self):
        self._posts: dict[object, Posted] = {}
        self.realised = RealisedRates()

    def post(self, key: object, tokens: int, expected: float, draft_steps: int = 0, lag: int = 0) -> None:
        self._posts[key] = Posted(tokens, expected, draft_steps, int(draft_steps > 0), lag, int(tokens > 1))

    def leave(self, key: object) -> None:
        self._posts.pop(key, None)

    def __len__(self) -> int:
        return len(self._posts)

    def others(self, key: object) -> Posted:
        """Everyone but `key` as one sequence: tokens and expected tokens summed, and
        the longest draft-model run (the draft's steps are batched across sequences
        too, so a round drafts for as long as its longest run)."""
        rest = [posted for k, posted in self._posts.items() if k is not key]
        if not rest:
            return NOTHING_POSTED
        return Posted(sum(p.tokens for p in rest), sum(p.expected for p in rest), max(p.draft_steps for p in rest),
                      sum(p.drafting for p in rest), sum(p.lag for p in rest), sum(p.drafters for p in rest))


class RealisedRates:
    """The tokens per second a batch realised, by how many sequences shared its calls,
    in rounds where the draft model stepped and in rounds where it did not; and from
    them whether drafting is barred for the batch's coming rounds (Nightjar's and
    AdaSpec's switch: speculation off for a batch size where it does not pay).

    The cost model prices a round before it is played, and under load its sums fell
    short of what drafting cost: on the BF16 target under 4 clients, -k auto ran at
    0.80-0.87 of plain batching though every plan predicted a gain (draft steps as wide
    as the batch, the others' drafts catching up on prompts, more work between calls).
    What a round realised needs no model: its tokens, and the time from one call to the
    next. A batch round closes when a sequence reports a second time (or all have
    reported); rounds whose call also took in a newcomer's prompt are left out (that
    prefill is the same whatever the batch drafts), and so is a batch of one, which
    keeps the cost model's choices.

    Per batch size, each mode's tokens and seconds are decayed sums (`decay` per round
    of that size), with a weight in rounds. Drafting is barred where both modes hold
    `evidence` rounds and drafting's rate is the lower; and, to have a plain rate to
    compare with, while plain steps hold under `stale` rounds of evidence and drafting
    holds `evidence`. A bar holds until the plain rate has `evidence` rounds again and
    drafting's rate is not below it or has gone stale: so stale evidence is measured
    afresh in blocks of about `evidence - stale` rounds, about once in
    log(stale / evidence) / log(decay) rounds (550 at the defaults), which is what
    probing costs where the other mode wins."""

    def __init__(self, decay: float = 0.998, evidence: float = 6.0, stale: float = 2.0):
        self.decay, self.evidence, self.stale = decay, evidence, stale
        self._sums: dict[int, dict[bool, list[float]]] = {}  # size -> drafted -> [tokens, seconds, rounds]
        self._barred: dict[int, bool] = {}
        self._round: dict[object, tuple[int, float, bool, bool]] = {}  # key -> this round's report

    def observe(self, key: object, live: int, emitted: int, seconds: float, drafted: bool, prompt: bool) -> None:
        """One sequence's round: tokens it emitted, its wall time, whether its draft
        model stepped, whether its call took in a prompt; `live`: the sequences posted."""
        if key in self._round:
            self._close()
        self._round[key] = (emitted, seconds, drafted, prompt)
        if len(self._round) >= live:
            self._close()

    def barred(self, size: int) -> bool:
        """Whether the batch's coming rounds, `size` sequences sharing each call, draft
        nothing from the model. A size without `stale` rounds of evidence takes the bar
        of the nearest size that has them (the larger of two): the rounds where 3
        sequences plan while a fourth one's prompt is read are left out of the rates,
        and planned alone they drafted again, each draft reading its text and then cut,
        under a bar for 4 (BF16, explain: 9 such calls, 3.8 s)."""
        if size < 2:
            return False
        known = [n for n in self._barred if self.rounds(n, True) + self.rounds(n, False) > self.stale - 0.5]
        if size in known or not known:
            return self._barred.get(size, False)
        return self._barred[min(known, key=lambda n: (abs(n - size), -n))]

    def rate(self, size: int, drafted: bool) -> float | None:
        tokens, seconds, rounds = self._sums.get(size, {}).get(drafted, (0.0, 0.0, 0.0))
        return tokens / seconds if rounds and seconds > 0 else None

    def rounds(self, size: int, drafted: bool) -> float:
        return self._sums.get(size, {}).get(drafted, (0.0, 0.0, 0.0))[2]

    def _close(self) -> None:
        reports, self._round = list(self._round.values()), {}
        size = len(reports)
        if size < 2 or any(prompt for *_, prompt in reports):
            return
        sums = self._sums.setdefault(size, {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]})
        for mode in sums.values():
            for i in range(3):
                mode[i] *= self.decay
        mode = sums[any(drafted for _, _, drafted, _ in reports)]
        mode[0] += sum(emitted for emitted, *_ in reports)
        mode[1] += sum(seconds for _, seconds, *_ in reports) / size  # each reports the same call-to-call time
        mode[2] += 1
        self._barred[size] = self._bar(size)

    def _bar(self, size: int) -> bool:
        def holds(drafted: bool, rounds: float) -> bool:  # half a round's slack for the decay
            return self.rounds(size, drafted) > rounds - 0.5

        loses = holds(True, self.stale) and holds(False, self.stale) and self.rate(size, True) < self.rate(size, False)
        if self.barred(size):
            return not holds(False, self.evidence) or loses
        return holds(True, self.evidence) and (not holds(False, self.stale) or loses)


# (first position, later positions): a later draft is only reached when the earlier
# ones were accepted, and acceptances come in runs (a lookup that is right tends to
# stay right), so the later rates start higher. A lookup's priors are modest: it is
# scored for free in every round that does not propose it (ShadowLookup), so on text
# that repeats the evidence lifts it within a few tokens, while an optimistic prior made
# a compute-bound target pay for wide calls on lookups that then failed.
DEFAULT_PRIORS = {MODEL: (0.7, 0.8), lookup_source(1): (0.2, 0.6), lookup_source(2): (0.4, 0.7),
                  lookup_source(3): (0.6, 0.8), FORCED: (1.0, 1.0)}


class Acceptance:
    """Acceptance rates per source. A source that fails is tried again once its
    evidence has decayed (idle_decay per round it sits out: several hundred rounds
    from one failure to a probe)."""

    def __init__(self, priors: dict[Source, tuple[float, float]] | None = None, decay: float = 0.9,
                 idle_decay: float = 0.998):
        self.priors = dict(DEFAULT_PRIORS, **(priors or {}))
        self.decay, self.idle_decay = decay, idle_decay
        self.sources: dict[Source, SourceModel] = {}

    def __getitem__(self, source: Source) -> SourceModel:
        if source not in self.sources:
            prior = self.priors.get(source, self.priors[lookup_source(3)] if source.is_lookup else (0.5, 0.5))
            self.sources[source] = SourceModel(prior, pooled=source.is_lookup)
        return self.sources[source]

    def sat_out(self, chosen: Source | None) -> None:
        """Sources left out this round drift back towards their prior (probing)."""
        for source, model in self.sources.items():
            if source != chosen:
                for r in model.all_rates():
                    r.forget(self.idle_decay)

    def observe(self, report: RoundReport) -> None:
        position: dict[Source, int] = {}  # each source's own position: forced tokens may come between
        for i, (source, confidence) in enumerate(zip(report.sources, report.confidences)):
            if i > report.num_accepted:
                break  # not reached: an earlier draft was rejected
            accepted = i < report.num_accepted
            model = self[source]
            j = position[source] = position.get(source, -1) + 1
            model.at(j).update(accepted, self.decay)
            if confidence is not None:
                model.given_confidence(confidence).update(accepted, self.decay)


class ShadowLookup:
    """Learn a lookup's acceptance while not proposing it, from any other round.

    Proposing a lookup to find out whether it pays costs a wider target call; but
    every round knows the target's distribution p at each position it emitted a
    token (a plain step's one row, a model round's verify rows up to its first
    rejection), and a one-hot draft x there would have been accepted with
    probability p(x). So the lookup's first token is scored for free, and, while
    the emitted tokens keep following it, its later tokens too (each conditional on
    the earlier ones being right, as the rates are defined). On text that repeats,
    the lookup's rates rise until proposing it pays; where it does not, they fall
    without a wide call spent on finding out.
    """

    def __init__(self):
        self.offered: tuple[Source, tuple[int, ...]] | None = None  # this round's lookup
        self.followed: tuple[Source, tuple[int, ...], int] | None = None  # a lookup followed, at its i-th token

    def reset(self) -> None:
        """What follows a text belongs to it: a lookup says nothing about another text."""
        self.offered = self.followed = None

    def observe(self, report: RoundReport, acceptance: Acceptance) -> None:
        offered, self.offered = self.offered, None
        proposed = any(source.is_lookup for source in report.sources)  # Acceptance.observe scored it
        if proposed or report.target_probs is None:
            self.followed = None
            return
        if self.followed is None and offered is not None:
            self.followed = (*offered, 0)
        if self.followed is None:
            return
        source, tokens, i = self.followed
        rates = acceptance[source]
        for row, token in zip(report.target_probs, report.emitted_tokens):
            rates.at(i).update(float(row[tokens[i]]), acceptance.decay)
            if token != tokens[i] or i + 1 == len(tokens):
                self.followed = None
                return
            i += 1
        self.followed = (source, tokens, i)


class AnswerLength:
    """How many tokens the current sequence is still expected to emit, from how long
    earlier answers ran."""

    def __init__(self):
        self.typical = Ema(weight=0.3)  # tokens per finished sequence
        self.budget = 0  # this sequence's max_new_tokens
        self.generated = 0

    def begin(self, max_new_tokens: int) -> None:
        # The last sequence's length says how long answers run, unless its token
        # budget cut it (a warm-up, a capped request): that one says nothing.
        if 0 < self.generated < self.budget:
            self.typical.update(self.generated)
        self.budget, self.generated = max_new_tokens, 0

    def expected_remaining(self) -> float:
        """What typical answers have left at this point, or, once this one has outrun
        them, as many as it has made so far (a long answer tends to keep going); never
        past the budget."""
        remaining = self.budget - self.generated
        if self.typical.value is not None:
            expected = max(8.0, self.typical.value - self.generated, float(self.generated))
            remaining = min(remaining, expected)
        return max(1.0, remaining)

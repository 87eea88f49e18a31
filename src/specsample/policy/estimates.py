"""Online estimates the planner (control.py) decides from: acceptance rates per
draft source, position and confidence (Acceptance, with ShadowLookup scoring a
lookup nobody proposed) and how long answers run (AnswerLength), kept per
sequence; the prices of model calls and of each sequence's own work (Prices, from
the calls the run makes, the calibration as their prior) and what rounds realised
with and without drafts (Goodput), kept once for the machine. Reading an estimate
never changes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import (ACCEPTANCE_DECAY, ANSWER_FLOOR, ANSWER_WEIGHT, FORCED_PRIOR, GOODPUT_DECAY, IDLE_DECAY, PLANNER,
                     PRIOR_STRENGTH, WORK_WEIGHT, PlannerConfig)
from .curve import Curve
from ..decoding.plans import FORCED, MODEL, SUFFIX_CLASSES, RoundReport, Source


@dataclass
class Rate:
    """A probability estimated from decayed counts, shrunk towards a prior."""

    prior: float
    strength: float = PRIOR_STRENGTH  # pseudo-observations behind the prior
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
    """An exponential moving average; None until the first observation."""

    def __init__(self, value: float | None = None, weight: float = WORK_WEIGHT):
        self.value, self.weight = value, weight

    def update(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.weight * (x - self.value)


@dataclass
class SourceModel:
    """Acceptance of one draft source: per position in the round (conditional on the
    previous drafts being accepted), and, for the draft model, per confidence bin."""

    prior: tuple[float, float]  # first position, later positions
    # A lookup's later drafts are one copied text going on: right or wrong together, so
    # they share one rate. Per position, the rates past its usual first miss would hardly
    # ever be observed and would keep their prior, promising long runs that never come.
    pooled: bool = False
    strength: float = PRIOR_STRENGTH  # of each rate's prior
    bins: int = PLANNER.confidence_bins  # of the draft's confidence
    positions: list[Rate] = field(default_factory=list)
    by_confidence: list[Rate] = field(default_factory=list)

    # Reading a rate that was never observed gives its prior and keeps nothing (the
    # planner reads while it plans, which changes nothing); held_at and held_given keep
    # it, to be updated. A kept rate never observed stays at its prior (Rate.forget
    # leaves zero counts at zero), so when it is kept changes no estimate.
    def at(self, i: int) -> Rate:
        i = min(i, 1) if self.pooled else i
        return self.positions[i] if i < len(self.positions) else Rate(self.prior[min(1, i)], self.strength)

    def held_at(self, i: int) -> Rate:
        i = min(i, 1) if self.pooled else i
        while len(self.positions) <= i:
            self.positions.append(Rate(self.prior[min(1, len(self.positions))], self.strength))
        return self.positions[i]

    def given_confidence(self, confidence: float) -> Rate:
        b = min(self.bins - 1, max(0, int(confidence * self.bins)))
        return self.by_confidence[b] if self.by_confidence else self._bin_prior(b)

    def held_given(self, confidence: float) -> Rate:
        if not self.by_confidence:
            self.by_confidence = [self._bin_prior(b) for b in range(self.bins)]
        return self.given_confidence(confidence)

    def _bin_prior(self, b: int) -> Rate:
        return Rate((b + 0.5) / self.bins, self.strength)  # a draft that is sure of its token is usually right


@dataclass
class Prices:
    """What the planner prices a round with: the target's calls by tokens scored,
    the draft model's by tokens fed (a batch's step is as wide as the sequences
    drafting at it; a catch-up call as the text it reads), and each sequence's own
    work between calls (sampling, verifying, the drafter's bookkeeping), apart for
    plain and drafting rounds."""

    target: Curve = field(default_factory=Curve)
    draft: Curve = field(default_factory=Curve)
    work: dict[bool, Ema] = field(default_factory=lambda: own_work())

    @classmethod
    def empty(cls, config: PlannerConfig = PLANNER) -> Prices:
        """Prices with no calibration behind them: every call of the run sets them."""
        return cls(Curve(config=config), Curve(config=config), own_work())

    def own(self, drafting: bool) -> float:
        """A sequence's own seconds between calls in a plain or a drafting round. Until
        a drafting round has been timed it is priced as a plain one's (it does at least
        that work): priced at nothing, it made a first wide call look cheaper than a
        plain step whose own work was known."""
        value = self.work[drafting].value
        return value if value is not None else self.work[False].value or 0.0


def own_work() -> dict[bool, Ema]:
    """The averages of a sequence's own work in plain (False) and drafting rounds."""
    return {False: Ema(), True: Ema()}


class Goodput:
    """Tokens per second that rounds realised, by the number of sequences sharing their
    target call and by what the round drafted from: nothing (plain), the draft model, or
    lookups alone; the guard against prices whose sums fall short (Nightjar's and
    AdaSpec's switch); its numbers are config.py's (`evidence` and the thresholds derived
    from it, the decays). Each kind's tokens, seconds and rounds are sums decayed by
    GOODPUT_DECAY a round; a drafting kind that is not barred decays by GOODPUT_DECAY a
    round of its own and IDLE_DECAY a round of another kind, so that a source playing
    one round in twenty still gathers enough evidence to be judged (decayed with every
    round, lookups on chat never did, and on a compute-bound target each of their wide
    calls lost). A drafting kind is barred for a size where it holds `evidence` rounds,
    plain steps `recent_plain` (a twelfth as many), and it realised less than plain
    steps (lookups that lose do not bar the model, nor the reverse); while barred its
    evidence decays, and once below `unbar` (half of `evidence`: about thirty-five rounds
    on) it is tried again. (A few rounds are too few to bar on: a
    drafting round emits anything from one token to all its drafts and one more.) Where
    drafting is all a size plays, a plain round is asked for once plain evidence has
    decayed below `probe` (a twentieth of `evidence`: about one round in sixty), so that there is always a plain
    rate to hold drafting to. Rounds whose target call also read a prompt are left out:
    that work is the same whatever the round drafts. So are rounds in which the draft
    model read text it had not read (a prompt, a catch-up chunk; control.Planner.record):
    that is a one-off outlay per text, which the planner prices where it decides to read
    (Seat.stalls, Planner._catch_up). Counted as the model's rounds, as they were, a
    ~120-token HumanEval prompt's reading (about six plain steps on BF16) made the
    model's first rounds after every prompt look slower than plain steps, and barred it
    before it had drafted long enough to be judged; a barred model reads no more, so it
    stayed barred (BF16 HumanEval: -k auto 1.02x plain decoding where K = 4 made 1.28x)."""

    KINDS = (None, "model", "lookup", "suffix")  # what a round drafted from; None: a plain step

    def __init__(self, config: PlannerConfig = PLANNER):
        self.config = config
        self._sums: dict[int, dict[str | None, list[float]]] = {}  # size -> kind -> [tokens, seconds, rounds]
        self._barred: set[tuple[int, str]] = set()

    def add(self, size: int, kind: str | None, tokens: int, seconds: float) -> None:
        sums = self._sums.setdefault(size, {k: [0.0, 0.0, 0.0] for k in self.KINDS})
        for k, mode in sums.items():
            # Plain steps, and a barred kind, age with every round; a drafting kind's
            # evidence ages with its own rounds (and IDLE_DECAY with the others), so the
            # few rounds a source plays now and then still add up to a verdict.
            decay = GOODPUT_DECAY if k in (None, kind) or (size, k) in self._barred else IDLE_DECAY
            mode[:] = [x * decay for x in mode]
        sums[kind][:] = [x + y for x, y in zip(sums[kind], (tokens, seconds, 1))]
        plain, config = sums[None], self.config
        for drafting in self.KINDS[1:]:
            mine = sums[drafting]  # [tokens, seconds, rounds]: fewer tokens a second than plain steps bar it
            losing = mine[0] * plain[1] < plain[0] * mine[1]
            if mine[2] >= config.evidence and plain[2] >= config.recent_plain and losing:
                self._barred.add((size, drafting))
            elif mine[2] < config.unbar:
                self._barred.discard((size, drafting))

    def barred(self, size: int, kind: str) -> bool:
        return (size, kind) in self._barred

    def probe(self, size: int) -> bool:
        """Whether the coming round should be plain, to measure plain steps again."""
        sums = self._sums.get(size)
        return sums is not None and sums[None][2] < self.config.probe and any(
            sums[kind][2] >= self.config.evidence for kind in self.KINDS[1:])


def kind_of(source) -> str | None:
    """The goodput kind of a round drafting from `source` (None: a plain step): the
    model, context lookup, or the suffix index (a grammar's forced tokens are never
    planned)."""
    return None if source is None else "model" if source == MODEL else "suffix" if source.kind == "suffix" else "lookup"


def prior(source: Source, config: PlannerConfig) -> tuple[float, float]:
    """A source's prior acceptance (first position, later positions): a later draft is
    only reached when the earlier ones were accepted, and acceptances come in runs (a
    lookup that is right tends to stay right), so the later rates start higher. A
    lookup's priors are modest: it is scored for free in every round that does not
    propose it (ShadowLookup), so on text that repeats the evidence lifts it within a
    few tokens, while an optimistic prior made a compute-bound target pay for wide calls
    on lookups that then failed. A lookup of a longer match than the priors list takes
    the last one's. A suffix-index match of the c-th class (plans.SUFFIX_CLASSES: 4, 8,
    16, 32 tokens) starts as a lookup of c + 2 tokens: the shortest class is most often
    served text that is not this one's, so no surer than a 2-token lookup; the longer
    ones as a 3-token one."""
    if source == FORCED:
        return FORCED_PRIOR
    if source.is_lookup:
        match = SUFFIX_CLASSES.index(source.match) + 2 if source.kind == "suffix" else source.match
        return config.lookup_priors[min(match, len(config.lookup_priors)) - 1]
    return config.model_prior


class Acceptance:
    """Acceptance rates per source, decayed by `decay` a round they are observed. A
    source that fails is tried again once its evidence has decayed (IDLE_DECAY per round
    it sits out: several hundred rounds from one failure to a probe)."""

    def __init__(self, config: PlannerConfig = PLANNER):
        self.config, self.decay, self.idle_decay = config, ACCEPTANCE_DECAY, IDLE_DECAY
        self.sources: dict[Source, SourceModel] = {}

    def __getitem__(self, source: Source) -> SourceModel:
        """The source's model to read: a source never observed reads as its priors, kept nowhere."""
        model = self.sources.get(source)
        if model is None:
            config = self.config
            model = SourceModel(prior(source, config), pooled=source.is_lookup, bins=config.confidence_bins)
        return model

    def held(self, source: Source) -> SourceModel:
        """The source's model to update, kept from now on."""
        return self.sources.setdefault(source, self[source])

    def sat_out(self, chosen: Source | None) -> None:
        """Sources left out this round drift back towards their prior (probing)."""
        for source, model in self.sources.items():
            if source != chosen:
                for r in model.positions + model.by_confidence:
                    r.forget(self.idle_decay)

    def observe(self, report: RoundReport) -> None:
        position: dict[Source, int] = {}  # each source's own position: forced tokens may come between
        reached = report.sources[:report.num_accepted + 1]  # past the first rejection, none was reached
        for i, (source, confidence) in enumerate(zip(reached, report.confidences)):
            accepted = i < report.num_accepted
            model = self.held(source)
            j = position[source] = position.get(source, -1) + 1
            model.held_at(j).update(accepted, self.decay)
            if confidence is not None:
                model.held_given(confidence).update(accepted, self.decay)


class ShadowLookup:
    """Learn the acceptance of lookups (context lookup, the suffix index: drafts copied
    from text) while not proposing them, from any other round.

    Proposing a lookup to find out whether it pays costs a wider target call; but
    every round knows the target's distribution p at each position it emitted a
    token (a plain step's one row, a model round's verify rows up to its first
    rejection), and a one-hot draft x there would have been accepted with
    probability p(x). So a lookup's first token is scored for free, and, while
    the emitted tokens keep following it, its later tokens too (each conditional on
    the earlier ones being right, as the rates are defined). On text that repeats,
    the lookup's rates rise until proposing it pays; where it does not, they fall
    without a wide call spent on finding out. Each kind of lookup is followed on its
    own: a round that proposes one kind (scored by Acceptance.observe) still scores
    the other's.
    """

    def __init__(self):
        self.offered: tuple[tuple[Source, tuple[int, ...]], ...] = ()  # this round's lookups, one a kind
        self.followed: dict[str, tuple[Source, tuple[int, ...], int]] = {}  # kind -> a lookup followed, at its i-th token

    def reset(self) -> None:
        """What follows a text belongs to it: a lookup says nothing about another text."""
        self.offered, self.followed = (), {}

    def observe(self, report: RoundReport, acceptance: Acceptance) -> None:
        followed = {source.kind: (source, tokens, 0) for source, tokens in self.offered} | self.followed
        self.offered, self.followed = (), {}
        proposed = {source.kind for source in report.sources}  # Acceptance.observe scored those
        if report.target_probs is None:
            return
        for kind, lookup in followed.items():
            if kind not in proposed and (going := self._score(lookup, report, acceptance)) is not None:
                self.followed[kind] = going

    @staticmethod
    def _score(followed, report: RoundReport, acceptance: Acceptance):
        """Score one lookup on the round's rows; where it is still followed after them."""
        source, tokens, i = followed
        for row, token in zip(report.target_probs, report.emitted_tokens):
            acceptance.held(source).held_at(i).update(float(row[tokens[i]]), acceptance.decay)
            if token != tokens[i] or i + 1 == len(tokens):
                return None
            i += 1
        return source, tokens, i


class AnswerLength:
    """How many tokens the current sequence is still expected to emit, from how long
    earlier answers ran: `typical`, which the seats of one planner share (Seat.fork):
    how long answers run is the workload's, not one slot's. Each slot learning on its
    own, a server's first answers in every slot were all taken to run to their budget
    (4 slots, HumanEval: 128 tokens where they ran 34), which made the draft's reading
    of their prompts look paid for several times over."""

    def __init__(self):
        # Tokens per finished sequence; this sequence's max_new_tokens and tokens so far.
        self.typical, self.budget, self.generated = Ema(weight=ANSWER_WEIGHT), 0, 0
        self.floor = ANSWER_FLOOR

    def begin(self, max_new_tokens: int) -> None:
        self.end()  # the last sequence's, if nobody said it was over
        self.budget, self.generated = max_new_tokens, 0

    def end(self) -> None:
        """The sequence is over: its length says how long answers run, unless its token
        budget cut it (a warm-up, a capped request): that one says nothing. Said once."""
        if 0 < self.generated < self.budget:
            self.typical.update(self.generated)
        self.budget = 0

    def expected_remaining(self) -> float:
        """What typical answers have left at this point, or, once this one has outrun
        them, as many as it has made so far (a long answer tends to keep going); never
        past the budget."""
        remaining = self.budget - self.generated
        if self.typical.value is not None:
            remaining = min(remaining, max(self.floor, self.typical.value - self.generated, float(self.generated)))
        return max(1.0, remaining)

"""How many tokens to draft next: a fixed K, or an adaptive controller fed with
measured costs and each round's outcome.

A policy answers two questions for the drafter:

    choose(options, lag)         before a round: which source drafts (model, n-gram
                                 lookup of a given match length) and how many tokens
                                 it is planned to draft; 0 means a plain target step.
    extent(source, i, confidence) during model drafting, once the draft distribution
                                 q_i at position i is known and *before* x_i is drawn
                                 from it: how many drafts the round should end with.
                                 x_i is drawn and proposed iff the answer is > i.

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

The estimates it decides from (acceptance rates, the cost model) are in
estimates.py; calibrate.py measures the costs on first use and caches them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .calibrate import cached_or_measured
from .estimates import Costs, Ema, SourceModel

MODEL = "model"
FORCED = "forced"  # tokens a grammar forces: drafted for free, always accepted


def ngram_source(match_length: int) -> str:
    return f"ngram{match_length}"


def is_lookup(source: str) -> bool:
    return source.startswith("ngram")


# (first position, later positions): a later draft is only reached when the earlier
# ones were accepted, and acceptances come in runs (a lookup that is right tends to
# stay right), so the later rates start higher. A lookup's priors are modest: it is
# scored for free in every round that does not propose it (_shadow_lookup), so on text
# that repeats the evidence lifts it within a few tokens, while an optimistic prior made
# a compute-bound target pay for wide calls on lookups that then failed.
DEFAULT_PRIORS = {MODEL: (0.7, 0.8), "ngram1": (0.2, 0.6), "ngram2": (0.4, 0.7), "ngram3": (0.6, 0.8),
                  FORCED: (1.0, 1.0)}


@dataclass
class DraftCall:
    tokens_fed: int  # tokens the draft model consumed in this call
    seconds: float


@dataclass
class RoundReport:
    """What the loop tells the policy after a round."""

    sources: list[str]  # source of each drafted position
    confidences: list[float | None]  # draft confidence per position (None: no distribution)
    num_accepted: int
    target_tokens: int  # tokens the verify call scored (0: no call)
    target_seconds: float
    draft_calls: list[DraftCall]
    round_seconds: float  # wall time of the whole round
    emitted_tokens: tuple[int, ...]
    # [emitted, vocab] or more rows: the target's distributions at the round's positions;
    # row j follows the text emitted before it (so it exists for every emitted token).
    target_probs: object = None


class Policy(Protocol):
    k_max: int

    def begin(self, target, drafter, context: list[int], max_new_tokens: int) -> None: ...

    def choose(self, options: dict[str, int], lag: int) -> tuple[str | None, int]: ...

    def consider(self, source: str, tokens: list[int]) -> None:
        """A lookup the drafter found this round (whether or not it is chosen)."""
        ...

    def extent(self, source: str, i: int, confidence: float) -> int: ...

    def observe(self, report: RoundReport) -> None: ...


class FixedK:
    """Always K drafts (fewer when the budget or the lookup is shorter). A lookup match
    is preferred to the draft model: the hybrid drafter's fixed-K behaviour."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k_max = k
        self._planned = 0

    def begin(self, target, drafter, context, max_new_tokens) -> None:
        pass

    def choose(self, options, lag):
        for source, available in sorted(options.items(), key=lambda kv: kv[0] == MODEL):
            if available > 0:
                self._planned = min(self.k_max, available)
                return source, self._planned
        return None, 0

    def consider(self, source, tokens) -> None:
        pass

    def extent(self, source, i, confidence):
        return self._planned

    def observe(self, report) -> None:
        pass


# ---------------------------------------------------------------------------
# The controller


class AdaptiveController:
    """Picks each round's source and draft length (0 ... k_max) to maximise expected
    tokens per second. One instance may serve many sequences: its cost and acceptance
    estimates carry over (the per-sequence state is reset by `begin`)."""

    def __init__(self, k_max: int = 8, *, decay: float = 0.9, idle_decay: float = 0.998,
                 priors: dict[str, tuple[float, float]] | None = None, calibrate: bool = True,
                 cost_cache: Path | None = None, clock=time.perf_counter):
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.decay, self.idle_decay = decay, idle_decay
        # Prior acceptance per source: a longer lookup match is a better guess. A
        # source that fails is tried again once its evidence has decayed (idle_decay
        # per round it sits out: several hundred rounds from one failure to a probe).
        self.priors = dict(DEFAULT_PRIORS, **(priors or {}))
        self.sources: dict[str, SourceModel] = {}
        self.costs = Costs()
        self.calibrate, self.cost_cache, self.clock = calibrate, cost_cache, clock
        self.calibrated = False
        self.calibration_seconds = 0.0
        self.typical_length = Ema(weight=0.3)  # tokens per finished sequence
        self._remaining = 0
        self._generated = 0
        self._round: dict = {}
        self._lookup: tuple[str, list[int]] | None = None  # this round's lookup
        self._shadow: tuple[str, list[int], int] | None = None  # a lookup followed without proposing it

    # -- per sequence -------------------------------------------------------

    def begin(self, target, drafter, context, max_new_tokens) -> None:
        # The last sequence's length says how long answers run, unless its token
        # budget cut it (a warm-up, a capped request): that one says nothing.
        if 0 < self._generated < self._remaining:
            self.typical_length.update(self._generated)
        self._remaining, self._generated = max_new_tokens, 0
        # What follows a text belongs to it: a lookup (shadowed or offered) or a round
        # left from the last sequence says nothing about this one's next token.
        self._round, self._lookup, self._shadow = {}, None, None
        if self.calibrate and not self.calibrated:
            t0 = self.clock()
            draft = getattr(drafter, "model_backend", None)
            self._load_or_measure(target, draft, context)
            self.calibration_seconds = self.clock() - t0
            self.calibrated = True

    def _load_or_measure(self, target, draft, context) -> None:
        costs = cached_or_measured(self.cost_cache, target, draft, context, self.k_max + 1, self.clock)
        self._seed(costs["target"], costs.get("draft_step"), costs.get("draft_token"), costs.get("draft_first"))

    def _seed(self, target: list[float], draft_step: float | None, draft_token: float | None,
              draft_first: float | None = None) -> None:
        self.costs.single.value = target[0]
        for n, seconds in enumerate(target[1:], start=2):
            self.costs.ratio(n)
            self.costs.shape[n - 1].value = seconds / target[0]
        if draft_step is not None:
            self.costs.draft_step.value = draft_step
        if draft_token is not None:
            self.costs.draft_token.value = draft_token
        if draft_first is not None:
            self.costs.draft_first.value = draft_first

    # -- before a round -----------------------------------------------------

    def choose(self, options, lag):
        ar_rate = 1.0 / self._seconds(0, None, 0)  # a plain target step
        best = (None, 0, ar_rate)
        for source, available in options.items():
            model = self._source(source)
            m, rate = self._best_length(model, source, min(available, self.k_max), lag)
            if m > 0 and rate > best[2]:
                best = (source, m, rate)
        source, m, rate = best
        limit = min(options.get(source, 0), self.k_max) if source else 0
        self._round = {"rate": rate, "reach": 1.0, "limit": limit}
        # Sources left out this round drift back towards their prior (probing).
        for name, model in self.sources.items():
            if name != source:
                for r in model.all_rates():
                    r.forget(self.idle_decay)
        return source, m

    def _best_length(self, model: SourceModel, source: str, available: int, lag: int) -> tuple[int, float]:
        best_m, best_rate, expected, reach = 0, 0.0, 1.0, 1.0
        for m in range(1, available + 1):
            reach *= model.at(m - 1).value
            expected += reach
            rate = expected / self._seconds(m, source, lag, expected)
            if rate > best_rate:
                best_m, best_rate = m, rate
        return best_m, best_rate

    def _seconds(self, m: int, source: str | None, lag: int, expected: float = 1.0) -> float:
        """Predicted wall time of a round drafting m tokens from source."""
        c = self.costs
        seconds = c.target_call(m + 1) + (c.overhead[m > 0].value or 0.0)
        if m and source == MODEL:
            seconds += c.drafting(m)
            # Feeding tokens the draft has not seen (its prompt prefill, or text made
            # during plain steps) is paid once and serves the rest of the sequence:
            # charge this round its share of the expected remaining tokens.
            horizon = max(expected, self._expected_remaining())
            seconds += c.catch_up(lag) * expected / horizon
        return max(seconds, 1e-9)

    def _expected_remaining(self) -> float:
        """Tokens this sequence is still expected to emit: what typical answers have
        left at this point, or, once this one has outrun them, as many as it has
        made so far (a long answer tends to keep going); never past the budget."""
        remaining = self._remaining - self._generated
        if self.typical_length.value is not None:
            expected = max(8.0, self.typical_length.value - self._generated, float(self._generated))
            remaining = min(remaining, expected)
        return max(1.0, remaining)

    def consider(self, source, tokens) -> None:
        self._lookup = (source, list(tokens))

    # -- during model drafting ---------------------------------------------

    def extent(self, source, i, confidence):
        r = self._round
        model = self._source(source)
        here = model.given_confidence(confidence).value
        draft_step = self.costs.draft_step.value or 0.0
        # Value of ending the round with m drafts (m >= i), costs already paid left out.
        best_m, best_value = i, -r["rate"] * self.costs.target_call(i + 1)
        gain, chain = 0.0, r["reach"]
        for m in range(i + 1, r["limit"] + 1):
            chain *= here if m == i + 1 else model.at(m - 1).value
            gain += chain
            cost = (m - 1 - i) * draft_step + self.costs.target_call(m + 1)
            value = gain - r["rate"] * cost
            if value > best_value:
                best_m, best_value = m, value
        if best_m > i:
            r["reach"] *= here
        return best_m

    # -- after a round ------------------------------------------------------

    def observe(self, report: RoundReport) -> None:
        c = self.costs
        m = sum(source != FORCED for source in report.sources)  # forced tokens add no drafting work
        if report.target_tokens:  # 0: the first token came from the prompt's prefill
            c.observe_target(report.target_tokens, report.target_seconds)
        draft_seconds = 0.0
        for i, call in enumerate(report.draft_calls):
            draft_seconds += call.seconds
            if call.tokens_fed > 2:  # catching up: what the extra tokens cost beyond a first call
                first = c.drafting(1)
                if first:
                    c.draft_token.update(max(0.0, call.seconds - first) / (call.tokens_fed - 1))
            else:
                (c.draft_step if i else c.draft_first).update(call.seconds)
        c.overhead[m > 0].update(max(0.0, report.round_seconds - report.target_seconds - draft_seconds))
        position: dict[str, int] = {}  # each source's own position: forced tokens may come between
        for i, (source, confidence) in enumerate(zip(report.sources, report.confidences)):
            if i > report.num_accepted:
                break  # not reached: an earlier draft was rejected
            accepted = i < report.num_accepted
            model = self._source(source)
            j = position[source] = position.get(source, -1) + 1
            model.at(j).update(accepted, self.decay)
            if confidence is not None:
                model.given_confidence(confidence).update(accepted, self.decay)
        self._shadow_lookup(report)
        self._lookup = None
        self._generated += len(report.emitted_tokens)

    def _shadow_lookup(self, report: RoundReport) -> None:
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
        proposed = any(map(is_lookup, report.sources))  # observe() scored it
        if proposed or report.target_probs is None:
            self._shadow = None
            return
        if self._shadow is None and self._lookup is not None:
            self._shadow = (*self._lookup, 0)
        if self._shadow is None:
            return
        source, tokens, i = self._shadow
        rates = self._source(source)
        for row, token in zip(report.target_probs, report.emitted_tokens):
            rates.at(i).update(float(row[tokens[i]]), self.decay)
            if token != tokens[i] or i + 1 == len(tokens):
                self._shadow = None
                return
            i += 1
        self._shadow = (source, tokens, i)

    def _source(self, source: str) -> SourceModel:
        if source not in self.sources:
            lookup = is_lookup(source)
            prior = self.priors.get(source, self.priors[ngram_source(3)] if lookup else (0.5, 0.5))
            self.sources[source] = SourceModel(prior, pooled=lookup)
        return self.sources[source]


def make_policy(k, k_max: int = 8, **kwargs) -> Policy:
    """`k` from the configuration: an int (fixed K) or "auto"."""
    if k == "auto":
        return AdaptiveController(k_max, **kwargs)
    return FixedK(int(k))

"""Online estimates the adaptive draft-length policy (control.py) decides from:
acceptance rates per draft source, position and confidence, and the cost model of
target and draft calls, all refreshed by every round."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    def __init__(self, value: float | None = None, weight: float = 0.2):
        self.value, self.weight = value, weight

    def update(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.weight * (x - self.value)


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
    refreshed by every plain step."""

    single: Ema = field(default_factory=Ema)  # a target call scoring 1 token
    shape: list[Ema] = field(default_factory=list)  # [n - 1]: cost of n tokens / cost of 1
    # A round's first draft call runs just after a target call that pushed the draft's
    # weights out of the CPU caches, so it costs more than the calls that follow it
    # (about twice, for a 0.5B draft beside a 1.5B target here).
    draft_first: Ema = field(default_factory=Ema)  # a round's first draft call, feeding 1-2 tokens
    draft_step: Ema = field(default_factory=Ema)  # each later draft call of the round
    draft_token: Ema = field(default_factory=Ema)  # each extra token fed in one call
    overhead: dict[bool, Ema] = field(default_factory=lambda: {False: Ema(0.0), True: Ema(0.0)})

    def target_call(self, n: int) -> float:
        return (self.single.value or 0.0) * self.ratio(n)

    def ratio(self, n: int) -> float:
        if n == 1:
            return 1.0
        while len(self.shape) < n:
            self.shape.append(Ema())
        known = self.shape[n - 1].value
        if known is not None:
            return known
        # Unmeasured size: interpolate linearly between the nearest measured sizes
        # (or extrapolate from the last two); unmeasured entirely: flat, the
        # optimistic guess that the first rounds then correct.
        measured = [(1, 1.0)] + [(i + 1, e.value) for i, e in enumerate(self.shape) if i and e.value is not None]
        below = [p for p in measured if p[0] < n]
        above = [p for p in measured if p[0] > n]
        if above:
            (n0, c0), (n1, c1) = below[-1], above[0]
            return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        if len(below) >= 2:
            (n0, c0), (n1, c1) = below[-2], below[-1]
            return c1 + max(0.0, (c1 - c0) / (n1 - n0)) * (n - n1)
        return 1.0

    def observe_target(self, n: int, seconds: float) -> None:
        if n == 1 or self.single.value is None:
            self.single.update(seconds / self.ratio(n))
        else:
            self.ratio(n)
            self.shape[n - 1].update(seconds / self.single.value)

    def drafting(self, m: int) -> float:
        """Draft time of a round that drafts m tokens (its first call cold)."""
        if m <= 0:
            return 0.0
        step = self.draft_step.value or 0.0
        first = self.draft_first.value if self.draft_first.value is not None else step
        return first + (m - 1) * step

    def catch_up(self, lag: int) -> float:
        """Extra draft time to feed `lag` tokens it has not seen (beyond the usual 1-2)."""
        return max(0, lag - 2) * (self.draft_token.value or 0.0)

"""Seconds of a model call by its size, on this machine, now: the cost curve that the
planner prices its rounds with (estimates.Prices holds one for the target and one for
the draft model) and the server sizes its default slot count from
(calibrate.slots_that_pay). Its prior is a calibration's timings (calibrate.py); every
call observed rescales it, so a busy neighbour or a slower clock moves it within a
few calls."""

from __future__ import annotations

import bisect
import statistics
from collections import deque

from .config import BAND_QUORUM, PLANNER, SPIKE, PlannerConfig


def interpolated(points: list[tuple[int, float]], x: int) -> float:
    """The value at size x from (size, value) points sorted by size: linear between
    the nearest two, and beyond either end on at the slope of the last two (or flat
    with one point), never below zero."""
    if len(points) == 1:
        return points[0][1]
    i = min(max(1, bisect.bisect_left([p[0] for p in points], x)), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


class Curve:
    """Seconds of a model call by its size (tokens scored or fed): a prior, the
    calibration's timings interpolated between the sizes it measured, times how far
    the calls of this run have moved from it. Each call adds its ratio to the prior. A
    size is priced by the last `recent` ratios of its band (_band) where BAND_QUORUM
    of them are among the last `fresh` calls, else by the last `recent` calls of any
    size (a machine slows every size alike; a size not called lately would keep an old
    price); the numbers are config.py's. The price is their mean with each
    ratio held to SPIKE times their median: a call descheduled once moves it by a fraction, a
    neighbour that keeps taking the cores moves it fully within a few calls; and never
    below a smaller size's price. Without a calibration, the first call of each size
    becomes its prior."""

    def __init__(self, prior: dict[int, float] | None = None, config: PlannerConfig = PLANNER):
        self.config = config
        self.prior = sorted((prior or {}).items())
        self.learning = not self.prior  # no calibration: each size's first call becomes its prior
        self._ratios: dict[int, deque] = {}  # band -> (call number, ratio)
        self._all: deque = deque(maxlen=config.recent)
        self._prices: dict[int, float] = {}
        self._raws: dict[int, float] = {}  # before the running maximum
        self._calls = 0
        self._hidden = [0.0, 0.0]  # decayed counts: calls made during a target call (overlap), all calls

    def base(self, n: int) -> float:
        return interpolated(self.prior, n) if self.prior else 0.0

    def __call__(self, n: int) -> float:
        if n <= 0:
            return 0.0
        price = self._prices.get(n)
        if price is None:  # priced once between two calls observed: the planner asks many times a round
            # Never below a smaller call's price: scoring more tokens is never less work, and a
            # calibration's noise or two bands scaled apart would make a wider call look cheaper.
            # The raw price is linear between the prior's sizes and the bands' edges, so its
            # running maximum is its maximum at those below n.
            below = [k for k, _ in self.prior if k < n] + [k for k in EDGES if k < n]
            price = self._prices[n] = max([self._raw(n)] + [self._raw(k) for k in below])
        return price

    def _raw(self, n: int) -> float:
        raw = self._raws.get(n)
        if raw is None:
            band = [r for i, r in self._ratios.get(_band(n), ()) if i > self._calls - self.config.fresh]
            raw = self._raws[n] = self.base(n) * _scale(band if len(band) >= BAND_QUORUM else self._all)
        return raw

    @property
    def hidden(self) -> float:
        """The share of its recent calls made during a target's call, which cost the
        round nothing beside it (decoding/overlap.py; 0 where nothing overlaps)."""
        return self._hidden[0] / self._hidden[1] if self._hidden[1] else 0.0

    def observe(self, n: int, seconds: float, hidden: bool = False) -> None:
        if n <= 0:
            return
        decay = self.config.hidden_decay
        self._hidden = [self._hidden[0] * decay + hidden, self._hidden[1] * decay + 1]
        self._prices.clear()
        self._raws.clear()
        self._calls += 1
        if self.learning and n not in dict(self.prior) or self.base(n) <= 0:
            self.prior = sorted((dict(self.prior) | {n: seconds}).items())
        ratio = seconds / self.base(n)
        self._ratios.setdefault(_band(n), deque(maxlen=self.config.recent)).append((self._calls, ratio))
        self._all.append(ratio)


def round_seconds(target: float, drafting: float, hidden: float) -> float:
    """Seconds of a round whose target call takes `target` and whose drafting takes
    `drafting`, when a share `hidden` of the drafting runs during a target call
    (decoding/overlap.py): what runs meanwhile costs nothing up to the call's length.
    Nothing hidden: their sum; all of it: the longer of the two (PEARL's round)."""
    return target + drafting - min(hidden * drafting, target)


def _scale(ratios) -> float:
    if not ratios:
        return 1.0
    cap = SPIKE * statistics.median(ratios)
    return sum(min(r, cap) for r in ratios) / len(ratios)


def _band(n: int) -> int:
    # Bands of 1, 2, 3-4, 5-8, 9-16 and 17+ tokens. EDGES (and docs/architecture.md)
    # were written for 2-4; kept as they are: a plan moves if either does.
    return (n - 1).bit_length() if n <= 16 else 5


EDGES = (1, 2, 4, 5, 8, 9, 16, 17)  # the bands' first and last sizes

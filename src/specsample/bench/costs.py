"""The analytic speedup model of Chen et al. (2023), fed with measured costs.

With per-draft-token acceptance rate alpha, and acceptances assumed independent
and identically distributed (real acceptances are correlated: easy stretches
accept runs), a round of K drafts yields on average

    E(K) = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)

tokens, and costs K draft steps plus one target call that scores K+1 tokens.
Autoregressive decoding costs one 1-token target call per token, timed as plain
decoding runs (back to back): a 1-token call right after a draft step is slower,
its weights pushed out of the CPU caches by the draft's, so that call would make a
baseline that flatters speculation. Likewise a round's first draft step runs cold,
right after the target's call (`draft_first`), and its later ones back to back
(`draft_step`): the names policy/calibrate.py gives them, whose measurement the cost
curve takes them from.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..policy.calibrate import measure, repeated, timed_call


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E(K) above; alpha = 1 gives K + 1 (every draft accepted, plus the bonus)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, draft_first: float, target_cost: list[float],
                      plain: float | None = None, draft_step: float | None = None) -> float:
    """Speedup over autoregressive decoding, from the cost curve.

    target_cost[n - 1] is the time of one target call scoring n tokens, after a draft
    step; draft_first the time of a 1-token draft call right after a target call (0
    for a free drafter), draft_step that of the calls that follow it, back to back
    (default: the same); plain the time of a 1-token target call in plain decoding
    (default target_cost[0]).
    """
    later = draft_first if draft_step is None else draft_step
    drafting = draft_first + (k - 1) * later if k else 0.0
    seconds_per_token = (drafting + target_cost[k]) / expected_tokens_per_round(alpha, k)
    return (target_cost[0] if plain is None else plain) / seconds_per_token


def break_even_alpha(k: int, draft_first: float, target_cost: list[float], plain: float | None = None,
                     draft_step: float | None = None) -> float | None:
    """The acceptance rate at which K = k drafts a round decode exactly as fast as plain
    decoding, by the model above: a drafter accepted more often than this pays at this
    K. None when even a drafter accepted every time would not (the K + 1 tokens of a
    round cost more than K + 1 plain steps)."""
    if predicted_speedup(1.0, k, draft_first, target_cost, plain, draft_step) <= 1:
        return None
    low, high = 0.0, 1.0  # the speedup grows with alpha: bisect for where it crosses 1
    for _ in range(50):
        middle = (low + high) / 2
        if predicted_speedup(middle, k, draft_first, target_cost, plain, draft_step) < 1:
            low = middle
        else:
            high = middle
    return high


@dataclass
class Prediction:
    k: int
    alpha: float
    expected_tokens: float
    speedup: float


def predict(alphas: dict[int, float], draft_first: float, target_cost: list[float], plain: float | None = None,
            draft_step: float | None = None) -> list[Prediction]:
    """A prediction for every K with a measured acceptance rate and a measured cost."""
    out = []
    for k, alpha in sorted(alphas.items()):
        if alpha is None or k >= len(target_cost):
            continue
        speedup = predicted_speedup(alpha, k, draft_first, target_cost, plain, draft_step)
        out.append(Prediction(k, alpha, expected_tokens_per_round(alpha, k), speedup))
    return out


def recommend(predictions: list[Prediction]) -> Prediction | None:
    """The K with the best predicted speedup, or None when no K beats autoregressive."""
    best = max(predictions, key=lambda p: p.speedup, default=None)
    return best if best is not None and best.speedup > 1 else None


@dataclass
class CostCurve:
    context_tokens: int  # cache length the calls were timed at
    draft_first: float | None  # seconds of a draft step right after a target call; None without a draft model
    target_cost: list[float]  # [n - 1]: seconds of one target call scoring n tokens, right after a draft step
    reps: int  # timed target calls per size, after a draft step each
    prefill_seconds: float = 0.0  # the target's prefill of the context, once
    alternating: bool = True  # target calls timed after a draft step each, as in a real round
    plain: float | None = None  # seconds of a 1-token target call back to back, as plain decoding runs
    draft_step: float | None = None  # seconds of a draft step right after another one

    def ratio(self, n: int) -> float:
        """Cost of a target call scoring n tokens over a 1-token call, both after a draft step."""
        return self.target_cost[n - 1] / self.target_cost[0]


def measure_cost_curve(target, draft, context: list[int], max_tokens: int, reps: int = 5) -> CostCurve:
    """The costs of plain decoding and of a round, on top of `context`.

    Plain decoding's 1-token call and the draft's steps (back to back, and right after
    a target call) are calibrate.measure's: the one measurement of call costs, which
    -k auto's prices start from too. What it leaves is timed here: target calls of
    1..max_tokens tokens as a round makes them, each right after a draft step (a
    target measured alone would find its weights still in cache from its own previous
    call, which a round's target call never does); the median of `reps` calls a size,
    after a warm-up pair. Both models are rolled back to empty after."""
    t0 = time.perf_counter()
    target_base = _prefill(target, context)
    prefill_seconds = time.perf_counter() - t0
    # On top of the prefilled context; 4 tokens: its draft steps take the sample's first
    # few. It leaves the draft empty.
    measured = measure(target, draft, context, 4)
    draft_base = _prefill(draft, context) if draft is not None else 0
    target_cost = []
    for n in range(1, max_tokens + 1):
        times = []
        for i in range(reps + 1):
            if draft is not None:
                timed_call(draft, context[-1:], draft_base)
            elapsed = timed_call(target, repeated(context, n), target_base)
            times += [elapsed] if i else []
        target_cost.append(statistics.median(times))
    for backend in (target, draft):
        if backend is not None:
            backend.rollback(0)
    return CostCurve(len(context), measured.get("draft_first"), target_cost, reps, prefill_seconds,
                     plain=measured["target"][0], draft_step=measured.get("draft_step"))


def _prefill(backend, context: list[int]) -> int:
    backend.rollback(0)
    backend.score(context, num_logits=1)
    return backend.length

"""The analytic speedup model of Chen et al. (2023), fed with measured costs.

With per-draft-token acceptance rate alpha, and acceptances assumed independent
and identically distributed (real acceptances are correlated: easy stretches
accept runs), a round of K drafts yields on average

    E(K) = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)

tokens, and costs K draft steps plus one target call that scores K+1 tokens.
Autoregressive decoding costs one 1-token target call per token, timed as plain
decoding runs (back to back): a 1-token call right after a draft step is slower,
its weights pushed out of the CPU caches by the draft's, and taking that as the
baseline made the prediction optimistic. Likewise a round's first draft step runs
cold, after the target's call, and its later ones warm.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..policy.calibrate import timed_call


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E(K) above; alpha = 1 gives K + 1 (every draft accepted, plus the bonus)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, draft_step: float, target_cost: list[float],
                      plain: float | None = None, draft_warm: float | None = None) -> float:
    """Speedup over autoregressive decoding, from the cost curve.

    target_cost[n - 1] is the time of one target call scoring n tokens, after a draft
    step; draft_step the time of a 1-token draft call after a target call (0 for a
    free drafter), draft_warm that of the calls that follow it (default: the same);
    plain the time of a 1-token target call in plain decoding (default target_cost[0]).
    """
    warm = draft_step if draft_warm is None else draft_warm
    drafting = draft_step + (k - 1) * warm if k else 0.0
    seconds_per_token = (drafting + target_cost[k]) / expected_tokens_per_round(alpha, k)
    return (target_cost[0] if plain is None else plain) / seconds_per_token


def break_even_alpha(k: int, draft_step: float, target_cost: list[float], plain: float | None = None,
                     draft_warm: float | None = None) -> float | None:
    """The acceptance rate at which K = k drafts a round decode exactly as fast as plain
    decoding, by the model above: a drafter accepted more often than this pays at this
    K. None when even a drafter accepted every time would not (the K + 1 tokens of a
    round cost more than K + 1 plain steps)."""
    if predicted_speedup(1.0, k, draft_step, target_cost, plain, draft_warm) <= 1:
        return None
    low, high = 0.0, 1.0  # the speedup grows with alpha: bisect for where it crosses 1
    for _ in range(50):
        middle = (low + high) / 2
        if predicted_speedup(middle, k, draft_step, target_cost, plain, draft_warm) < 1:
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


def predict(alphas: dict[int, float], draft_step: float, target_cost: list[float], plain: float | None = None,
            draft_warm: float | None = None) -> list[Prediction]:
    """A prediction for every K with a measured acceptance rate and a measured cost."""
    out = []
    for k, alpha in sorted(alphas.items()):
        if alpha is None or k >= len(target_cost):
            continue
        speedup = predicted_speedup(alpha, k, draft_step, target_cost, plain, draft_warm)
        out.append(Prediction(k, alpha, expected_tokens_per_round(alpha, k), speedup))
    return out


def recommend(predictions: list[Prediction]) -> Prediction | None:
    """The K with the best predicted speedup, or None when no K beats autoregressive."""
    best = max(predictions, key=lambda p: p.speedup, default=None)
    return best if best is not None and best.speedup > 1 else None


@dataclass
class CostCurve:
    context_tokens: int  # cache length the calls were timed at
    draft_step: float | None  # seconds; None without a draft model
    target_cost: list[float]  # [n - 1]: seconds of one target call scoring n tokens
    reps: int
    prefill_seconds: float = 0.0  # the target's prefill of the context, once
    alternating: bool = True  # draft and target calls interleaved, as in a real round
    plain: float | None = None  # seconds of a 1-token target call back to back, as plain decoding runs
    draft_warm: float | None = None  # seconds of a draft step right after another one

    def ratio(self, n: int) -> float:
        """Cost of a target call scoring n tokens over a 1-token call, both after a draft step."""
        return self.target_cost[n - 1] / self.target_cost[0]


def measure_cost_curve(target, draft, context: list[int], max_tokens: int, reps: int = 5) -> CostCurve:
    """Median time of target calls scoring 1..max_tokens tokens, and of a 1-token
    draft call, each on top of `context` and rolled back after.

    Both models stay loaded and take turns, one draft step then one target call, as
    in a speculative round: measured alone, each model would find its weights still
    in cache from its own previous call, which a round's first draft step and its
    target call never do. The first pair of calls at each size is a warm-up. Then
    1-token target calls back to back (plain decoding) and draft steps back to back
    (a round's later steps)."""
    t0 = time.perf_counter()
    target_base = _prefill(target, context)
    prefill_seconds = time.perf_counter() - t0
    draft_base = _prefill(draft, context) if draft is not None else 0
    target_cost, draft_times = [], []
    for n in range(1, max_tokens + 1):
        tokens = (context * (n // len(context) + 1))[-n:]  # real tokens; any will do
        times = []
        for i in range(reps + 1):
            if draft is not None:
                elapsed = timed_call(draft, context[-1:], draft_base)
                draft_times += [elapsed] if i else []
            elapsed = timed_call(target, tokens, target_base)
            times += [elapsed] if i else []
        target_cost.append(statistics.median(times))
    plain = statistics.median([timed_call(target, context[-1:], target_base) for _ in range(reps + 1)][1:])
    draft_warm = None
    if draft is not None:
        draft_warm = statistics.median([timed_call(draft, context[-1:], draft_base) for _ in range(reps + 1)][1:])
    for backend in (target, draft):
        if backend is not None:
            backend.rollback(0)
    draft_step = statistics.median(draft_times) if draft_times else None
    return CostCurve(len(context), draft_step, target_cost, reps, prefill_seconds, plain=plain, draft_warm=draft_warm)


def _prefill(backend, context: list[int]) -> int:
    backend.rollback(0)
    backend.score(context, num_logits=1)
    return backend.length

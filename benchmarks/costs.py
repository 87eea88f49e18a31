"""The analytic speedup model of Chen et al. (2023), fed with measured costs.

With per-draft-token acceptance rate alpha, and acceptances assumed independent
and identically distributed (real acceptances are correlated: easy stretches
accept runs), a round of K drafts yields on average

    E(K) = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)

tokens, and costs K draft steps plus one target call that scores K+1 tokens.
Every cost is policy/calibrate.measure's, the one measurement of call costs, which
-k auto's prices start from too, each call timed as decoding makes it: autoregressive
decoding's 1-token target call back to back (after a draft step it would be slower,
its weights pushed out of the CPU caches by the draft's, a baseline that flatters
speculation); a round's target call of K + 1 tokens right after a draft step (timed
back to back it would find its weights still cached, and a round would look cheaper
than it is); a round's first draft step right after the target's call (`draft_first`),
its later ones back to back (`draft_step`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specsample.bench.stats import ModeSummary
from specsample.bench.tables import cell, markdown_table
from specsample.policy.calibrate import measure


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

    target_cost[n - 1] is the time of one target call scoring n tokens (n > 1: after a
    draft step, as in a round); draft_first the time of a 1-token draft call right after a target call (0
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
    # [n - 1]: seconds of one target call scoring n tokens as decoding makes it (calibrate.measure): 1 token back to
    # back (a plain step), more right after a draft step (a round's verify call) where there is a draft model
    target_cost: list[float]
    reps: int  # timed target calls per size
    prefill_seconds: float = 0.0  # the target's prefill of the context, once
    draft_step: float | None = None  # seconds of a draft step right after another one

    @property
    def plain(self) -> float:
        """Seconds of a 1-token target call back to back, as plain decoding runs."""
        return self.target_cost[0]

    def ratio(self, n: int) -> float:
        """Cost of a target call scoring n tokens over a plain step's."""
        return self.target_cost[n - 1] / self.target_cost[0]


def measure_cost_curve(target, draft, context: list[int], max_tokens: int, reps: int = 5) -> CostCurve:
    """The costs of plain decoding and of a round, on top of `context`: calibrate.measure's,
    the one measurement of call costs, which -k auto's prices start from too, with
    `reps` calls a size. Both models are rolled back to empty after."""
    t0 = time.perf_counter()
    target.rollback(0)
    target.score(context, num_logits=1)
    prefill_seconds = time.perf_counter() - t0
    measured = measure(target, draft, context, max_tokens, reps=reps)
    for backend in (target, draft):
        if backend is not None:
            backend.rollback(0)
    return CostCurve(len(context), measured.get("draft_first"), measured["target"], reps, prefill_seconds,
                     draft_step=measured.get("draft_step"))


def cost_table(curve: CostCurve) -> str:
    """The cost curve; with a draft model's steps timed, the acceptance rate at which
    K = n - 1 drafts break even (costs.break_even_alpha)."""
    drafts = curve.draft_first is not None
    rows = [["tokens scored in one target call", "median ms", "x a plain step"]
            + (["break-even acceptance at K = n - 1"] if drafts else [])]
    for n, t in enumerate(curve.target_cost, start=1):
        row = ["1 (a plain step, back to back)" if n == 1 else str(n), f"{1000 * t:.1f}", f"{curve.ratio(n):.2f}"]
        if drafts:
            alpha = break_even_alpha(n - 1, curve.draft_first, curve.target_cost, curve.plain,
                                     curve.draft_step) if n > 1 else None
            row.append("" if n == 1 else "never pays" if alpha is None else f"{alpha:.2f}")
        rows.append(row)
    blank = [""] if drafts else []
    if curve.draft_first is not None:
        rows.append(["draft step after a target call (a round's first)", f"{1000 * curve.draft_first:.1f}", ""] + blank)
    if curve.draft_step is not None:
        rows.append(["draft step after a draft step", f"{1000 * curve.draft_step:.1f}", ""] + blank)
    return markdown_table(rows)


def predictions_by_group(summaries: list[ModeSummary], curve: CostCurve | None) -> dict[tuple, list[Prediction]]:
    """Predictions per (task, setting) from the acceptance rate measured at each K."""
    if curve is None or curve.draft_first is None:
        return {}
    groups: dict[tuple, dict[int, float]] = {}
    for s in summaries:
        if s.family == "spec" and s.acceptance_rate is not None:
            groups.setdefault((s.task, s.setting), {})[s.k] = s.acceptance_rate
    return {key: predict(alphas, curve.draft_first, curve.target_cost, curve.plain, curve.draft_step)
            for key, alphas in groups.items()}


def prediction_section(summaries: list[ModeSummary], predictions: dict[tuple, list[Prediction]]) -> str:
    # The prediction leaves out prefill, so it is compared with the decode speedup.
    measured = {(s.task, s.setting, s.k): s.decode_speedup for s in summaries if s.family == "spec"}
    parts = []
    for (task, setting), preds in predictions.items():
        rows = [["K", "alpha", "E(K) tokens/round", "predicted speedup", "measured decode speedup", "measured / predicted"]]
        for p in preds:
            m = measured.get((task, setting, p.k))
            rows.append([str(p.k), f"{p.alpha:.2f}", f"{p.expected_tokens:.2f}", f"{p.speedup:.2f}", cell(m, ".2f"),
                         cell(m / p.speedup if m is not None else None, ".2f")])
        parts.append(f"**{task}, {setting}**\n\n{markdown_table(rows)}\n\n{_verdict(preds, measured, task, setting)}")
    return "\n\n".join(parts)


def _verdict(preds: list[Prediction], measured: dict, task: str, setting: str) -> str:
    best = recommend(preds)
    if best is None:
        line = "The model predicts that no K beats autoregressive decoding on this hardware."
    else:
        line = f"The model recommends K = {best.k} (predicted speedup {best.speedup:.2f})."
    wins = [(k, v) for (t, st, k), v in measured.items() if t == task and st == setting and v is not None and v > 1]
    if not wins:
        line += " Measured: no K beat autoregressive decoding."
    else:
        k, v = max(wins, key=lambda item: item[1])
        line += f" Measured: best K = {k} (speedup {v:.2f})."
    return line


PREDICTION_NOTE = (
    "E(K) = (1 - alpha^(K+1)) / (1 - alpha) tokens per round, assuming draft tokens are accepted independently with "
    "the measured per-token rate alpha (real acceptances are correlated); predicted time per token = (first draft "
    "step + (K - 1) later draft steps + target cost(K+1)) / E(K); predicted speedup = the plain-decoding 1-token call "
    "/ that, from the cost curve above. The prediction ignores prefill and loop overheads, so it is set against the "
    "measured decode speedup."
)


def cost_section(curve: CostCurve) -> list[str]:
    """summary.md's cost curve: the table, how it was timed, and what a call of several
    tokens costs against one (why speculation pays on one encoding and not another)."""
    said = ""
    if len(curve.target_cost) > 1:
        n = len(curve.target_cost)
        said = f" A call scoring {n} tokens costs {curve.ratio(n):.2f}x a plain step here."
    return ["## Cost curve", f"Median of {curve.reps} calls after a warm-up, at a cache of {curve.context_tokens} "
            "tokens, each timed as decoding makes it (policy/calibrate.measure, which -k auto's prices start from "
            "too): 1-token target calls back to back, as plain decoding runs; target calls of 2 tokens and more "
            "right after a draft step, as in a speculative round; a draft step right after a target call (a "
            "round's first) and back to back (its later ones)." + said + " Drafting pays where scoring several tokens costs "
            "little more than one (memory-bound calls); where every extra token adds its own arithmetic "
            "(compute-bound), the drafts' time is not won back.", cost_table(curve)]

"""A short measurement of call costs, to warm-start the adaptive controller.

Target: one call scoring n tokens for n = 1 .. max_tokens, on top of the real context
(rolled back after each). Draft: a few 1-token steps and one 16-token call on a short
context (the per-token cost of catching up on unseen text). One timed call per size:
the controller keeps refining every estimate from real rounds.
"""

from __future__ import annotations

import statistics
import time


def measure(target, draft, context: list[int], max_tokens: int, clock=time.perf_counter) -> dict:
    base = target.length
    sample = (context * (max_tokens // max(1, len(context)) + 1))[-max_tokens:]
    _timed(target, sample[:1], clock)  # warm-up: first calls pay one-off costs
    target.rollback(base)
    costs = []
    for n in range(1, max_tokens + 1):
        costs.append(_timed(target, sample[:n], clock))
        target.rollback(base)
    out = {"target": costs}
    if draft is not None:
        draft.rollback(0)
        steps = [_timed(draft, [t], clock) for t in sample[:4]][1:]
        out["draft_step"] = statistics.median(steps)
        batch = (sample * 16)[:16]
        out["draft_token"] = max(0.0, (_timed(draft, batch, clock, num_logits=1) - out["draft_step"]) / (len(batch) - 1))
        draft.rollback(0)
    return out


def _timed(backend, tokens: list[int], clock, num_logits: int | None = None) -> float:
    t0 = clock()
    backend.score(tokens, num_logits=num_logits or len(tokens))
    return clock() - t0

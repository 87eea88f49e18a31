"""A short measurement of call costs, to warm-start the adaptive controller, cached
per machine, engine, model file and thread count.

Target: one call scoring n tokens for n = 1 .. max_tokens, on top of the real context
(rolled back after each). Draft: a few 1-token steps and one 16-token call on a short
context (the per-token cost of catching up on unseen text). One timed call per size:
the controller keeps refining every estimate from real rounds.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .files import read_cached_json, write_cached_json
from .machine import fingerprint


def measure(target, draft, context: list[int], max_tokens: int, clock=time.perf_counter) -> dict:
    base = target.length
    sample = (context * (max_tokens // max(1, len(context)) + 1))[-max_tokens:]
    timed_call(target, sample[:1], base, clock)  # warm-up: first calls pay one-off costs
    out = {"target": [timed_call(target, sample[:n], base, clock) for n in range(1, max_tokens + 1)]}
    if draft is not None:
        draft.rollback(0)
        draft.score(sample[:1], num_logits=1)
        draft_base = draft.length
        steps = [timed_call(draft, [t], draft_base, clock) for t in sample[:4]][1:]
        out["draft_step"] = statistics.median(steps)
        batch = (sample * 16)[:16]
        seconds = timed_call(draft, batch, draft_base, clock, num_logits=1)
        out["draft_token"] = max(0.0, (seconds - out["draft_step"]) / (len(batch) - 1))
        draft.rollback(0)
    return out


def timed_call(backend, tokens: list[int], base: int, clock=time.perf_counter, num_logits: int | None = None) -> float:
    """Seconds of one call scoring `tokens` on top of `base` cached tokens, rolled back after."""
    t0 = clock()
    backend.score(tokens, num_logits=num_logits or len(tokens))
    elapsed = clock() - t0
    backend.rollback(base)
    return elapsed


def cached_or_measured(cache: Path | None, target, draft, context: list[int], max_tokens: int,
                       clock=time.perf_counter) -> dict:
    """The costs cached for this machine and pair when they cover calls of up to
    max_tokens, else measured now (and cached when `cache` is a path)."""
    cached = read_cached_json(cache)
    if isinstance(cached, dict) and len(cached.get("target", ())) >= max_tokens:
        return cached
    measured = measure(target, draft, context, max_tokens, clock=clock)
    write_cached_json(cache, measured)
    return measured


def cost_cache_path(cache_root: Path, target, draft) -> Path | None:
    """One file per (machine, target, draft, threads); None when a model has no stable
    identity to key on."""
    keys = [getattr(b, "cost_key", None) for b in (target, draft) if b is not None]
    if not keys or any(k is None for k in keys):
        return None
    name = "__".join([fingerprint()] + keys).replace("/", "_").replace(" ", "_")
    return cache_root / "costs" / f"{name}.json"

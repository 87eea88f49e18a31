"""A short measurement of call costs, to warm-start the adaptive controller, cached
per machine, engine, model file and thread count.

Target: one call scoring n tokens for n = 1 .. max_tokens, on top of the real context
(rolled back after each). Draft: a few 1-token steps in a row, a few right after a
target call (as a round's first draft call runs, with its weights pushed out of the
CPU caches), and one 16-token call on a short context (the per-token cost of catching
up on unseen text). One timed call per size: the controller keeps refining every
estimate from real rounds.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path

from .files import read_cached_json, write_cached_json
from .machine import fingerprint

log = logging.getLogger(__name__)


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
        firsts = []
        for t in sample[:3]:
            timed_call(target, sample[:1], base, clock)
            firsts.append(timed_call(draft, [t], draft_base, clock))
        out["draft_first"] = statistics.median(firsts)
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
    max_tokens, else measured now (and cached when `cache` is a path). A cached entry
    that cannot be a measurement (hand-edited, or written by a broken run) is measured
    again, with one line saying so."""
    cached = read_cached_json(cache)
    if cached is not None:
        problem = cache_problem(cached, max_tokens, draft is not None)
        if problem is None:
            return cached
        if problem != STALE:
            log.warning("specsample: the cost cache %s %s; measuring the costs again", cache, problem)
    measured = measure(target, draft, context, max_tokens, clock=clock)
    write_cached_json(cache, measured)
    return measured


DRAFT_COSTS = {"draft_step", "draft_first", "draft_token"}
STALE = "does not cover this use"  # a valid file that calls for a new measurement without a word


def cache_problem(cached, max_tokens: int, with_draft: bool) -> str | None:
    """Why a cost cache's contents cannot be used as they are, or None."""
    if not isinstance(cached, dict) or not isinstance(cached.get("target"), list):
        return "holds no list of target call costs"
    if not all(_seconds(x) for x in cached["target"]):
        return "holds a target call cost that is not a positive number of seconds"
    for key in sorted(DRAFT_COSTS):
        # Catching up can cost nothing beyond a call: only draft_token may be 0.
        if key in cached and not _seconds(cached[key], zero=key == "draft_token"):
            return f"holds a {key} cost that is not a positive number of seconds"
    # Files written before the cold first draft call was measured lack "draft_first".
    if len(cached["target"]) < max_tokens or with_draft and not DRAFT_COSTS <= cached.keys():
        return STALE
    return None


def _seconds(value, zero: bool = False) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and (value > 0 or zero and value == 0)


def cost_cache_path(cache_root: Path, target, draft) -> Path | None:
    """One file per (machine, target, draft, threads); None when a model has no stable
    identity to key on."""
    keys = [b.cost_key for b in (target, draft) if b is not None]
    if not keys or any(k is None for k in keys):
        return None
    name = "__".join([fingerprint()] + keys).replace("/", "_").replace(" ", "_")
    return cache_root / "costs" / f"{name}.json"

"""A short measurement of call costs, the priors of the planner's prices, cached
per machine, engine, model file and thread count.

Every call is timed as it runs in decoding (measure): a plain step (1 target token)
back to back with the last one; a verify call (n = 2 .. max_tokens tokens, on top of
the real context, rolled back after each) right after a draft step, as a round makes
it, when there is a draft model (the draft's weights have then pushed the target's out
of the CPU caches); and, where several sequences are decoded together, a few of the
larger calls their batches make (wide_sizes; the cost of a call is taken to follow the
tokens it scores, whoever they belong to), timed the same way. A cache measured for
fewer sequences is extended with the sizes it lacks. Draft: a few 1-token steps in a
row, a few right after a target call (as a round's first draft call runs, with its
weights pushed out of the CPU caches), and its reading of unseen text in calls of
read_chunk and read_long tokens on a short context (a catch-up chunk, a prompt). Each
target size is the median of `reps` timed calls (the numbers are config.CALIBRATION's),
after a warm-up of both a 1-token and a many-token call (llama.cpp runs 1 token and
more on different kernels, and the first call of each pays one-off costs). These are
the planner's priors only: every call of a run moves its prices (curve.Curve). The
research bench's cost curve (benchmarks/costs.py) is this measurement too.

What is built from a measurement lives here too: the planner's priors
(measured_prices) and the server's default slot count (slots_that_pay). The policy
itself is made in make.py.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path

from .config import CALIBRATION, PLANNER, PlannerConfig
from .curve import Curve
from .estimates import Prices, own_work
from ..files import read_cached_json, write_cached_json
from ..machine import fingerprint

log = logging.getLogger(__name__)


def wide_sizes(max_tokens: int, parallel: int) -> list[int]:
    """The call sizes past max_tokens to time for `parallel` sequences in one call, each
    scoring up to max_tokens: a ladder of steps of 1.33-1.5x (8, 12, 16, 24, 32, 48, ...)
    up to parallel * max_tokens, that size itself only where the ladder's last step
    falls short of it by more than CALIBRATION.wide_slack (the rest is interpolated)."""
    top = parallel * max_tokens
    ladder = [size for power in range(3, 16) for size in (1 << power, 3 << (power - 1))]
    sizes = [n for n in ladder if max_tokens < n <= top]
    if top > max_tokens and (not sizes or top > CALIBRATION.wide_slack * sizes[-1]):
        sizes.append(top)
    return sizes


REPS = CALIBRATION.reps  # timed calls per size; the median is kept
# The draft's reading of unread text, timed at a chunk and at a prompt's length: its
# per-token cost falls as the calls grow, so a 16-token call alone overprices a prompt.
READ_CHUNK, READ_LONG = CALIBRATION.read_chunk, CALIBRATION.read_long


def measure(target, draft, context: list[int], max_tokens: int, clock=time.perf_counter,
            wide: list[int] = (), reps: int = REPS) -> dict:
    """Call costs on top of the target's cached context, the one measurement of them
    (the planner's priors; the research bench's cost curve, benchmarks/costs.py).

    Each cost is timed as the call runs in decoding. A plain step (1 token) runs back
    to back with the last one. A verify call (2 tokens and more, `wide` too) runs right
    after the draft's steps, whose weights have pushed the target's out of the CPU
    caches: with a draft model each is timed right after a draft step (timed alone it
    would find its weights still cached by its own previous call, and a round would
    look cheaper than it is); without one (lookup drafts cost no call) back to back. A
    round's first draft step runs right after the target's call (draft_first), its
    later ones back to back (draft_step). Each size: the median of `reps` calls."""
    base = target.length
    sample = repeated(context, max([max_tokens, *wide]))
    step = after_draft(draft, sample, clock)
    warm_up(target, sample, max_tokens, base, clock)
    out = {"target": [median_call(target, sample[:n], base, clock, step if n > 1 else None, reps)
                      for n in range(1, max_tokens + 1)], "reps": reps, "verify_after_draft": draft is not None}
    if wide:
        out["target_wide"] = measure_wide(target, sample, wide, clock, step, reps)
    if draft is not None:
        draft_base = draft.length
        steps = [timed_call(draft, [t], draft_base, clock) for t in sample[:reps + 1]][1:]  # the first is cold
        out["draft_step"] = statistics.median(steps)
        firsts = []
        for t in sample[:reps]:
            timed_call(target, sample[:1], base, clock)
            firsts.append(timed_call(draft, [t], draft_base, clock))
        out["draft_first"] = statistics.median(firsts)
        reads = {n: statistics.median(timed_call(draft, repeated(sample, n), draft_base, clock, num_logits=1)
                                      for _ in range(reps)) for n in (READ_CHUNK, READ_LONG)}
        out["draft_token"] = max(0.0, (reads[READ_CHUNK] - out["draft_step"]) / (READ_CHUNK - 1))
        out["draft_long"] = reads[READ_LONG]
        draft.rollback(0)
    return out


def measure_wide(target, sample: list[int], sizes: list[int], clock=time.perf_counter, step=None,
                 reps: int = REPS) -> dict[str, float]:
    """{str(n): seconds of a call scoring n tokens} (string keys: as JSON stores them),
    each right after step() (a draft step: measure's verify calls) when given."""
    base = target.length
    sample = repeated(sample, max(sizes))
    warm_up(target, sample, min(sizes), base, clock)  # as measure's: a cache is extended on a cold engine
    return {str(n): median_call(target, sample[:n], base, clock, step, reps) for n in sizes}


def after_draft(draft, sample: list[int], clock):
    """What runs before each timed verify call: a draft step (the draft holding
    sample[:1], untimed), or None without a draft model."""
    if draft is None:
        return None
    draft.rollback(0)
    draft.score(sample[:1], num_logits=1)
    base = draft.length
    return lambda: timed_call(draft, sample[:1], base, clock)


def warm_up(target, sample: list[int], many: int, base: int, clock) -> None:
    """A 1-token and a `many`-token call, untimed: each kernel path's first call."""
    for n in sorted({1, many}):
        timed_call(target, sample[:n], base, clock)


def median_call(target, tokens: list[int], base: int, clock, before=None, reps: int = REPS) -> float:
    """The median of `reps` timed calls scoring `tokens`, each right after before() (untimed) when given."""
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        times.append(timed_call(target, tokens, base, clock))
    return statistics.median(times)


def repeated(tokens: list[int], n: int) -> list[int]:
    return (tokens * (n // max(1, len(tokens)) + 1))[-n:]


def timed_call(backend, tokens: list[int], base: int, clock=time.perf_counter, num_logits: int | None = None) -> float:
    """Seconds of one call scoring `tokens` on top of `base` cached tokens, rolled back after."""
    t0 = clock()
    backend.score(tokens, num_logits=num_logits or len(tokens))
    elapsed = clock() - t0
    backend.rollback(base)
    return elapsed


def cached_or_measured(cache: Path | None, target, draft, context: list[int], max_tokens: int,
                       clock=time.perf_counter, wide: list[int] = ()) -> dict:
    """The costs cached for this machine and pair when they cover calls of up to
    max_tokens, else measured now (and cached when `cache` is a path); the `wide`
    call sizes the cache lacks are measured and added to it. A cached entry that
    cannot be a measurement (hand-edited, or written by a broken run) is measured
    again, with one line saying so."""
    cached = read_cached_json(cache)
    if cached is not None:
        problem = cache_problem(cached, max_tokens, draft is not None)
        if problem is None:
            known = cached.get("target_wide", {})
            missing = [n for n in wide if str(n) not in known]
            if not missing:
                return cached
            step = after_draft(draft, context, clock)
            cached["target_wide"] = dict(known, **measure_wide(target, context, missing, clock, step))
            if draft is not None:
                draft.rollback(0)
            write_cached_json(cache, cached)
            return cached
        if problem != NOT_COVERED:
            log.warning("specsample: the cost cache %s %s; measuring the costs again", cache, problem)
    measured = measure(target, draft, context, max_tokens, clock=clock, wide=wide)
    write_cached_json(cache, measured)
    return measured


def wide_costs(measured: dict) -> dict[int, float]:
    """A measurement's larger calls, {tokens: seconds}."""
    return {int(n): seconds for n, seconds in measured.get("target_wide", {}).items()}


DRAFT_COSTS = {"draft_step", "draft_first", "draft_token", "draft_long"}
NOT_COVERED = "does not cover this use"  # a valid file that calls for a new measurement without a word


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
    wide = cached.get("target_wide", {})
    if not isinstance(wide, dict) or not all(_tokens(n) for n in wide):
        return "holds larger call costs that are not keyed by a number of tokens"
    if not all(_seconds(x) for x in wide.values()):
        return "holds a larger call cost that is not a positive number of seconds"
    # Files written before the cold first draft call or the long read were measured lack
    # "draft_first" or "draft_long"; those of one timed call per size, "reps".
    if len(cached["target"]) < max_tokens or with_draft and not DRAFT_COSTS <= cached.keys():
        return NOT_COVERED
    if not isinstance(cached.get("reps"), int) or cached["reps"] < REPS:
        return NOT_COVERED
    # Written before verify calls were timed after a draft step: priced as if back to back.
    if with_draft and cached.get("verify_after_draft") is not True:
        return NOT_COVERED
    return None


def _tokens(key) -> bool:
    """A JSON key naming a call of more than one token (isdigit alone takes "²")."""
    return isinstance(key, str) and key.isascii() and key.isdigit() and int(key) > 1


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


def measured_prices(measured: dict, config: PlannerConfig = PLANNER) -> Prices:
    """Prices whose priors are a calibration's timings (calibrate.measure)."""
    target = dict(enumerate(measured["target"], start=1)) | wide_costs(measured)
    draft = {}
    if "draft_step" in measured:
        step, token = measured["draft_step"], measured["draft_token"]
        draft = {1: step, READ_CHUNK: step + (READ_CHUNK - 1) * token, READ_LONG: measured["draft_long"]}
    return Prices(Curve(target, config), Curve(draft, config), own_work())


SLOT_GAIN = CALIBRATION.slot_gain


def slots_that_pay(target: Curve, most: int = CALIBRATION.most_slots) -> int:
    """How many sequences to decode together by default on this machine: the fewest
    that serve, with one token each per call, within 5% of the best throughput
    n / T(n) over n <= most, and 1 unless that best beats one sequence by 5%. The
    fewest, because every further sequence in a call slows each one down: where calls
    cost the same whatever their size (memory-bound) it is `most`; where they cost in
    proportion to their tokens (compute-bound) it is 1; and where the curve bends, as
    llama.cpp's does at its groups of 4 rows, it is where the gain stops."""
    if target(1) <= 0:
        return 1  # nothing measured: no ground for more
    throughput = [n / target(n) for n in range(1, most + 1)]
    best = max(throughput)
    if best < SLOT_GAIN * throughput[0]:
        return 1
    return next(n for n, t in enumerate(throughput, start=1) if t * SLOT_GAIN >= best)


def probe_context(target) -> list[int]:
    """Tokens to time calls on before any prompt is known: the ids themselves do not
    change what a call costs."""
    return [i % target.vocab_size for i in range(1, CALIBRATION.probe_tokens + 1)]

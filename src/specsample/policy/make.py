"""What -k means, in one place: the rule every command applies to -k and --k-max before
a model loads, and the policy made from them (a fixed K, or a seat of a planner whose
prices start from a calibration). Whoever knows the models makes it (assembly's
Models.policy, the server, the bench, `check`); the generation loop takes it ready
and never times a model itself.

FixedK and the Policy protocol stay in decoding/plans.py, beside the Offer, Plan and
RoundReport they are written in: the protocol is the loop's side of the boundary (the
loop defines what it calls; the planner here implements it, so imports point from
policy to decoding only), and FixedK is what an integer K means to the loop, which
needs no measurement.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..decoding.plans import FixedK, Policy, check_fixed_k
from .calibrate import cached_or_measured, measured_prices, probe_context, wide_sizes
from .config import PLANNER, PlannerConfig
from .control import Planner
from .estimates import Prices

K_MAX = PLANNER.k_max  # the most drafts "auto" proposes in a round, unless told otherwise (--k-max)
PolicyLike = Policy | int | str  # a policy, or what make_policy makes one from: K, or "auto"


def check_draft_length(k, k_max: int = K_MAX) -> None:
    """The one rule for -k and --k-max, which the commands apply before any model loads."""
    if k != "auto":
        check_fixed_k(k)
    if k_max < 1:
        raise ValueError(f"k-max must be >= 1, got {k_max}")


def make_policy(k: int | str, k_max: int = K_MAX, target=None, draft=None, *, drafts: bool = True,
                context: list[int] | None = None, cost_cache: Path | None = None,
                clock=time.perf_counter, parallel: int = 1, config: PlannerConfig = PLANNER) -> Policy:
    """The one place that decides a generation's draft-length policy: `k` an int
    (fixed K) or "auto". For "auto" with something that drafts (`drafts`), a seat of a
    new planner whose prices start from the costs of `target` and the `draft` model's
    backend (None: lookup alone), measured now on top of `context` or read from
    `cost_cache` (calibrate.cached_or_measured); without a target to time, it learns
    them from the rounds. `parallel`: the most sequences decoded together (fork()
    makes each one's seat), whose calls of up to parallel * (k_max + 1) tokens are
    timed too. `config`: the planner's numbers (a study varies them here; k_max above
    is --k-max)."""
    check_draft_length(k, k_max)
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    if k != "auto" or not drafts:
        return FixedK(k_max if k == "auto" else k)
    prices = Prices.empty(config)
    if target is not None:
        measured = cached_or_measured(cost_cache, target, draft, context or probe_context(target), k_max + 1, clock,
                                      wide_sizes(k_max + 1, parallel))
        prices = measured_prices(measured, config)
    return Planner(k_max, prices, clock, config=config).seat()


def as_policy(policy: PolicyLike | None, target=None, draft=None, **options) -> Policy:
    """`policy` itself, or the one make_policy makes from a shorthand: K, "auto", or
    None for "auto" (with K_MAX); `options` are make_policy's."""
    if policy is None or isinstance(policy, (int, str)):
        return make_policy("auto" if policy is None else policy, K_MAX, target, draft, **options)
    return policy


def most_drafts(policy: PolicyLike | None) -> int:
    """The most drafts a round under `policy` may add (what a context must leave room
    for), known without making it."""
    if policy is None or policy == "auto":
        return K_MAX
    return policy if isinstance(policy, int) else policy.k_max

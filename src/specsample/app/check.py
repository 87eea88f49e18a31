"""Exactness a user can check on their own models: does speculative sampling through
the real generation loop draw two-token continuations from the target's own joint
distribution, on this engine, dtype and machine?

For each prompt, N samples of (x1, x2) come from `generate` with a draft model and a
fixed K. The exact joint comes from the same target backend: P(x1) from the prompt
row, P(x2 | x1) for the likeliest x1. Both are cut into the likeliest cells plus an
"other" bucket, and compared by total variation (TV). Even a perfect sampler shows a
TV above 0 at finite N, so the observed TV is set beside the TV of N draws from the
exact distribution itself, simulated many times (median, 99th percentile); the check
fails when the mean TV over the prompts exceeds that 99th percentile.

The reference is computed in the call shapes the sampler uses. On llama.cpp the
logits of a position depend on how many tokens the call scores (its batched kernels
round differently from its one-token path), so speculative sampling follows the
batched distribution, not the one-token one, and a reference in the wrong shape
shows a TV of its own (the engine floor, reported beside the result).

What N can see: a sampler whose distribution is at mean TV d from the exact one
shows an observed TV of at least d minus its own sampling noise, and that noise
stays below the perfect sampler's 90th percentile 9 times in 10. So the check fails
at least 9 times in 10 once d exceeds the 99th percentile plus the 90th: that sum
is the smallest TV it detects (it shrinks as 1 / sqrt(N)). A smaller error, such as
an engine floor below it, can pass unseen.

With -k auto the draft lengths are the planner's, chosen from this
machine's timings, so the second token is scored in calls whose size no reference
can know in advance. The reference then uses one-token calls (plain decoding's
numbers): exact where the engine floor is 0 (transformers, --batch-invariant),
off by up to about the floor elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..backends.base import Backend
from ..decoding.drafters import Drafter
from ..decoding.generate import GenerationConfig, generate
from ..decoding.plans import FixedK, Policy
from ..decoding.sampling import MIN_TEMPERATURE, SamplingConfig, logits_to_probs
from ..policy.make import PolicyLike, as_policy

FLOOR_CALL_SIZES = (2, 4, 8)  # multi-token calls compared with the one-token call


@dataclass(frozen=True)
class CheckConfig:
    samples: int = 2000  # in all, split evenly across the prompts (the draft length is check()'s policy)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cells: int = 8  # likeliest (x1, x2) cells reported; the rest is "other"
    simulations: int = 1000  # perfect-sampler runs for the TV quantiles
    seed: int = 0
    verifier: str = "rejection"  # the sampler checked: GenerationConfig's "rejection", "block" or "coupled"

    def __post_init__(self) -> None:
        if self.samples < 1 or self.cells < 1 or self.simulations < 100:
            raise ValueError("check needs samples >= 1, cells >= 1 and simulations >= 100")
        if self.sampling.greedy:
            raise ValueError(f"check compares distributions: use a temperature of at least {MIN_TEMPERATURE:g} "
                             "(below it sampling is greedy)")


@dataclass
class Cell:
    tokens: tuple[int, int] | None  # (x1, x2); None: the "other" bucket
    exact: float
    observed: float  # frequency among the samples


@dataclass
class PromptCheck:
    prompt_ids: list[int]
    samples: int
    cells: list[Cell]  # likeliest first, "other" last
    tv: float
    perfect_tv: tuple[float, float]  # a perfect sampler at this N: 50th, 99th percentile
    engine_floor: float  # TV, one-token call vs the same position in a multi-token call
    acceptance_rate: float | None


@dataclass
class CheckResult:
    prompts: list[PromptCheck]
    tv: float  # mean over the prompts
    perfect_tv: tuple[float, float]  # of that mean: 50th, 99th percentile
    engine_floor: float  # the largest over the prompts
    detectable: float = 0.0  # the smallest mean TV that fails the check 9 times in 10 (module docstring)

    @property
    def passed(self) -> bool:
        return self.tv <= self.perfect_tv[1]

    @property
    def floor_unseen(self) -> bool:
        """The engine's floor is there but below what this N can detect."""
        return 0.0 < self.engine_floor < self.detectable


def check(target: Backend, drafter: Drafter, prompts: list[list[int]], config: CheckConfig,
          progress: Callable[[int, int], None] | None = None, policy: PolicyLike = 2,
          clock=time.perf_counter, overlap: bool = False) -> CheckResult:
    """Sample, compute the exact reference, compare. `progress(done, total)` is called
    after every sample. `policy`: the one to draw with, or K (a fixed K; 2 by default),
    or "auto": a new planner timed on the first prompt, which then learns across all
    the samples, as a server's does. A fixed K's call shapes are the reference's
    (exact_cells); any other policy's are not known in advance. `clock` times the
    calls it prices. `overlap`: the pair's placement (assemble's Models.overlap)."""
    if not prompts:
        raise ValueError("check needs at least one prompt")
    draft = None if drafter is None else drafter.model_backend
    policy = as_policy(policy, target, draft, drafts=drafter is not None, context=prompts[0], clock=clock)
    n = max(1, config.samples // len(prompts))
    generator = torch.Generator().manual_seed(config.seed)
    checks = []
    for i, prompt in enumerate(prompts):
        done = (lambda j, start=i * n: progress(start + j, n * len(prompts))) if progress else None
        checks.append(check_prompt(target, drafter, prompt, n, config, generator, policy, seed_offset=i * n,
                                   progress=done, clock=clock, overlap=overlap))
    exact = [torch.tensor([cell.exact for cell in c.cells], dtype=torch.float64) for c in checks]
    simulated = perfect_sampler_tv(exact, [n] * len(checks), config.simulations, generator)
    mean_tv = sum(c.tv for c in checks) / len(checks)
    median, p90, p99 = _quantiles(simulated, (0.5, 0.9, 0.99))
    return CheckResult(checks, mean_tv, (median, p99), max(c.engine_floor for c in checks), detectable=p99 + p90)


def check_prompt(target, drafter, prompt, n, config: CheckConfig, generator, policy: Policy, seed_offset=0,
                 progress=None, clock=time.perf_counter, overlap: bool = False) -> PromptCheck:
    cells = exact_cells(target, prompt, config, fixed_k(policy))
    counts, acceptance = sample_pairs(target, drafter, prompt, n, config, policy, seed_offset, progress, clock,
                                      overlap)
    keys = [t for t, _ in cells] + [None]
    exact = torch.tensor([p for _, p in cells] + [0.0], dtype=torch.float64)  # [cells + 1]
    exact[-1] = (1.0 - exact.sum()).clamp_min(0.0)
    observed = torch.tensor([counts.get(t, 0) for t, _ in cells] + [0], dtype=torch.float64) / n  # [cells + 1]
    observed[-1] = 1.0 - observed.sum()
    floor = engine_floor(target, prompt, cells[0][0][0], config.sampling)
    return PromptCheck(list(prompt), n, [Cell(t, float(e), float(o)) for t, e, o in zip(keys, exact, observed)],
                       total_variation(observed, exact),
                       _quantiles(perfect_sampler_tv([exact], [n], config.simulations, generator), (0.5, 0.99)), floor,
                       acceptance)


def fixed_k(policy: Policy) -> int | None:
    """K when `policy` always drafts K tokens (FixedK), else None."""
    return policy.k_max if isinstance(policy, FixedK) else None


def exact_cells(target: Backend, prompt: list[int], config: CheckConfig,
                k: int | None) -> list[tuple[tuple[int, int], float]]:
    """The likeliest (x1, x2) cells and their exact probabilities, with x1 among the
    config.cells likeliest first tokens, computed in the call shapes of a sampler
    drafting a fixed `k` (None: sizes that vary).

    With max_new_tokens = K + 1 (sample_pairs) the loop scores x1 in the prompt call
    (the prefill's last row) and x2 always in the first row of a K-token call:
      x1 accepted as draft d1: the round scores [d1, ..., dK] in one call, and
        x2 (accepted d2, recovered, or for K = 1 the bonus) comes from its first row;
      x1 recovered: the next round feeds the pending x1 plus K - 1 drafts, one
        K-token call, and x2 again comes from its first row.
    A causal model's first row does not depend on the tokens after it, so x1
    repeated K times stands in for the drafts. With -k auto the sizes vary: x2 is
    scored in a one-token call, as plain decoding scores it."""
    first = _prompt_row(target, prompt, config.sampling)  # [vocab]
    top = first.topk(min(config.cells, int((first > 0).sum()))).indices.tolist()
    size = 1 if k is None else k
    joint = []
    for x1 in top:
        target.rollback(len(prompt))
        second = logits_to_probs(target.score([x1] * size, num_logits=size)[:1], config.sampling)[0]
        joint += [((x1, x2), float(first[x1] * second[x2])) for x2 in range(second.shape[0]) if second[x2] > 0]
    return sorted(joint, key=lambda cell: -cell[1])[: config.cells]


def sample_pairs(target, drafter, prompt, n, config: CheckConfig, policy: Policy, seed_offset: int = 0,
                 progress=None, clock=time.perf_counter, overlap: bool = False):
    """Counts of the first two tokens of n speculative samples, and the acceptance rate."""
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    # K + 1 new tokens: x2 is then always scored in a K-token call (exact_cells); with
    # -k auto, room for the longest round the planner may choose (k_max either way).
    # No EOS: the reference never stops either.
    length = policy.k_max + 1
    for i in range(n):
        run = GenerationConfig(max_new_tokens=length, sampling=config.sampling,
                               seed=config.seed * 1_000_003 + seed_offset + i, eos_token_ids=frozenset(),
                               verifier=config.verifier)
        result = generate(target, prompt, run, drafter, policy, clock, overlap)
        pair = tuple(result.token_ids[:2])
        counts[pair] = counts.get(pair, 0) + 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        if progress:
            progress(i + 1)
    return counts, (accepted / drafted if drafted else None)


def engine_floor(target: Backend, prompt: list[int], x1: int, sampling: SamplingConfig) -> float:
    """The largest TV between the distribution after prompt + [x1] from a one-token
    call (autoregressive decoding) and the same position as the first row of a
    longer call (batched scoring). 0 on an engine whose logits ignore call shape."""
    rows = []
    for size in (1,) + FLOOR_CALL_SIZES:
        target.rollback(len(prompt))
        rows.append(logits_to_probs(target.score([x1] * size, num_logits=size)[:1], sampling)[0])
    return max(total_variation(rows[0].double(), row.double()) for row in rows[1:])


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def perfect_sampler_tv(exact: list[torch.Tensor], samples: list[int], simulations: int,
                       generator: torch.Generator) -> torch.Tensor:
    """[simulations] mean TV over the prompts when each prompt's samples are drawn
    from its exact cell distribution itself (exact[i]: [cells + 1])."""
    total = torch.zeros(simulations, dtype=torch.float64)
    for probs, n in zip(exact, samples):
        probs = probs.double()
        draws = torch.multinomial(probs, n * simulations, replacement=True, generator=generator)  # [sims * n]
        counts = torch.zeros(simulations, probs.shape[0], dtype=torch.float64)
        counts.scatter_add_(1, draws.view(simulations, n), torch.ones(simulations, n, dtype=torch.float64))
        total += 0.5 * (counts / n - probs).abs().sum(-1)  # [simulations]
    return total / len(exact)


def _prompt_row(target: Backend, prompt: list[int], sampling: SamplingConfig) -> torch.Tensor:
    target.rollback(0)
    return logits_to_probs(target.score(prompt, num_logits=1), sampling)[0]  # [vocab]


def _quantiles(tvs: torch.Tensor, levels: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(q) for q in torch.quantile(tvs, torch.tensor(levels, dtype=tvs.dtype)))

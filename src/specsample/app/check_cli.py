"""The `check` subcommand: parse, load the pair, run check.py, print its table.
Exit status 0 when the samples are as close to the exact distribution as a perfect
sampler's usually are, 1 when they are not, 2 on bad input."""

from __future__ import annotations

import sys
import time

from ..decoding.sampling import SamplingConfig
from ..policy.make import check_draft_length
from .arguments import (UsageError, add_draft_length_arguments, add_model_arguments, add_sampling_controls,
                        model_options, sampling_config)
from .assemble import assemble
from .check import CheckConfig, CheckResult, check

# Short prompts of different kinds, so that a few first tokens carry most of the mass.
PROMPTS = ("The capital of France is", "def fibonacci(n):\n   ", "Once upon a time, there was a")


def add_check_parser(sub) -> None:
    c = sub.add_parser("check", help="confirm that speculative samples follow the target's own distribution",
                       description="Draw two-token continuations of a few prompts with speculative sampling and "
                                   "compare their joint distribution with the exact one from the same target "
                                   "backend. Exit status 1 when the difference is larger than a perfect sampler's "
                                   "at the same N, 99 times in 100.")
    add_model_arguments(c)
    c.add_argument("-n", type=int, default=2000, help=f"samples in all, split across the {len(PROMPTS)} prompts "
                                                      "(default 2000)")
    add_draft_length_arguments(c, default=2)
    add_sampling_controls(c, temperature=1.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--cells", type=int, default=8, help="likeliest token pairs shown per prompt (default 8)")
    # The draft model alone: lookups would vary the draft length, and with it the
    # call shapes the reference mirrors (-k auto says what that costs).
    c.set_defaults(func=cmd_check, lookup=False)


def cmd_check(args) -> int:
    # A bad value fails before the slow load.
    check_draft_length(args.k, args.k_max)
    config = CheckConfig(samples=args.n, sampling=sampling_config(args), cells=args.cells, seed=args.seed)
    if args.draft == "ngram" or args.lookup:
        raise UsageError("check measures a draft model: give one with --draft, without --lookup")
    models = assemble(model_options(args))
    target, drafter = models.target, models.drafter(config.sampling)
    if target.tokenizer is None:
        raise UsageError(f"{target.name} has no tokenizer")
    prompts = [target.tokenizer.encode(text) for text in PROMPTS]
    start = time.perf_counter()
    result = check(target, drafter, prompts, config, progress=_progress_printer(start),
                   policy=models.policy(args.k, args.k_max), overlap=models.overlap)
    print(f"specsample check: target {target.name}, draft {drafter.name}, k={args.k}, {_sampling(config.sampling)}")
    print(format_check(result, PROMPTS, target.tokenizer.decode, auto=args.k == "auto"))
    print(f"wall time {time.perf_counter() - start:.1f} s")
    return 0 if result.passed else 1


def format_check(result: CheckResult, prompt_texts, decode, auto: bool = False) -> str:
    lines = []
    for text, p in zip(prompt_texts, result.prompts):
        rate = "n/a" if p.acceptance_rate is None else f"{p.acceptance_rate:.2f}"
        lines += ["", f"prompt {text!r}: {p.samples} samples, acceptance {rate}",
                  f"  {'x1':<16}{'x2':<16}{'exact':>8}{'observed':>10}"]
        for cell in p.cells:
            x1, x2 = ("other", "") if cell.tokens is None else (_token(decode, cell.tokens[0]), _token(decode, cell.tokens[1]))
            lines.append(f"  {x1:<16}{x2:<16}{cell.exact:>8.4f}{cell.observed:>10.4f}")
        lines.append(f"  TV {p.tv:.4f}; a perfect sampler at this N: median {p.perfect_tv[0]:.4f}, "
                     f"99th percentile {p.perfect_tv[1]:.4f}")
    verdict = "PASS" if result.passed else "FAIL: outside what a perfect sampler shows, 99 times in 100"
    lines += ["", f"mean TV over the prompts {result.tv:.4f}; a perfect sampler: median {result.perfect_tv[0]:.4f}, "
                  f"99th percentile {result.perfect_tv[1]:.4f}: {verdict}",
              f"smallest TV this N detects: {result.detectable:.4f} (a sampler further than that from the exact "
              f"distribution over these cells fails at least 9 times in 10; a closer one may pass)",
              f"engine floor: TV {result.engine_floor:.4f} between a position's distribution from a one-token call "
              f"and from a multi-token call (autoregressive decoding vs batched scoring on this engine; the "
              f"reference above uses " + ("one-token calls)" if auto else "the sampler's own call shapes)")]
    if result.floor_unseen:
        total = sum(p.samples for p in result.prompts)
        needed = total * (result.detectable / result.engine_floor) ** 2  # what N detects shrinks as 1 / sqrt(N)
        lines.append(f"warning: the engine floor is below what {total} samples can "
                     f"detect: this run cannot tell this engine's one-token numbers from its batched ones (plain "
                     f"from speculative decoding); roughly -n {_round_up(needed)} could")
    if auto:
        lines.append("-k auto: the planner chose each round's length from this machine's timings, so the second "
                     "token was scored in calls of varying size; the reference is exact for them only where the "
                     f"engine floor is 0 (transformers, --batch-invariant), and off by up to about the floor "
                     f"({result.engine_floor:.4f}) elsewhere")
        if all(p.acceptance_rate is None for p in result.prompts):
            lines.append("-k auto drafted nothing here (plain steps paid more), so this run checked plain decoding "
                         "only; a fixed -k checks speculative sampling")
    return "\n".join(lines)


def _round_up(n: float) -> int:
    """n to two significant figures, rounded up: a sample count to suggest."""
    scale = 10 ** max(0, len(str(int(n))) - 2)
    return -(-int(n) // scale) * scale


def _token(decode, token_id: int) -> str:
    return repr(decode([token_id]))[:14]


def _sampling(s: SamplingConfig) -> str:
    return f"temperature {s.temperature:g}, top-k {s.top_k}, top-p {s.top_p:g}"


def _progress_printer(start: float):
    """A line on stderr at every tenth of the samples, once the run takes a while."""

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - start < 2:
            return
        if done == total or done * 10 // total != (done - 1) * 10 // total:
            print(f"specsample: check: {done}/{total} samples, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)

    return progress

"""What per-token log-probabilities cost in decode speed: the same greedy and sampled
generations with logprobs off and at 5, interleaved (off, on, on, off, ...) so that a
machine slowing down over the run charges both alike.

    python -m benchmarks.studies.logprob_cost --out results/logprob-cost        # default pair, -k auto

The aim: less than 5% of decode speed at logprobs 5.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Write a Python class for a stack with push, pop and peek.",
    "Explain list comprehensions in Python with an example.",
    "Write a function that counts the words in a text file.",
]


def main(argv: list[str] | None = None) -> int:
    from specsample.app.arguments import add_draft_length_arguments, add_model_arguments, model_options
    from specsample.app.assemble import assemble
    from specsample.decoding.generate import GenerationConfig, generate
    from specsample.decoding.sampling import SamplingConfig

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.logprob_cost", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    add_draft_length_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    models = assemble(model_options(args))
    target, policy = models.target, models.policy(args.k, args.k_max)
    totals = {}  # (mode, logprobs) -> [tokens, seconds]
    for repeat in range(args.repeats):
        for i, question in enumerate(PROMPTS):
            ids = target.tokenizer.chat_prompt(question)
            order = (None, 5) if (repeat + i) % 2 == 0 else (5, None)
            for mode, sampling in (("greedy", SamplingConfig(0.0)), ("sample", SamplingConfig(0.8, top_p=0.95))):
                drafter_for = models.drafter(sampling)  # a model drafter draws from the run's own sampling
                for logprobs in order:
                    config = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=sampling,
                                              seed=repeat * 100 + i, logprobs=logprobs)
                    stats = generate(target, ids, config, drafter_for, policy).stats
                    decode = stats.total_seconds - stats.prefill_seconds
                    cell = totals.setdefault(f"{mode}, logprobs {logprobs}", [0, 0.0])
                    cell[0] += stats.new_tokens
                    cell[1] += decode
    rates = {key: tokens / seconds for key, (tokens, seconds) in totals.items()}
    report = {"tokens_per_second": rates,
              "cost": {mode: 1 - rates[f"{mode}, logprobs 5"] / rates[f"{mode}, logprobs None"]
                       for mode in ("greedy", "sample")},
              "command": "python -m benchmarks.studies.logprob_cost " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logprob-cost.json").write_text(json.dumps(report, indent=1) + "\n")
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

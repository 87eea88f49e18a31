"""Time to the first and second token on a long prompt, plain decoding against -k auto:
a draft model that has not read the prompt must not hold the stream back (the aim:
-k auto within 10% of plain decoding's time to the second token on a 4k-token prompt).
Runs are interleaved (plain, auto, auto, plain, ...) so that a machine slowing down
charges both alike; each run scores its prompt afresh.

    python -m benchmarks.studies.second_token --threads 2 --out docs/results/second-token
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import specsample

SOURCE = Path(specsample.__file__).parent  # the package's own code: a long prompt any machine has


def long_prompt(target, tokens: int) -> list[int]:
    """A chat asking about code, the code cut to about `tokens` tokens."""
    text = "\n\n".join(p.read_text() for p in sorted(SOURCE.rglob("*.py")))
    code = target.tokenizer.decode(target.tokenizer.encode(text)[:tokens])
    return target.tokenizer.chat_prompt(f"Here is some code:\n\n{code}\n\nWhat does the first function do?")


def timed_stream(target, ids, config, drafter, policy) -> tuple[float, float, dict]:
    """Seconds to the first and to the second token, and the run's statistics."""
    from specsample.decoding.generate import stream

    start = time.perf_counter()
    s = stream(target, ids, config, drafter, policy)
    marks, seen = [], 0
    for chunk in s:
        seen += len(chunk.token_ids)
        while len(marks) < 2 and seen > len(marks):
            marks.append(time.perf_counter() - start)
    return marks[0], marks[1], s.result.stats.as_dict()


def main(argv: list[str] | None = None) -> int:
    from specsample.app.arguments import add_model_arguments, model_options
    from specsample.app.assemble import assemble
    from specsample.decoding.generate import GenerationConfig
    from specsample.decoding.sampling import SamplingConfig

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.second_token", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    models = assemble(model_options(args))
    target, policy = models.target, models.policy("auto")
    greedy = SamplingConfig(temperature=0)
    ids = long_prompt(target, args.prompt_tokens)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=greedy)
    runs = {"plain": [], "auto": []}
    order = ["plain", "auto", "auto", "plain"]
    for i in range(args.repeats * 2):
        mode = order[i % 4]
        drafter = models.drafter(greedy) if mode == "auto" else None
        first, second, stats = timed_stream(target, ids, config, drafter, policy if mode == "auto" else None)
        runs[mode].append({"first": first, "second": second, "draft_calls": stats["draft_calls"],
                           "plain_rounds": stats["plain_rounds"], "new_tokens": stats["new_tokens"]})
        print(f"{mode}: first token {first:.2f} s, second {second:.2f} s", file=sys.stderr, flush=True)
    medians = {m: {k: statistics.median(r[k] for r in v) for k in ("first", "second")} for m, v in runs.items()}
    ratio = medians["auto"]["second"] / medians["plain"]["second"]
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.studies.second_token " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "runs.json").write_text(json.dumps({"prompt_tokens": len(ids), "runs": runs, "medians": medians,
                                                   "command": command}, indent=1))
    lines = [f"# Time to the second token, {len(ids)}-token prompt", "", f"Command: `{command}`", "",
             "| mode | runs | first token, median s | second token, median s |", "|---|---|---|---|"]
    lines += [f"| {m} | {len(runs[m])} | {medians[m]['first']:.2f} | {medians[m]['second']:.2f} |" for m in runs]
    lines += ["", f"-k auto's time to the second token is {ratio:.3f}x plain decoding's."]
    (args.out / "second-token.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

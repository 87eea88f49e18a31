"""lm-evaluation-harness against `specsample serve`, end to end and offline.

The harness's own clients (`local-completions` for both tasks, `local-chat-completions`
for the generate_until one) talk to a served model on the small tasks shipped in
evaltasks/ (no hub download; the server's /tokenize gives the harness its tokenizer).
Run once against `serve --autoregressive` and once against `serve` (speculative,
greedy as the tasks ask), the scores must be identical, and every log-likelihood the
harness computed must equal the library's own prompt scoring of the same tokens.

    python -m benchmarks.studies.harness --out results/lm-eval            # the default pair
    python -m benchmarks.studies.harness --out results/lm-eval --batch-invariant -k 3

Needs the `eval` extra (pip install -e '.[eval]').
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "evaltasks"
MC_TASK, GEN_TASK = "specsample_python_mc", "specsample_python_gen"


def evaluate(url: str, model: str, chat: bool = False, limit: int | None = None, batch_size: int = 1) -> dict:
    """One harness run; chat runs the generate_until task alone (log-likelihoods need
    completions). Returns {"scores": {task: {metric: value}}, "samples": {task: [...]}}."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    route = "chat/completions" if chat else "completions"
    model_args = {"base_url": f"{url}/v1/{route}", "model": model, "num_concurrent": 1, "max_retries": 1,
                  "batch_size": batch_size, "tokenizer_backend": None if chat else "remote"}
    out = lm_eval.simple_evaluate(model="local-chat-completions" if chat else "local-completions",
                                  model_args=model_args, tasks=[GEN_TASK] if chat else [MC_TASK, GEN_TASK],
                                  task_manager=TaskManager(include_path=str(TASKS_DIR)), limit=limit,
                                  log_samples=True, apply_chat_template=chat)
    scores = {task: {k: v for k, v in r.items() if "," in k and "stderr" not in k} for task, r in out["results"].items()}
    # arguments: one (context, continuation) or (context, generation settings) per request of the doc
    samples = {task: [{"arguments": [list(a) for a in s["arguments"]], "resps": s["resps"]} for s in rows]
               for task, rows in out["samples"].items()}
    return json.loads(json.dumps({"scores": scores, "samples": samples}, default=str))


def loglikelihoods(run: dict) -> list[tuple[str, str, float]]:
    """(context, continuation, log-likelihood) of every multiple-choice request."""
    out = []
    for sample in run["samples"].get(MC_TASK, []):
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            out.append((context, continuation, float(resp[0][0])))
    return out


def library_loglikelihood(target, context: str, continuation: str) -> float:
    """The same tokens the harness sent, scored by the library. Its _encode_pair moves
    the context's trailing spaces to the continuation, encodes the context and the
    whole, and takes the continuation's tokens as the whole's past the context's
    length; it sends context tokens + those, which is not the whole's encoding where
    BPE merges across the boundary (")\n" in ")\n 3")."""
    from specsample.output.logprobs import score_prompt

    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = target.tokenizer.encode(context)
    continuation_ids = target.tokenizer.encode(context + continuation)[len(context_ids):]
    scored = score_prompt(target, context_ids + continuation_ids)
    return sum(e.logprob for e in scored[len(context_ids):])


def compare(runs: dict[str, dict], target=None) -> dict:
    """Scores side by side, and the largest log-likelihood differences between the runs
    and (given the target) from the library's own."""
    names = list(runs)
    report = {"scores": {name: run["scores"] for name, run in runs.items()}}
    report["scores_identical"] = all(runs[n]["scores"] == runs[names[0]]["scores"] for n in names)
    first = loglikelihoods(runs[names[0]])
    report["largest_loglikelihood_difference_between_runs"] = max(
        (abs(a[2] - b[2]) for n in names[1:] for a, b in zip(first, loglikelihoods(runs[n]))), default=0.0)
    if target is not None:
        report["largest_difference_from_library"] = max(
            (abs(ll - library_loglikelihood(target, c, x)) for c, x, ll in first), default=0.0)
    return report


def main(argv: list[str] | None = None) -> int:
    from specsample.app.arguments import add_model_arguments, model_options
    from specsample.app.assemble import assemble
    from benchmarks.serving import specsample_server

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.harness", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("-k", default="auto", help="the speculative server's -k (default auto)")
    p.add_argument("--limit", type=int, help="samples per task (default: all)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    model_argv = model_options(args).argv()
    runs = {}
    for name, extra in (("autoregressive", ["--autoregressive"]), ("speculative", ["-k", str(args.k)])):
        with specsample_server(model_argv, extra, f"specsample serve {' '.join(extra)}") as server:
            model = server.request("/v1/models")["data"][0]["id"]
            runs[name] = evaluate(server.url, model, limit=args.limit)
            runs[f"{name}-chat"] = evaluate(server.url, model, chat=True, limit=args.limit)
    target = assemble(model_options(args), drafting=False).target
    report = {"completions": compare({n: r for n, r in runs.items() if not n.endswith("chat")}, target),
              "chat": compare({n: r for n, r in runs.items() if n.endswith("chat")})}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "harness.json").write_text(json.dumps({"report": report, "runs": runs}, indent=1) + "\n")
    json.dump(report, sys.stdout, indent=1)
    print()
    ok = report["completions"]["scores_identical"] and report["chat"]["scores_identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

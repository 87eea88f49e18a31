"""Does llama.cpp give a position the same logits whatever the size of the call?

Plain decoding scores one token per call; speculative sampling scores K+1 in one.
For each engine setting this prefills a HumanEval solution up to a position, scores
the next 1, 2, 4 and 8 tokens in one call each, and compares the first row: total
variation between the softmaxes (T = 1) and the largest logit difference, over ten
positions; and it times a 1-token and a 4-token call.

    python -m benchmarks.studies.numerics [--threads 2] [--target NAME]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specsample.app.check import total_variation
from specsample.policy.calibrate import timed_call

# Setting -> (model params, context params) overrides of llama.cpp's defaults.
SETTINGS = {
    "llama.cpp defaults": ({}, {}),
    "no weight repacking": ({"use_extra_bufts": False}, {}),
    "flash attention": ({}, {"flash_attn": True}),
    "f32 KV cache": ({}, {"type_k": 0, "type_v": 0}),
    "flash attention + f32 KV cache": ({}, {"flash_attn": True, "type_k": 0, "type_v": 0}),
    "no repacking + f32 KV cache": ({"use_extra_bufts": False}, {"type_k": 0, "type_v": 0}),
    "no repacking + flash attention (--batch-invariant)": ({"use_extra_bufts": False}, {"flash_attn": True}),
}
SIZES = (1, 2, 4, 8)


def softmax_tv(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation between the softmaxes (T = 1) of two logit rows."""
    return total_variation(torch.softmax(a.double(), -1), torch.softmax(b.double(), -1))


def compare_sizes(backend, ids: list[int], positions) -> dict:
    """First-row logits of calls of each size at each position, compared with 4."""
    tv = {size: [] for size in SIZES}
    worst = 0.0
    for n in positions:
        backend.rollback(0)
        backend.score(ids[:n], 1)
        rows = {}
        for size in SIZES:
            backend.rollback(n)
            rows[size] = backend.score(ids[n:n + size], size)[0]
        for size in SIZES:
            tv[size].append(softmax_tv(rows[size], rows[4]))
        worst = max(worst, float((rows[1] - rows[4]).abs().max()))
    return {"tv": tv, "max_logit_diff_1_vs_4": worst}


def call_ms(backend, ids: list[int], n: int, size: int, reps: int = 7) -> float:
    backend.rollback(0)
    backend.score(ids[:n], 1)
    return 1000 * statistics.median(timed_call(backend, ids[n:n + size], n) for _ in range(reps))


def load_with(path, threads: int, model_overrides: dict, context_overrides: dict):
    """A llama.cpp backend with some of llama.cpp's default parameters overridden."""
    from specsample.backends import llamacpp

    lib = llamacpp._llama()
    defaults = lib.llama_model_default_params, lib.llama_context_default_params

    def patched(make, overrides):
        def params():
            p = make()
            for name, value in overrides.items():
                setattr(p, name, value)
            return p
        return params

    lib.llama_model_default_params = patched(defaults[0], model_overrides)
    lib.llama_context_default_params = patched(defaults[1], context_overrides)
    try:
        return llamacpp.LlamaCppBackend(path, threads=threads, share_cores=False)
    finally:
        lib.llama_model_default_params, lib.llama_context_default_params = defaults


def main(argv=None) -> None:
    from specsample.backends.models import DEFAULT_TARGET, resolve
    from specsample.bench import humaneval_problems, markdown_table

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.numerics", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    problem = humaneval_problems()[0]
    path = resolve(args.target).gguf_path
    rows = [["setting", "TV 1 vs 4: mean / max", "TV 2 vs 4", "TV 8 vs 4", "max logit diff, 1 vs 4",
             "1-token call ms", "4-token call ms"]]
    for label, (model_overrides, context_overrides) in SETTINGS.items():
        backend = load_with(path, args.threads, model_overrides, context_overrides)
        ids = backend.tokenizer.encode(problem["prompt"] + problem["canonical_solution"])
        result = compare_sizes(backend, ids, range(len(ids) - 60, len(ids) - 10, 5))
        tv = {size: f"{statistics.mean(v):.4f} / {max(v):.4f}" for size, v in result["tv"].items()}
        rows.append([label, tv[1], tv[2], tv[8], f"{result['max_logit_diff_1_vs_4']:.3f}",
                     f"{call_ms(backend, ids, len(ids) - 20, 1):.1f}", f"{call_ms(backend, ids, len(ids) - 20, 4):.1f}"])
        print(" | ".join(rows[-1]), flush=True)
        del backend
    print()
    print(f"{len(ids)} tokens of HumanEval/0 prompt + solution; positions every 5 tokens over the last 60; threads {args.threads}")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()

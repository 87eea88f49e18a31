"""Command line: thin argparse subcommands over the library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .backends import BACKENDS, load_backend, pick_backend
from .backends.base import check_same_vocabulary
from .backends.hf import DTYPES
from .backends.requantize import QUANT_TYPES
from .constraints import Constraint
from .control import AdaptiveController, cost_cache_path
from .drafters import HybridDrafter, ModelDrafter, NgramDrafter
from .generate import GenerationConfig, stream
from .models import DEFAULT_DRAFT, DEFAULT_MODELS, DEFAULT_TARGET, ModelError, cache_dir, fetch_default
from .sampling import SamplingConfig


class UsageError(Exception):
    pass


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="short name, .gguf file, model directory or hub id")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="a model like --target, or 'ngram' for prompt lookup alone")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="engine for target and draft (default auto: llamacpp for GGUF files on the CPU, else hf)")
    p.add_argument("--target-backend", choices=BACKENDS, help="engine for the target alone (overrides --backend)")
    p.add_argument("--draft-backend", choices=BACKENDS, help="engine for the draft alone (overrides --backend)")
    p.add_argument("--draft-quant", default="q4_0", choices=["none"] + list(QUANT_TYPES),
                   help="llamacpp draft: requantize it to this type, cached (default q4_0: faster kernels; "
                        "the draft's quality moves acceptance only, never the output distribution)")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="hf draft: score only its N most frequent tokens (FR-Spec; 0 = all, the default)")
    p.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                   help="beside a draft model, propose from context lookup when it is expected to pay (default on)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="hf backend weights (default float32)")
    p.add_argument("--device", default="cpu", help="hf backend device: cpu, cuda, cuda:1 ...")
    p.add_argument("--threads", type=int, help="CPU threads for torch and llama.cpp (default: all cores)")
    p.add_argument("--ngram-max", type=int, default=3, help="longest n-gram the lookup matches")
    p.add_argument("--batch-invariant", action="store_true",
                   help="llamacpp target: kernels whose logits do not depend on how many tokens a call scores, so "
                        "speculative and plain decoding see the same numbers to the bit (~30%% slower calls here)")


def draft_length(value: str) -> int | str:
    """-k: "auto" or an integer; GenerationConfig says what is wrong with anything else,
    so that a bad value gets the same one-line error as every other bad input."""
    try:
        return int(value)
    except ValueError:
        return value


def add_draft_length_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", type=draft_length, default="auto",
                   help="draft tokens per round, or 'auto' (default): chosen each round from measured costs and "
                        "acceptance, 0 (a plain step) when drafting does not pay")
    p.add_argument("--k-max", type=int, default=8, help="the most drafts -k auto proposes in a round (default 8)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    add_draft_length_arguments(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsample", description="Exact speculative sampling (Chen et al. 2023).")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="sample a continuation, streaming it to stdout")
    add_model_arguments(g)
    add_sampling_arguments(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", type=Path)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--autoregressive", action="store_true", help="run the target alone (the baseline)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, metavar="FILE",
                       help="the output is JSON valid under this JSON schema (laid out as json.dumps does)")
    shape.add_argument("--regex", help="the output matches this regular expression (Rust regex syntax)")
    shape.add_argument("--grammar", type=Path, metavar="FILE",
                       help="the output matches this grammar: llguidance's Lark syntax, or llama.cpp's GBNF")
    g.set_defaults(func=cmd_generate)

    f = sub.add_parser("fetch", help="download and verify the default GGUF models")
    f.add_argument("names", nargs="*", help=f"default: all of {', '.join(DEFAULT_MODELS)}")
    f.set_defaults(func=cmd_fetch)

    from .bench.cli import add_bench_parser
    from .check_cli import add_check_parser
    from .serve.cli import add_serve_parser

    add_bench_parser(sub)
    add_serve_parser(sub)
    add_check_parser(sub)
    return parser


def generation_config(args) -> GenerationConfig:
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, k=args.k, k_max=args.k_max, sampling=sampling, seed=args.seed,
        stop_strings=tuple(getattr(args, "stop", ())), constraint=output_constraint(args),
    )


def output_constraint(args) -> Constraint | None:
    """--json-schema, --regex or --grammar, compiled (a bad one fails before any model loads)."""
    if getattr(args, "regex", None) is not None:
        return Constraint.regex(args.regex)
    for option, kind in (("json_schema", "json_schema"), ("grammar", "grammar")):
        path = getattr(args, option, None)
        if path is not None:
            if not path.is_file():
                raise UsageError(f"--{option.replace('_', '-')} file not found: {path}")
            return Constraint(kind, path.read_text())
    return None


def check_device(device: str) -> None:
    """A device torch can use here, or a UsageError now rather than after the slow load
    (torch would raise a RuntimeError for a bad name, an AssertionError for CUDA on a
    CPU build)."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    if parsed.type == "cpu":
        return
    module = torch.backends.mps if parsed.type == "mps" else getattr(torch, parsed.type, None)
    if not getattr(module, "is_available", lambda: False)():
        raise UsageError(f"--device {device}: no {parsed.type} device is available to this torch {torch.__version__}")
    count = getattr(module, "device_count", lambda: 1)()
    if parsed.index is not None and parsed.index >= count:
        raise UsageError(f"--device {device}: the {parsed.type} devices here are numbered 0 to {count - 1}")


def check_model_arguments(args) -> None:
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    check_device(args.device)


def load_models(args, need_draft: bool):
    """Target backend and drafter (None when not needed) from the model arguments."""
    check_model_arguments(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    kw = dict(device=args.device, dtype=args.dtype, threads=args.threads)
    target = load_backend(args.target, args.target_backend or args.backend, batch_invariant=args.batch_invariant, **kw)
    if not need_draft:
        return target, None
    if args.draft == "ngram":
        return target, NgramDrafter(max_ngram=args.ngram_max)
    draft_engine = pick_backend(args.draft, args.draft_backend or args.backend, args.device)
    quant = args.draft_quant if draft_engine == "llamacpp" and args.draft_quant != "none" else None
    if args.draft_vocab and draft_engine != "hf":
        raise UsageError("--draft-vocab needs the hf backend for the draft (--draft-backend hf)")
    draft = load_backend(args.draft, draft_engine, quant=quant, **kw)
    check_same_vocabulary(target, draft)  # before any prompt work
    if args.draft_vocab:
        from .vocab import restrict_draft_vocabulary

        restrict_draft_vocabulary(draft, args.draft_vocab, cache_dir())
    model = ModelDrafter(draft, SamplingConfig(args.temperature, args.top_k, args.top_p))
    if getattr(args, "lookup", False):
        return target, HybridDrafter(model, NgramDrafter(max_ngram=args.ngram_max))
    return target, model


def make_policy_for(args, target, drafter):
    """The draft-length policy for a run; the adaptive one keeps its measured costs in
    the cache, per machine and model pair, so later runs start warm."""
    if args.k != "auto" or drafter is None:
        return None  # stream() builds a fixed-K policy from the config
    backend = getattr(drafter, "model_backend", None)
    return AdaptiveController(args.k_max, cost_cache=cost_cache_path(cache_dir(), target, backend))


def prompt_ids(args, target) -> list[int]:
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise UsageError(f"prompt file not found: {args.prompt_file}")
        text = args.prompt_file.read_text()
    else:
        text = args.prompt
    if not text.strip():
        raise UsageError("the prompt is empty")
    if target.tokenizer is None:
        raise UsageError(f"{target.name} has no tokenizer")
    return target.tokenizer.chat_prompt(text) if args.chat else target.tokenizer.encode(text)


def cmd_generate(args) -> int:
    config = generation_config(args)  # validates before the slow model loads
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("the prompt is empty")
    target, drafter = load_models(args, need_draft=not args.autoregressive)
    ids = prompt_ids(args, target)
    s = stream(target, ids, config, drafter, make_policy_for(args, target, drafter))
    for chunk in s:
        if not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = s.result
    if args.json:
        json.dump({"text": result.text, "token_ids": result.token_ids, "stop_reason": result.stop_reason,
                   "stats": result.stats.as_dict()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n")
        print(format_stats(result.stats, drafter is not None), file=sys.stderr)
    return 0


def format_stats(stats, speculative: bool) -> str:
    line = f"{stats.new_tokens} tokens in {stats.total_seconds:.2f} s: {stats.tokens_per_second:.2f} tokens/s, " \
           f"{stats.target_calls} target calls"
    if stats.forced_tokens:
        line += f", {stats.forced_tokens} tokens forced by the grammar"
    if speculative:
        rate = "n/a" if stats.acceptance_rate is None else f"{stats.acceptance_rate:.2f}"
        line += f", {stats.draft_calls} draft calls, acceptance {rate}, " \
                f"{stats.mean_tokens_per_target_call:.2f} tokens per target call, " \
                f"accepted-per-round histogram {stats.accepted_histogram}, " \
                f"draft-length histogram {stats.draft_length_histogram} ({stats.plain_rounds} plain steps)"
        if stats.sources:
            line += ", by source " + ", ".join(f"{k}: {r} rounds {a}/{d} accepted" for k, (r, d, a) in stats.sources.items())
    if stats.calibration_seconds:
        line += f", cost calibration {stats.calibration_seconds:.2f} s"
    return line + f" (prefill {stats.prefill_seconds:.2f} s, draft {stats.draft_seconds:.2f} s, " \
                  f"target {stats.target_seconds:.2f} s, other {stats.other_seconds:.2f} s)"


def cmd_fetch(args) -> int:
    for name in args.names or DEFAULT_MODELS:
        if name not in DEFAULT_MODELS:
            raise UsageError(f"unknown default model {name!r}; choose from {', '.join(DEFAULT_MODELS)}")
        print(fetch_default(DEFAULT_MODELS[name]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return stdout_closed()
    # What a user can cause: bad input, a missing or unreachable model (OSError from
    # transformers), a full disk, an engine failure (RuntimeError from llama_decode).
    except (UsageError, ModelError, ValueError, OSError, RuntimeError) as e:
        print(f"specsample: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def one_line(error: BaseException) -> str:
    # transformers' hub errors run to several lines of advice
    return " ".join(str(error).split()) or type(error).__name__


def stdout_closed() -> int:
    """`specsample generate ... | head`: the reader left, so stop quietly. The recipe of
    Python's signal docs: point stdout at devnull so the interpreter's last flush cannot
    fail again, and exit 1, as Python itself does on EPIPE."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


if __name__ == "__main__":
    # `python -m specsample.cli` runs this file as __main__, a second copy of the
    # module beside the specsample.cli that subcommands import: use that one, so its
    # UsageError is the one caught.
    from specsample.cli import main as canonical_main

    sys.exit(canonical_main())

"""The `bench` subcommand: parse, load the models once, run, write the report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from .modes import FAMILIES, SETTINGS, OurMode, build_modes
from .runner import BenchConfig, prepare, run_bench, run_parity, total_steps
from .tasks import TASKS

# Defaults sized for ~20 minutes on a quiet 2-core CPU with the default pair in
# float32 (target ~210 ms per token): one 48-token generation is ~15 s including a
# ~200-token prompt prefill, and the default run is ~10 modes x 3 tasks x 2 settings
# plus 2 x 2 parity answers of up to 160 tokens. Every one is an option; a preset
# replaces the defaults it names.
DEFAULTS = dict(tasks="humaneval,prose,copy", settings="greedy,sample", modes="auto", ks="1,2,3,4,6,8",
                peer_k=3, prompts=1, max_new_tokens=48, parity_prompts=2, parity_max_new_tokens=160, parity_k=3,
                parity=True, plots=True)
PRESETS = {
    # `make demo`: a few minutes on a fresh 2-core machine.
    "demo": dict(tasks="humaneval", settings="greedy", modes="ar,spec,ngram", ks="3", prompts=3, max_new_tokens=64,
                 parity=False, plots=False),
}


def add_bench_parser(subparsers) -> None:
    from ..cli import add_model_arguments

    b = subparsers.add_parser("bench", help="measure speedups, acceptance and parity against peers",
                              description="Reproduce the speculative sampling measurements on your models and hardware.")
    add_model_arguments(b)
    b.add_argument("--preset", choices=list(PRESETS), help="demo: HumanEval, 3 prompts, 64 tokens, greedy, ar/spec-k3/ngram")
    b.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory (default results/bench)")
    b.add_argument("--tasks", help=f"comma list of {', '.join(TASKS)} (default all)")
    b.add_argument("--settings", help=f"comma list of {', '.join(SETTINGS)} (default both; sample = T 0.8, top-p 0.95)")
    b.add_argument("--modes", help=f"'auto' or a comma list of {', '.join(FAMILIES)} (auto: all that fit the backends)")
    b.add_argument("--ks", help="draft lengths K of the spec sweep (default 1,2,3,4,6,8)")
    b.add_argument("--peer-k", type=int, help="K of ngram, hf-assisted and llamacpp-lookup (default 3)")
    b.add_argument("--prompts", type=int, help="prompts per task (default 1: see DEFAULTS)")
    b.add_argument("--max-new-tokens", type=int, help="new tokens per sequence (default 48; the demo preset 64)")
    b.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap prompts in the target's chat template (default on: the defaults are instruct models)")
    b.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed + i in every mode")
    b.add_argument("--no-parity", dest="parity", action="store_false", default=None, help="skip the HumanEval pass@1 check")
    b.add_argument("--parity-prompts", type=int, help="HumanEval problems sampled per mode for pass@1 (default 2)")
    b.add_argument("--parity-max-new-tokens", type=int, help="new tokens per parity answer (default 160)")
    b.add_argument("--parity-k", type=int, help="K of the spec mode compared with ar for parity (default 3)")
    b.add_argument("--cost-reps", type=int, default=5, help="timed calls per point of the cost curve (default 5)")
    b.add_argument("--no-plots", dest="plots", action="store_false", default=None, help="skip the PNG plots")
    # load_models builds a drafter from these; bench only keeps the draft backend and
    # sets the sampling per decoding setting.
    b.set_defaults(func=cmd_bench, temperature=0.0, top_k=0, top_p=1.0)


def resolve_options(args) -> argparse.Namespace:
    """Explicit options win over the preset, the preset over the defaults."""
    preset = PRESETS.get(args.preset, {})
    for name, default in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, preset.get(name, default))
    return args


def bench_config(args) -> BenchConfig:
    return BenchConfig(tasks=_names(args.tasks, TASKS, "task"), settings=_names(args.settings, SETTINGS, "setting"),
                       prompts=args.prompts, max_new_tokens=args.max_new_tokens, chat=args.chat, seed=args.seed,
                       parity_prompts=args.parity_prompts if args.parity else 0,
                       parity_max_new_tokens=args.parity_max_new_tokens)


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from ..cli import UsageError, load_models
    from .costs import measure_cost_curve
    from .report import machine_description, write_report

    args = resolve_options(args)
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)  # validates before the slow model loads
    families = list(FAMILIES) if args.modes == "auto" else _names(args.modes, FAMILIES, "mode")
    ks = [int(k) for k in args.ks.split(",")]
    if min(ks) < 1 or args.peer_k < 1:
        raise UsageError("K must be >= 1")
    target, drafter = load_models(args, need_draft=args.draft != "ngram")
    draft = getattr(drafter, "backend", None)
    prompts = prepare(target, config.tasks, config.prompts, config.chat)
    parity_prompts = prepare(target, ("humaneval",), config.parity_prompts, config.chat)["humaneval"] if config.parity_prompts else []
    longest = max(len(p.ids) for group in list(prompts.values()) + [parity_prompts] for p in group)
    n_ctx = longest + max(config.max_new_tokens, config.parity_max_new_tokens) + max(ks + [args.peer_k]) + 16
    gguf = _target_gguf(args) if (args.target_backend or args.backend) == "llamacpp" else None
    modes, notes = build_modes(families, ks, args.peer_k, target, draft, target_gguf=gguf, ngram_max=args.ngram_max, n_ctx=n_ctx)
    notes = [f"not run: {n}" for n in notes]
    parity_modes = _parity_modes(target, draft, args.parity_k) if parity_prompts else []
    if config.parity_prompts and not parity_modes:
        notes.append("parity: skipped, no draft model")

    curve = None
    if draft is not None and any(m.family == "spec" for m in modes):
        context = next(iter(prompts.values()))[0].ids
        print(f"specsample: measuring the cost curve at {len(context)} tokens of context", file=sys.stderr)
        curve = measure_cost_curve(target, draft, context, max(ks) + 1, reps=args.cost_reps)
    steps = total_steps(modes, prompts, config, len(parity_modes), len(parity_prompts))
    with tqdm(total=steps, file=sys.stderr, desc="bench", unit="gen") as progress:
        records = run_bench(modes, prompts, config, progress)
        records += run_parity(parity_modes, parity_prompts, config, progress) if parity_modes else []
    machine = machine_description(args.dtype if (args.target_backend or args.backend) == "hf" else "gguf", _threads(args))
    # Other work on the machine skews every timing: say how busy it was.
    machine += f"; 1-minute load average {load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    command = shlex.join(["specsample"] + sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "specsample bench (library call)"
    table = write_report(args.out, records, curve, command=command, machine=machine, notes=notes, plots=args.plots)
    print(table)
    print(f"specsample: wrote {args.out}/records.jsonl and {args.out}/summary.md", file=sys.stderr)
    return 0


def _parity_modes(target, draft, k: int) -> list:
    if draft is None:
        return []
    return [OurMode("ar", "ar", target), OurMode(f"spec-k{k}", "spec", target, k, draft)]


def _names(text: str, allowed, what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    from ..cli import UsageError

    for n in names:
        if n not in allowed:
            raise UsageError(f"unknown {what} {n!r}; choose from {', '.join(allowed)}")
    if not names:
        raise UsageError(f"no {what} given")
    return names


def _target_gguf(args):
    from ..models import resolve

    return resolve(args.target).gguf_path


def _threads(args) -> int:
    if args.threads:
        return args.threads
    import torch

    return torch.get_num_threads()

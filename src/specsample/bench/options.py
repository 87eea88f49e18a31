"""The `bench` subcommand's options: defaults, the parser's arguments, their checks, and
what they name (the target's type, draft lengths, the report's command and machine lines),
shared by the per-sequence run (sequence_run.py), bench serve (serve_run.py) and the
research bench (benchmarks/bench.py: its presets, peers and llama-server on top)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..app.arguments import UsageError, add_model_arguments, add_trace_argument
from ..decoding.generate import VERIFIERS
from ..policy.make import K_MAX
from .modes import FAMILIES, SETTINGS
from .runner import BenchConfig
from .tables import machine_description
from .tasks import TASKS

# HumanEval completions and general chat, both settings, 8 prompts each, answers to their
# task's limit (the research bench, `make bench`, has defaults and presets of its own).
DEFAULTS = dict(tasks="humaneval,chat", settings="greedy,sample", modes="auto", ks="2,3,4", peer_k="3", prompts="8")
# serve: short HumanEval completions and long explanations (decoding dominates), both
# settings, 8 requests from 4 clients per endpoint (--clients).
SERVE_DEFAULTS = dict(tasks="humaneval,explain", modes="auto", prompts="8")
# Each load three times: one load's tokens/s moved by more than the differences looked for (issue 41),
# and the range of three says how far a median can be trusted.
SERVE_REPEATS = 3
# The bench's prompts and answers are short: its models are loaded with this context, not the
# trained 32k (whose KV caches would cost ~1.3 GB and their clearing time at every load);
# --serve's servers get what their longest prompt and answer need, as llama-server does.
BENCH_CONTEXT = 4096


def add_bench_arguments(b, defaults: dict | None = None) -> None:
    """The bench subcommand's options, model options included; `defaults` over DEFAULTS
    in their help (the research bench's, as resolve_options takes them)."""
    add_model_arguments(b)
    b.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory (default results/bench)")
    tasks = ", ".join(f"{t.name} ({'chat' if t.chat else 'raw prompt'}, <= {t.max_new_tokens} tokens)" for t in TASKS.values())
    b.add_argument("--tasks", help=f"comma list of {tasks} (default {({**DEFAULTS, **(defaults or {})})['tasks']})")
    b.add_argument("--prompts-file", type=Path, metavar="FILE",
                   help="your own prompts as the task 'prompts', run instead of the default tasks (or beside those "
                        "--tasks names): JSON lines of {\"prompt\": ...} or {\"messages\": [...]}, with an optional "
                        "\"kind\" that gets rows of its own; every line runs unless --prompts prompts=N")
    b.add_argument("--settings", help=f"comma list of {', '.join(SETTINGS)} (default both; sample = T 0.8, top-p 0.95)")
    b.add_argument("--modes", help=f"'auto' or a comma list of {', '.join(FAMILIES)} (auto: all that fit the backends "
                                   "but spec-token and spec-auto-token, spec and spec-auto verified token by token; "
                                   "the research bench, python -m benchmarks.bench, adds llama-server and other peers)")
    b.add_argument("--ks", help="draft lengths K of the spec sweep (default 2,3,4)")
    b.add_argument("--k-max", type=int, default=K_MAX,
                   help=f"the most drafts spec-auto (-k auto) proposes in a round (default {K_MAX}, as generate's "
                        f"and serve's --k-max)")
    b.add_argument("--peer-k", help="K of ngram (and the research bench's peers), or a comma list for a mode per K (default 3)")
    b.add_argument("--prompts", help="prompts per task: N, or task=N,... (default 8)")
    b.add_argument("--max-new-tokens", type=int, help="cap every task's answer length (default: each task's own; for smoke runs)")
    b.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed + i in every mode")
    b.add_argument("--verifier", choices=VERIFIERS, default="auto",
                   help="how our drafting modes verify, as generate's --verifier (auto, the default: coupled, as "
                        "every prompt is seeded); spec-token and spec-auto-token verify token by token whatever it "
                        "says, e.g. beside spec and spec-auto under --verifier block (docs/verification.md)")
    b.add_argument("--serve", action="store_true",
                   help="measure serving instead (the same as the word serve): each --url endpoint in turn gets each "
                        "task's prompts from each --clients count of concurrent streaming clients (tasks default "
                        "humaneval,explain); writes serve.md and serve.jsonl")
    b.add_argument("--clients", default="4", help="serve: concurrent clients, N or a comma list (default 4)")
    add_serve_arguments(b)
    add_trace_argument(b, " of the spec-auto mode, its warm-up first, then every prompt and setting (each line "
                          "tagged with the target type; with --serve, each -k auto server writes its own file: FILE's name "
                          "with the mode and slot count, and the target type where several run)")


def add_serve_arguments(b) -> None:
    """bench serve's word and options beyond --serve's: repeated loads, and endpoints
    the user runs (endpoints.py)."""
    b.add_argument("what", nargs="?", choices=("serve",),
                   help="serve: the serving load (the same as --serve; with --url, against your own endpoints)")
    b.add_argument("--url", action="append", metavar="[NAME=]URL",
                   help="serve: an OpenAI-compatible endpoint you run (specsample serve, llama-server, vLLM, ...), "
                        "e.g. ours=http://127.0.0.1:8080/v1 (repeat for each endpoint compared); nothing is started, "
                        "prompts go out as text to /v1/chat/completions (chat tasks) or /v1/completions")
    b.add_argument("--baseline", metavar="NAME", help="serve --url: the endpoint the ratios are to (default the first)")
    b.add_argument("--model-name", help="serve --url: the model every request names (default: each endpoint's "
                                        "first in /v1/models)")
    b.add_argument("--api-key", help="serve --url: the key sent to every endpoint (default $SPECSAMPLE_API_KEY)")
    b.add_argument("--repeats", type=int, metavar="R",
                   help="serve: send each load R times, in rounds that turn the servers' order by one each time; "
                        "the report gives the median and range (default 3)")


def resolve_options(args, defaults: dict | None = None, preset: dict | None = None) -> argparse.Namespace:
    """Explicit options win over the preset (a research bench's), the preset over the
    defaults (DEFAULTS, with `defaults` over them: the research bench's)."""
    args.serve = args.serve or getattr(args, "what", None) == "serve" or bool(getattr(args, "url", None))
    if args.serve and getattr(args, "repeats", None) is None:
        args.repeats = SERVE_REPEATS
    preset = {**(SERVE_DEFAULTS if args.serve else {}), **(preset or {})}
    if getattr(args, "prompts_file", None) is not None:  # the user's own prompts, besides what --tasks names
        from .prompts_file import NAME, register

        register(args.prompts_file)  # a bad file fails now, before any model loads
        args.tasks = ",".join(t for t in (args.tasks, NAME) if t)
    for name, default in {**DEFAULTS, **(defaults or {})}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, preset.get(name, default))
    return args


def bench_config(args) -> BenchConfig:
    """The run's tasks, settings, prompt counts and answer cap, each checked."""
    tasks = names(args.tasks, TASKS, "task")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    default, counts = parse_prompts(args.prompts, tasks)
    if "prompts" in tasks and "prompts" not in counts:  # a prompts file runs whole unless told otherwise
        counts["prompts"] = len(TASKS["prompts"].load())
    return BenchConfig(tasks=tasks, settings=names(args.settings, SETTINGS, "setting"), prompts=counts,
                       default_prompts=default, max_new_tokens=args.max_new_tokens, seed=args.seed)


def parse_prompts(text: str, tasks: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    """"8" -> (8, {}); "humaneval=8,copy=4" -> (8, {"humaneval": 8, "copy": 4}): a
    task not named gets the largest count given."""
    counts = {}
    try:
        for item in text.split(",") if "=" in text else [f"={text}"]:
            task, n = item.split("=")
            counts[task.strip()] = int(n)
    except ValueError:
        raise UsageError(f"--prompts takes N or task=N,...; got {text!r}") from None
    if min(counts.values()) < 1:
        raise UsageError(f"--prompts must be >= 1; got {text!r}")
    if "" in counts:
        return counts[""], {}
    unknown = set(counts) - set(tasks)
    if unknown:
        raise UsageError(f"--prompts names tasks not being run: {', '.join(sorted(unknown))}")
    return max(counts.values()), counts


def names(text: str, allowed, what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in allowed:
            raise UsageError(f"unknown {what} {n!r}; choose from {', '.join(allowed)}")
    if not names:
        raise UsageError(f"no {what} given")
    return names


def draft_lengths(args) -> tuple[list[int], list[int]]:
    """--ks and --peer-k as lists of K >= 1 (and --k-max checked)."""
    if args.k_max < 1:
        raise UsageError(f"--k-max must be >= 1, got {args.k_max}")
    return list(counts(args.ks, "--ks")), list(counts(args.peer_k, "--peer-k"))


def serve_clients(args) -> tuple[int, ...]:
    """--clients as a tuple of counts >= 1, in the order given (--repeats checked)."""
    if args.repeats is not None and args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    return counts(args.clients, "--clients")


def counts(text, flag: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(n) for n in str(text).split(","))
    except ValueError:
        raise UsageError(f"{flag} takes N or a comma list of N; got {text!r}") from None
    if min(counts) < 1:
        raise UsageError(f"{flag} must be >= 1; got {text!r}")
    return counts


def target_label(target, args) -> str:
    """What the target's weights are: the GGUF file's own type, or the hf dtype."""
    path = getattr(target, "path", None)
    if is_llamacpp(target) and path is not None:
        from ..backends.reencode import file_type

        return file_type(path)
    return args.dtype


def command_line(args) -> str:
    """The report's command: the research bench's own (args.report_command), or this one's."""
    if getattr(args, "report_command", None):
        return args.report_command
    return shlex.join(["specsample"] + sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "specsample bench (library call)"


def threads(args) -> int:
    if args.threads:
        return args.threads
    import torch

    return torch.get_num_threads()


def is_llamacpp(target) -> bool:
    return target.engine == "llamacpp"


def machine_line(engine: str, args, load_at_start: float) -> str:
    """The report's machine line: the engine and threads, and how busy the machine was
    (other work on it skews every timing)."""
    machine = machine_description(engine, threads(args))
    return machine + f"; 1-minute load average {load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"

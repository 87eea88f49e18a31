"""The `bench` subcommand: parse, load the models once, run, write the report.

Over 400 lines, on purpose: the per-sequence run, --serve and --contention are one
subcommand and share its option checks, target types and the native server's start;
a module per run would import those back from here, in a cycle."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..arguments import UsageError, add_model_arguments, model_options
from ..assemble import assemble
from .budget import Cell, estimate_seconds, format_duration, trim_to_budget
from .costs import measure_cost_curve
from .modes import FAMILIES, OUR_FAMILIES, SETTINGS, OurMode, build_modes
from .native import LlamaServer, ensure_server
from .bandwidth import weight_bytes
from .records import Record
from .report import write_contention_report, write_report, write_serve_report
from .runner import BenchConfig, prepare, run_bench, run_parity, total_steps
from .servers import ServerUnavailable
from .summary import TargetRun
from .tables import machine_description
from .tasks import TASKS

# `make bench`: every task, both settings, 8 prompts each, answers to their task's limit, and 40
# HumanEval problems per mode for parity: a long run on a CPU (docs/benchmarks.md), so the estimate
# is printed up front and --budget-minutes trims prompts to fit. A preset replaces the defaults it names.
DEFAULTS = dict(tasks="humaneval,summarize,humaneval-chat,copy,structured", settings="greedy,sample", modes="auto",
                ks="2,3,4", peer_k="3", prompts="8", parity_prompts=40, parity_k=3, parity=True, plots=True,
                target_quants=None)
PRESETS = {
    # `make demo`: HumanEval completions to the end of the function on the llama.cpp
    # backend, on the default target as shipped (Q4_K_M: compute-bound calls) and on
    # its BF16 re-encoding (memory-bound: the regime speculation is for), each beside
    # llama.cpp's own speculative decoding on the same files; short enough for a first
    # look (docs/benchmarks.md: its time on the project's machine).
    "demo": dict(tasks="humaneval", settings="greedy", modes="ar,spec-auto,spec,llamacpp-spec", ks="4", peer_k="4",
                 prompts="4", parity=False, plots=False, target_quants="q4_k_m,bf16"),
}
# --serve: short HumanEval completions and long explanations (decoding dominates), both
# settings, 8 requests from 4 clients per server, on 1 and 4 slots (--clients, --slots).
SERVE_DEFAULTS = dict(tasks="humaneval,explain", modes="auto", prompts="8")
# The bench's prompts and answers are short: its models are loaded with this context, not the
# trained 32k (whose KV caches would cost ~1.3 GB and their clearing time at every load);
# --serve's servers get what their longest prompt and answer need, as llama-server does.
BENCH_CONTEXT = 4096


def add_bench_parser(subparsers) -> None:
    b = subparsers.add_parser("bench", help="measure speedups, acceptance and parity against peers",
                              description="Reproduce the speculative sampling measurements on your models and hardware.")
    add_model_arguments(b)
    b.add_argument("--preset", choices=list(PRESETS),
                   help="demo: humaneval, 4 prompts, greedy, ar/spec-auto/spec-k4/llamacpp-spec-k4, on the target as "
                        "given (q4_k_m) and on its bf16 re-encoding")
    b.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory (default results/bench)")
    tasks = ", ".join(f"{t.name} ({'chat' if t.chat else 'raw prompt'}, <= {t.max_new_tokens} tokens)" for t in TASKS.values())
    b.add_argument("--tasks", help=f"comma list of {tasks} (default all)")
    b.add_argument("--settings", help=f"comma list of {', '.join(SETTINGS)} (default both; sample = T 0.8, top-p 0.95)")
    b.add_argument("--modes", help=f"'auto' or a comma list of {', '.join(FAMILIES)} (auto: all that fit the backends; "
                                   "llamacpp-spec is llama.cpp's own speculative decoding, llama-server -md, built once)")
    b.add_argument("--target-quants",
                   help="run every mode on each of these target types in turn, each against its own ar, with a "
                        "table by type: the GGUF file's own type (e.g. q4_k_m) and any of bf16, f16, q8_0 "
                        "(re-encoded once, cached); e.g. q4_k_m,bf16")
    b.add_argument("--ks", help="draft lengths K of the spec sweep (default 2,3,4)")
    b.add_argument("--k-max", type=int, default=8,
                   help="the most drafts spec-auto (-k auto) proposes in a round (default 8, as generate's and "
                        "serve's --k-max)")
    b.add_argument("--peer-k", help="K of ngram, hf-assisted, llamacpp-lookup and llamacpp-spec, or a comma list for a "
                                   "mode per K (default 3)")
    b.add_argument("--prompts", help="prompts per task: N, or task=N,... (default 8)")
    b.add_argument("--max-new-tokens", type=int, help="cap every task's answer length (default: each task's own; for smoke runs)")
    b.add_argument("--budget-minutes", type=float, help="trim prompts (never tokens) so the estimated run fits")
    b.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed + i in every mode")
    b.add_argument("--no-parity", dest="parity", action="store_false", default=None, help="skip the HumanEval pass@1 check")
    b.add_argument("--parity-prompts", type=int, help="HumanEval problems sampled per mode for pass@1 (default 40)")
    b.add_argument("--parity-k", type=int, help="K of the spec mode compared with ar for parity (default 3)")
    b.add_argument("--cost-reps", type=int, default=5, help="timed calls per point of the cost curve (default 5)")
    b.add_argument("--no-build", dest="build", action="store_false", help="skip llamacpp-spec unless llama-server is already built")
    b.add_argument("--no-plots", dest="plots", action="store_false", default=None, help="skip the PNG plots")
    b.add_argument("--serve", action="store_true",
                   help="measure serving instead: each server in turn (modes: ar, spec-auto, spec, llamacpp-server, "
                        "llamacpp-spec; default all but spec), started once per --slots count, gets each task's "
                        "prompts from each --clients count of concurrent streaming clients (tasks default "
                        "humaneval,explain); writes serve.md and serve.jsonl")
    b.add_argument("--clients", default="4", help="--serve: concurrent clients, N or a comma list (default 4)")
    b.add_argument("--slots", default="1,4",
                   help="--serve: requests each server decodes at once, N or a comma list: specsample serve "
                        "--parallel N, llama-server -np N (default 1,4)")
    b.add_argument("--contention", action="store_true",
                   help="measure instead how two model processes at once slow each other, with and without "
                        "specsample's core sharing, writing contention.md")
    b.add_argument("--neighbour", type=int, default=0, metavar="N",
                   help="run N busy processes (one spinning thread each) beside the whole benchmark, as a user's "
                        "other programs would; the report's machine line says so")
    b.add_argument("--rpc-delay-ms", type=float, default=None, metavar="MS",
                   help="with --target-rpc: reach each worker through a local relay that delays every message by "
                        "MS one way (a network's latency on one machine; docs/distributed.md)")
    b.set_defaults(func=cmd_bench, ctx_size=BENCH_CONTEXT)


def resolve_options(args) -> argparse.Namespace:
    """Explicit options win over the preset, the preset over the defaults."""
    preset = {**(SERVE_DEFAULTS if args.serve else {}), **PRESETS.get(args.preset, {})}
    for name, default in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, preset.get(name, default))
    return args


def bench_config(args) -> BenchConfig:
    tasks = _names(args.tasks, TASKS, "task")
    default, counts = parse_prompts(args.prompts, tasks)
    return BenchConfig(tasks=tasks, settings=_names(args.settings, SETTINGS, "setting"), prompts=counts,
                       default_prompts=default, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       parity_prompts=args.parity_prompts if args.parity else 0)


def parse_prompts(text: str, tasks: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    """"8" -> (8, {}); "humaneval=8,copy=4" -> (8, {"humaneval": 8, "copy": 4}): a
    task not named gets the largest count given."""
    counts = {}
    try:
        if "=" not in text:
            return int(text), {}
        for item in text.split(","):
            task, n = item.split("=")
            counts[task.strip()] = int(n)
    except ValueError:
        raise UsageError(f"--prompts takes N or task=N,...; got {text!r}") from None
    unknown = set(counts) - set(tasks)
    if unknown:
        raise UsageError(f"--prompts names tasks not being run: {', '.join(sorted(unknown))}")
    return max(counts.values()), counts


def check_remote_modes(args, families) -> None:
    """With --target-rpc, only our own modes: a peer (transformers, llama-server) would run
    the target on this machine, and its row would compare a local target with ours."""
    local = [f for f in families if f not in OUR_FAMILIES]
    if getattr(args, "target_rpc", None) and local:
        raise UsageError(f"--target-rpc runs the target on its workers in {', '.join(OUR_FAMILIES)} only; "
                         f"{', '.join(local)} would run it here (pass --modes)")


def cmd_bench(args) -> int:
    args = resolve_options(args)
    with delayed_workers(args):
        return bench_command(args)


@contextlib.contextmanager
def delayed_workers(args):
    """--rpc-delay-ms: a relay in front of each --target-rpc worker for the whole run, its
    round trip measured and printed; the models then reach the workers through them."""
    delay = args.rpc_delay_ms
    if delay is None:
        yield
        return
    if not getattr(args, "target_rpc", None):
        raise UsageError("--rpc-delay-ms delays the messages to --target-rpc workers; none is named")
    if delay < 0:
        raise UsageError(f"--rpc-delay-ms must be >= 0, got {delay:g}")
    from ..rpc import parse_workers
    from .relay import DelayRelay

    try:
        workers = parse_workers(args.target_rpc, args.tensor_split)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with contextlib.ExitStack() as stack:
        relays = [stack.enter_context(DelayRelay(endpoint, delay / 1000)) for endpoint in workers.endpoints]
        print(f"specsample: bench: the workers through relays delaying each message {delay:g} ms one way "
              f"({', '.join(f'{w} via {r.endpoint}' for w, r in zip(workers.endpoints, relays))})",
              file=sys.stderr, flush=True)
        original = args.target_rpc
        args.target_rpc = ",".join(r.endpoint for r in relays)
        try:
            yield
        finally:
            args.target_rpc = original


def bench_command(args) -> int:
    from .neighbour import busy_neighbours

    if args.neighbour < 0:
        raise UsageError(f"--neighbour must be >= 0, got {args.neighbour}")
    with busy_neighbours(args.neighbour):
        return _bench_command(args)


def _bench_command(args) -> int:
    from .bandwidth import measure_read_bandwidth

    if args.contention and args.target_quants:
        raise UsageError("--target-quants runs the per-sequence benchmark or --serve; with --contention give one "
                         "--target-quant")
    if args.serve:
        return cmd_serve_load(args)
    if args.contention:
        return cmd_contention(args)
    load_at_start = os.getloadavg()[0]
    config = bench_config(args)  # validates before the slow model loads
    families = list(FAMILIES) if args.modes == "auto" else _names(args.modes, FAMILIES, "mode")
    check_remote_modes(args, families)
    ks, peer_ks = draft_lengths(args)
    types = target_types(args)
    options = model_options(args)
    models = assemble(replace(options, target_quant=types[0][1]), drafting=args.draft != "ngram")
    draft, target = models.draft, models.target
    del models  # each target type is loaded in turn; only the draft stays
    read_bandwidth = measure_read_bandwidth(_threads(args))
    runs, notes = [], []
    engine = "gguf" if _is_llamacpp(target) else args.dtype
    for i, (label, quant) in enumerate(types):
        if target is None:
            target = assemble(replace(options, target_quant=quant), drafting=False).target
        label = label or target_label(target, args)
        if len(types) > 1:
            print(f"specsample: target {label}", file=sys.stderr, flush=True)
        records, curve, run_notes = _bench_target(args, config, families, ks, peer_ks, target, draft, parity=i == 0)
        gguf = getattr(target, "path", None)
        runs.append(TargetRun(label, [replace(r, target=label) for r in records], curve, weight_bytes(target, gguf)))
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
        target = None  # free it before the next type loads
    machine = machine_description(engine, _threads(args))
    # Other work on the machine skews every timing: say how busy it was.
    machine += f"; 1-minute load average {load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    if args.neighbour:
        machine += f"; {args.neighbour} busy neighbour process(es) spinning beside the run (--neighbour)"
    table = write_report(args.out, runs, command=_command(), machine=machine, notes=notes, plots=args.plots,
                         read_bandwidth=read_bandwidth)
    print(table)
    print(f"specsample: wrote {args.out}/records.jsonl and {args.out}/summary.md", file=sys.stderr)
    return 0


def _bench_target(args, config, families, ks, peer_ks, target, draft, parity: bool) -> tuple[list[Record], object, list[str]]:
    """Every mode on one target type: its cost curve, then the interleaved runs."""
    counts = {t: config.prompt_count(t) for t in config.tasks}
    prompts = prepare(target, config.tasks, counts)
    parity_count = config.parity_prompts if parity else 0
    parity_prompts = prepare(target, ("humaneval",), {"humaneval": parity_count})["humaneval"] if parity_count else []
    longest = max(len(p.ids) for group in list(prompts.values()) + [parity_prompts] for p in group)
    most_tokens = max(config.new_tokens(t) for t in config.tasks + ("humaneval",))
    n_ctx = longest + most_tokens + max(ks + peer_ks + [args.k_max]) + 16
    if n_ctx > target.context_length:  # before the cost curve's minute, not at the first long prompt
        raise UsageError(f"these prompts and answers need {n_ctx} tokens of context, and the target was loaded with "
                         f"{target.context_length}: give --ctx-size {n_ctx} (or a smaller --max-new-tokens)")
    curve = _cost_curve(target, draft, prompts, max(ks) + 1 if "spec" in families else 1, args.cost_reps)
    gguf = getattr(target, "path", None) if _is_llamacpp(target) else None
    try:
        server, no_server = _start_server(args, families, n_ctx, max(ks + peer_ks), gguf, loaded_draft=draft), None
    except ServerUnavailable as e:
        server, no_server = None, str(e)
    try:
        modes, skipped = build_modes(families, ks, peer_ks, target, draft, target_gguf=gguf, ngram_max=args.ngram_max,
                                     n_ctx=n_ctx, k_max=args.k_max, server=server, no_server=no_server)
        notes = [f"not run: {n}" for n in skipped]
        parity_modes = _parity_modes(target, draft, args.parity_k) if parity_prompts else []
        if parity_count and not parity_modes:
            notes.append("parity: skipped, no draft model")
        prompts, parity_prompts = _plan(args, config, curve, modes, prompts, parity_prompts, len(parity_modes), notes)
        records = _run(modes, prompts, config, parity_modes, parity_prompts)
    finally:
        if server is not None:
            server.close()
    return records, curve, notes


def draft_lengths(args) -> tuple[list[int], list[int]]:
    """--ks and --peer-k as lists of K >= 1 (and --k-max checked)."""
    if args.k_max < 1:
        raise UsageError(f"--k-max must be >= 1, got {args.k_max}")
    return list(_counts(args.ks, "--ks")), list(_counts(args.peer_k, "--peer-k"))


def target_types(args) -> list[tuple[str | None, str]]:
    """(label, --target-quant value) for each target type to run: one, or each of
    --target-quants, where the target file's own type means the file as given."""
    if not args.target_quants:
        return [(None, args.target_quant)]
    if args.target_quant != "none":
        raise UsageError("give --target-quant or --target-quants, not both")
    from ..backends.reencode import TARGET_QUANTS, file_type
    from ..models import resolve

    gguf = resolve(args.target).gguf_path
    if gguf is None:
        raise UsageError("--target-quants re-encodes a GGUF target file; this target is not one")
    own = file_type(gguf)
    types = []
    for name in _names(args.target_quants, [own, *TARGET_QUANTS], "--target-quants type"):
        types.append((name, "none" if name == own else name))
    return types


def target_label(target, args) -> str:
    """What the target's weights are: the GGUF file's own type, or the hf dtype."""
    path = getattr(target, "path", None)
    if _is_llamacpp(target) and path is not None:
        from ..backends.reencode import file_type

        return file_type(path)
    return args.dtype


def cmd_serve_load(args) -> int:
    from .serve_summary import serve_sections
    from .serving import DEFAULT_SERVE_FAMILIES, SERVE_FAMILIES, Load, run_serving, served_modes

    load_at_start = os.getloadavg()[0]
    config = bench_config(args)
    if any(TASKS[t].held for t in config.tasks):
        raise UsageError("--serve sends plain requests: run tasks held to a grammar (structured, tools) without --serve")
    families = DEFAULT_SERVE_FAMILIES if args.modes == "auto" else _names(args.modes, SERVE_FAMILIES, "--serve mode")
    check_remote_modes(args, families)
    ks, peer_ks = draft_lengths(args)
    clients, slots = serve_axes(args)
    types = target_types(args)
    # The first type's target, for its tokenizer (prompts go out as token ids) and file.
    target = assemble(replace(model_options(args), target_quant=types[0][1]), drafting=False).target
    prompts = prepare(target, config.tasks, {t: config.prompt_count(t) for t in config.tasks})
    files = [getattr(target, "path", None) if _is_llamacpp(target) else None]
    files += [_target_file(args, quant) if files[0] else None for _, quant in types[1:]]
    labels = [label or target_label(target, args) for label, _ in types]
    # Each slot holds one request: its context fits the longest prompt and answer.
    n_ctx = max(len(p.ids) for group in prompts.values() for p in group)
    n_ctx += max(config.new_tokens(t) for t in config.tasks) + max(ks + peer_ks) + 16
    del target  # the servers load their own copies; this process only sends requests

    load = Load(prompts, config.settings, clients, config.new_tokens)
    records, notes, splits = [], [], []
    for (_, quant), label, gguf in zip(types, labels, files):
        if len(types) > 1:
            print(f"specsample: target {label}", file=sys.stderr, flush=True)
        llama_server = partial(_start_server, args, ["llamacpp-spec"], n_ctx, max(peer_ks), gguf)
        got, run_notes, got_splits = run_serving(served_modes(families, ks, peer_ks), load, slots,
                                                 model_argv=serve_argv(args, quant, n_ctx),
                                                 llama_server=llama_server)
        records += [replace(r, target=label) for r in got]
        splits += [replace(s, target=label) for s in got_splits]
        notes += [f"{label}: {n}" if len(types) > 1 else n for n in run_notes]
    machine = machine_description("gguf" if files[0] else args.dtype, _threads(args))
    machine += f"; 1-minute load average {load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    if args.neighbour:
        machine += f"; {args.neighbour} busy neighbour process(es) spinning beside the run (--neighbour)"
    sections, printed = serve_sections(records, splits)
    write_serve_report(args.out, records, sections, command=_command(), machine=machine, notes=notes, splits=splits)
    print(printed)
    print(f"specsample: wrote {args.out}/serve.jsonl, calls.jsonl and serve.md", file=sys.stderr)
    return 0


def serve_axes(args) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """--clients and --slots as tuples of counts >= 1, in the order given."""
    return _counts(args.clients, "--clients"), _counts(args.slots, "--slots")


def _counts(text, flag: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(n) for n in str(text).split(","))
    except ValueError:
        raise UsageError(f"{flag} takes N or a comma list of N; got {text!r}") from None
    if min(counts) < 1:
        raise UsageError(f"{flag} must be >= 1; got {text!r}")
    return counts


def cmd_contention(args, reps: int = 6, tokens: int = 32) -> int:
    from .contention import CONFIGURATIONS, contention_sections, measure

    results = []
    for label, env in CONFIGURATIONS:
        print(f"specsample: contention: {label}", file=sys.stderr, flush=True)
        results.append(measure(model_options(args).argv(), label, env, reps=reps, tokens=tokens))
    machine = machine_description("gguf" if args.backend != "hf" else args.dtype, _threads(args))
    sections, table = contention_sections(results, reps, tokens)
    write_contention_report(args.out, sections, command=_command(), machine=machine)
    print(table)
    return 0


def serve_argv(args, target_quant: str | None = None, n_ctx: int | None = None) -> list[str]:
    """This run's model arguments for a `specsample serve` child process (the target
    re-encoded as target_quant says, when given; each slot's context n_ctx, when given),
    with a queue that holds every client and never times out."""
    options = replace(model_options(args), target_quant=target_quant or args.target_quant,
                      ctx_size=n_ctx or args.ctx_size)
    queue = max(16, *_counts(args.clients, "--clients"))
    return options.argv() + ["--max-queue", str(queue), "--queue-timeout", "3600"]


def _command() -> str:
    return shlex.join(["specsample"] + sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "specsample bench (library call)"


def _cost_curve(target, draft, prompts, max_tokens: int, reps: int):
    """The cost curve when spec runs; else the 1-token point alone (the estimate's rate)."""
    context = next(iter(prompts.values()))[0].ids
    print(f"specsample: measuring the cost curve at {len(context)} tokens of context", file=sys.stderr)
    return measure_cost_curve(target, draft if max_tokens > 1 else None, context, max_tokens, reps=reps)


def _plan(args, config, curve, modes, prompts, parity_prompts, n_parity_modes: int, notes: list[str]):
    """Print the time estimate; trim prompts to --budget-minutes."""
    cells = {task: Cell(len(group), len(modes) * len(config.settings), config.new_tokens(task),
                        sum(len(p.ids) for p in group) / len(group)) for task, group in prompts.items()}
    if parity_prompts:
        cells["parity"] = Cell(len(parity_prompts), n_parity_modes, config.new_tokens("humaneval"),
                               sum(len(p.ids) for p in parity_prompts) / len(parity_prompts))
    rates = (curve.target_cost[0], curve.prefill_seconds / curve.context_tokens)
    estimate = estimate_seconds(cells, *rates)
    print(f"specsample: estimated at most {format_duration(estimate)} ({len(modes)} modes; every answer priced at its "
          f"task's token limit and the autoregressive rate of {1 / rates[0]:.1f} tokens/s)", file=sys.stderr)
    if args.budget_minutes and estimate > 60 * args.budget_minutes:
        kept = trim_to_budget(cells, *rates, 60 * args.budget_minutes)
        prompts = {task: group[: kept[task]] for task, group in prompts.items()}
        parity_prompts = parity_prompts[: kept.get("parity", 0)]
        trimmed = ", ".join(f"{task} {cells[task].prompts}->{n}" for task, n in kept.items())
        notes.append(f"--budget-minutes {args.budget_minutes:g} trimmed prompts: {trimmed}")
        print(f"specsample: trimmed to fit {args.budget_minutes:g} minutes: {trimmed}; now at most "
              f"{format_duration(estimate_seconds({t: replace(c, prompts=kept[t]) for t, c in cells.items()}, *rates))}",
              file=sys.stderr)
    return prompts, parity_prompts


def _run(modes, prompts, config, parity_modes, parity_prompts) -> list[Record]:
    from tqdm import tqdm

    steps = total_steps(modes, prompts, config, len(parity_modes), len(parity_prompts))
    with tqdm(total=steps, file=sys.stderr, desc="bench", unit="gen") as progress:
        records = run_bench(modes, prompts, config, progress)
        records += run_parity(parity_modes, parity_prompts, config, progress) if parity_modes else []
    return records


def _start_server(args, families, n_ctx: int, k_max: int, target_gguf: Path | None, parallel: int = 1,
                  loaded_draft=None) -> LlamaServer | None:
    """A running llama-server for the native peer on the target file our modes run
    (re-encoded as --target-quant says), with `parallel` slots of n_ctx tokens each;
    None when no mode asks for one. Raises ServerUnavailable with the one-line reason
    when it cannot run here."""
    if not {"llamacpp-spec", "llamacpp-server"} & set(families):
        return None
    from ..models import resolve

    if args.draft == "ngram":
        raise ServerUnavailable("needs a draft model")
    draft = resolve(args.draft)
    if target_gguf is None or draft.gguf_path is None:
        raise ServerUnavailable("needs GGUF files for target and draft")
    binary = ensure_server(build=args.build, jobs=min(2, os.cpu_count() or 1))
    # The peer gets the very files our modes use (the draft as requantized by --draft-quant).
    draft_path = getattr(loaded_draft, "path", None) or _draft_file(args, draft.gguf_path)
    return LlamaServer(binary, target_gguf, draft_path, threads=_threads(args), n_ctx=n_ctx, k_max=k_max,
                       parallel=parallel)


def _target_file(args, quant: str) -> Path:
    """The target file our servers load for a --target-quants type: the GGUF file as
    given, or its re-encoding (made once, cached)."""
    from ..backends.reencode import reencoded
    from ..models import resolve

    gguf = resolve(args.target).gguf_path
    return gguf if quant == "none" else reencoded(gguf, quant)


def _draft_file(args, gguf: Path) -> Path:
    """The draft file our llama.cpp modes load: requantized as --draft-quant says."""
    if args.draft_quant == "none":
        return gguf
    from ..backends.reencode import reencoded

    return reencoded(gguf, args.draft_quant)


def _parity_modes(target, draft, k: int) -> list:
    if draft is None:
        return []
    return [OurMode("ar", "ar", target), OurMode(f"spec-k{k}", "spec", target, k, draft)]


def _names(text: str, allowed, what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in allowed:
            raise UsageError(f"unknown {what} {n!r}; choose from {', '.join(allowed)}")
    if not names:
        raise UsageError(f"no {what} given")
    return names


def _is_llamacpp(target) -> bool:
    return target.engine == "llamacpp"


def _threads(args) -> int:
    if args.threads:
        return args.threads
    import torch

    return torch.get_num_threads()

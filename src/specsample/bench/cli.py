"""The `bench` subcommand: parse, load the models once, run, write the report.

The per-sequence run, --serve and --contention are one subcommand: they share its
options (options.py), target types and the native server's start."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..app.arguments import UsageError, model_options
from ..app.assemble import assemble
from .budget import Cell, estimate_seconds, format_duration, trim_to_budget
from .costs import measure_cost_curve
from .modes import FAMILIES, OUR_FAMILIES, OurMode, build_modes
from .native import LlamaServer, ensure_server
from .options import BENCH_CONTEXT, add_bench_arguments, bench_config, names, resolve_options
from .bandwidth import weight_bytes
from .records import Record
from .report import write_contention_report, write_report, write_serve_report
from .runner import prepare, run_bench, run_parity, total_steps
from .servers import ServerUnavailable
from .summary import TargetRun
from .tables import machine_description
from .tasks import TASKS

def add_bench_parser(subparsers) -> None:
    b = subparsers.add_parser("bench", help="measure speedups, acceptance and parity against peers",
                              description="Reproduce the speculative sampling measurements on your models and hardware.")
    add_bench_arguments(b)
    b.set_defaults(func=cmd_bench, ctx_size=BENCH_CONTEXT)


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
    from ..backends.rpc import parse_workers
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
    families = list(FAMILIES) if args.modes == "auto" else names(args.modes, FAMILIES, "mode")
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
    from ..backends.models import resolve

    gguf = resolve(args.target).gguf_path
    if gguf is None:
        raise UsageError("--target-quants re-encodes a GGUF target file; this target is not one")
    own = file_type(gguf)
    types = []
    for name in names(args.target_quants, [own, *TARGET_QUANTS], "--target-quants type"):
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
    families = DEFAULT_SERVE_FAMILIES if args.modes == "auto" else names(args.modes, SERVE_FAMILIES, "--serve mode")
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
    from ..backends.models import resolve

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
    from ..backends.models import resolve

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


def _is_llamacpp(target) -> bool:
    return target.engine == "llamacpp"


def _threads(args) -> int:
    if args.threads:
        return args.threads
    import torch

    return torch.get_num_threads()

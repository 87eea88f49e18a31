"""The research bench: `specsample bench` with the research options on top.

    python -m benchmarks.bench --out results/bench                  # as `make bench`
    python -m benchmarks.bench --preset demo --backend llamacpp     # as `make demo`
    python -m benchmarks.bench --modes ar,spec,hf-generate,hf-assisted --backend hf
    python -m benchmarks.bench --target-rpc HOST:PORT --rpc-delay-ms 5 --modes ar,spec-auto

Everything `specsample bench` takes, and: the peers' modes (llama-server plain and -md,
native.py; transformers and llama-cpp-python, peers.py), the demo's preset, the cost
curve and the analytic prediction beside the measured speedups (costs.py), the read
bandwidth ceiling (bandwidth.py), the plots (plots.py), HumanEval pass@1 of ar against
spec (parity.py, on the first target type), --budget-minutes (budget.py), --neighbour and --rpc-delay-ms
around the whole run (neighbour.py, relay.py), and --serve without --url: the servers
started here, each in turn, per --slots count (serving.py, serve_run.py; calls.py:
where our servers' time went). A --serve run takes the last two only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

from specsample.app.arguments import UsageError
from specsample.bench import sequence_run
from specsample.bench import serve_run as url_run
from specsample.bench.modes import OurMode
from specsample.bench.options import BENCH_CONTEXT, add_bench_arguments, draft_lengths, resolve_options, threads
from specsample.bench.runner import prepare
from specsample.bench.stats import summarise

from . import serve_run
from .bandwidth import bandwidth_table, measure_read_bandwidth, weight_bytes
from .budget import TaskLoad, estimate_seconds, format_duration, trim_to_budget
from .costs import PREDICTION_NOTE, cost_section, measure_cost_curve, prediction_section, predictions_by_group
from .native import FAMILIES as LLAMA_SERVER_FAMILIES
from .native import build_llama_server_modes, start_server
from .neighbour import busy_neighbours
from .parity import PARITY_NOTE, parity_table, pass_rates, run_parity
from .peers import PEER_FAMILIES, build_peer_modes, check_remote_modes
from .plots import plot_section
from .relay import DelayRelay
from .rounds import round_sections
from .servers import ServerUnavailable
from .targets import by_target_section, target_types
from .tasks import task_sections

# A research run's defaults, beside the bench's: 40 HumanEval problems per mode for parity.
DEFAULTS = dict(parity=True, parity_prompts=40, parity_k=3)
# Over the bench's: `make bench` runs every task of both (tasks.py: the research ones), both settings,
# and draws its plots.
BENCH_DEFAULTS = dict(tasks="humaneval,summarize,humaneval-chat,copy,structured", plots=True, target_quants=None)
PRESETS = {
    # `make demo`: HumanEval completions to the end of the function on the llama.cpp
    # backend, on the default target as shipped (Q4_K_M: compute-bound calls) and on
    # its BF16 re-encoding (memory-bound: the regime speculation is for), each beside
    # llama.cpp's own speculative decoding and plain llama-server on the same files; and
    # four general chat prompts (writing, translation, roleplay, a summary), where drafts
    # are seldom right; short enough for a first look (docs/benchmarks.md: its time here).
    "demo": dict(tasks="humaneval,chat", settings="greedy", modes="ar,spec-auto,spec,llamacpp-server,llamacpp-spec",
                 ks="4", peer_k="4", prompts="4", plots=False, target_quants="q4_k_m,bf16"),
}


def parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    add_bench_arguments(b, BENCH_DEFAULTS)
    b.set_defaults(ctx_size=BENCH_CONTEXT)
    b.epilog = (f"--modes also takes the peers {', '.join(LLAMA_SERVER_FAMILIES + PEER_FAMILIES)} here, and 'auto' "
                "runs them too (llamacpp-spec is llama.cpp's own speculative decoding, llama-server -md).")
    b.add_argument("--preset", choices=list(PRESETS),
                   help="demo: humaneval and chat, 4 prompts each, greedy, ar/spec-auto/spec-k4/llamacpp-server/"
                        "llamacpp-spec-k4, on the target as given (q4_k_m) and on its bf16 re-encoding")
    b.add_argument("--target-quants",
                   help="run every mode on each of these target types in turn, each against its own ar, with a "
                        "table by type: the GGUF file's own type (e.g. q4_k_m) and any of bf16, f16, q8_0 "
                        "(re-encoded once, cached); e.g. q4_k_m,bf16")
    b.add_argument("--no-plots", dest="plots", action="store_false", default=None, help="skip the PNG plots")
    b.add_argument("--llama-server", type=Path, metavar="PATH",
                   help="the llama-server binary of the llamacpp-server and llamacpp-spec modes (default: the build "
                        "of llama.cpp our backend runs, made by python -m benchmarks.llama_server)")
    b.add_argument("--budget-minutes", type=float, help="trim prompts (never tokens) so the estimated run fits")
    b.add_argument("--no-parity", dest="parity", action="store_false", default=None, help="skip the HumanEval pass@1 check")
    b.add_argument("--parity-prompts", type=int, help="HumanEval problems sampled per mode for pass@1 (default 40)")
    b.add_argument("--parity-k", type=int, help="K of the spec mode compared with ar for parity (default 3)")
    b.add_argument("--slots", default="1,4",
                   help="--serve without --url: the servers started here (modes: ar, spec-auto, spec, llamacpp-server, "
                        "llamacpp-spec; default all but spec), once per slot count N, each decoding N requests at "
                        "once: specsample serve --parallel N, llama-server -np N; N or a comma list (default 1,4)")
    b.add_argument("--cost-reps", type=int, default=5, help="timed calls per point of the cost curve (default 5)")
    b.add_argument("--neighbour", type=int, default=0, metavar="N",
                   help="run N busy processes (one spinning thread each) beside the whole benchmark, as a user's "
                        "other programs would; the report's notes say so")
    b.add_argument("--rpc-delay-ms", type=float, default=None, metavar="MS",
                   help="with --target-rpc or --draft-rpc: reach each worker through a local relay that delays every "
                        "message by MS one way (a network's latency on one machine; docs/distributed.md)")
    return b


def main(argv: list[str] | None = None) -> int:
    try:
        args = resolve(parser().parse_args(argv))
        args.report_command = shlex.join(["python", "-m", "benchmarks.bench", *(sys.argv[1:] if argv is None else argv)])
        if args.neighbour < 0:
            raise UsageError(f"--neighbour must be >= 0, got {args.neighbour}")
        with delayed_workers(args), busy_neighbours(args.neighbour):
            if args.serve:
                return url_run.run(args) if args.url else serve_run.run(args)
            with contextlib.closing(Research(args)) as research:
                return sequence_run.run(args, research)
    except UsageError as e:
        print(f"python -m benchmarks.bench: error: {e}", file=sys.stderr)
        return 2


def resolve(args) -> argparse.Namespace:
    """The bench's own resolution (resolve_options), then the research defaults: parity
    runs unless a preset or a prompts file is run, or --no-parity says otherwise."""
    args = resolve_options(args, BENCH_DEFAULTS, PRESETS.get(args.preset))
    if args.parity is None:
        args.parity = args.prompts_file is None and args.preset is None
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


@contextlib.contextmanager
def delayed_workers(args):
    """--rpc-delay-ms: a relay in front of each --target-rpc and --draft-rpc worker for
    the whole run; the models then reach the workers through them."""
    delay = args.rpc_delay_ms
    if delay is None:
        yield
        return
    flags = [f for f in ("target_rpc", "draft_rpc") if getattr(args, f, None)]
    if not flags:
        raise UsageError("--rpc-delay-ms delays the messages to --target-rpc or --draft-rpc workers; none is named")
    if delay < 0:
        raise UsageError(f"--rpc-delay-ms must be >= 0, got {delay:g}")
    from specsample.backends.rpc import parse_workers

    try:
        named = {f: parse_workers(getattr(args, f)).endpoints for f in flags}
    except ValueError as e:
        raise UsageError(str(e)) from None
    originals = {f: getattr(args, f) for f in flags}
    with contextlib.ExitStack() as stack:
        relays = {e: stack.enter_context(DelayRelay(e, delay / 1000)) for e in dict.fromkeys(sum(named.values(), ()))}
        print(f"benchmarks: the workers through relays delaying each message {delay:g} ms one way "
              f"({', '.join(f'{w} via {r.endpoint}' for w, r in relays.items())})", file=sys.stderr, flush=True)
        for f, endpoints in named.items():
            setattr(args, f, ",".join(relays[e].endpoint for e in endpoints))
        try:
            yield
        finally:
            for f, value in originals.items():
                setattr(args, f, value)


class Research:
    """sequence_run's research hooks (its docstring): the peers' modes (llama-server
    started per target type, closed after it), a cost curve per target type, the budget,
    parity on the first type, and their sections."""

    families = LLAMA_SERVER_FAMILIES + PEER_FAMILIES

    def __init__(self, args):
        self.args = args
        self.read_bandwidth = measure_read_bandwidth(threads(args))
        self.curves, self.notes = {}, []
        if args.neighbour:
            self.notes.append(f"{args.neighbour} busy neighbour process(es) spun beside the run (--neighbour)")
        self.parity_left = args.parity_prompts if args.parity else 0  # the first target type's
        self.curve = self.parity_modes = self.server = None
        self.types = []
        self.parity_prompts = []

    def check(self, families) -> None:
        check_remote_modes(self.args, families)

    def target_types(self) -> list[tuple[str | None, str]]:
        self.types = target_types(self.args)
        return self.types

    def overview(self, runs) -> str | None:
        return by_target_section(runs) if len(runs) > 1 else None

    def modes(self, families, peer_ks, target, draft, *, target_gguf, n_ctx, k_max, **where):
        """The peers' modes; llama-server's on a server started on this target type's file."""
        native = [f for f in families if f in LLAMA_SERVER_FAMILIES]
        try:
            self.server, no_server = start_server(self.args, native, n_ctx, k_max, target_gguf, loaded_draft=draft), None
        except ServerUnavailable as e:
            no_server = str(e)
        modes, skipped = build_llama_server_modes(native, peer_ks, self.server, no_server)
        more, not_run = build_peer_modes([f for f in families if f not in native], peer_ks, target, draft,
                                         target_gguf=target_gguf, n_ctx=n_ctx, **where)
        return modes + more, skipped + not_run

    def close(self) -> None:
        """Stop the target type's llama-server, if one runs."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def before(self, target, draft, prompts, modes, config, notes):
        """The cost curve, then parity's prompts and modes, then the estimate (and trim)."""
        ks, _ = draft_lengths(self.args)
        context = next(iter(prompts.values()))[0].ids
        spec = any(m.family == "spec" for m in modes)
        print(f"benchmarks: measuring the cost curve at {len(context)} tokens of context", file=sys.stderr)
        self.curve = measure_cost_curve(target, draft if spec else None, context, max(ks) + 1 if spec else 1,
                                        reps=self.args.cost_reps)
        self.parity_prompts, self.parity_modes = [], []
        if self.parity_left:
            if draft is None:
                notes.append("parity: skipped, no draft model")
            else:
                self.parity_prompts = prepare(target, ("humaneval",), {"humaneval": self.parity_left})["humaneval"]
                k = self.args.parity_k
                self.parity_modes = [OurMode("ar", "ar", target), OurMode(f"spec-k{k}", "spec", target, k, draft)]
            self.parity_left = 0
        return self._plan(config, modes, prompts, notes)

    def _plan(self, config, modes, prompts, notes):
        """Print the time estimate; trim prompts to --budget-minutes."""
        cells = {task: TaskLoad(len(group), len(modes) * len(config.settings), config.new_tokens(task),
                                sum(len(p.ids) for p in group) / len(group)) for task, group in prompts.items()}
        if self.parity_prompts:
            cells["parity"] = TaskLoad(len(self.parity_prompts), len(self.parity_modes), config.new_tokens("humaneval"),
                                       sum(len(p.ids) for p in self.parity_prompts) / len(self.parity_prompts))
        rates = (self.curve.target_cost[0], self.curve.prefill_seconds / self.curve.context_tokens)
        estimate = estimate_seconds(cells, *rates)
        print(f"benchmarks: estimated at most {format_duration(estimate)} ({len(modes)} modes; every answer priced at "
              f"its task's token limit and the autoregressive rate of {1 / rates[0]:.1f} tokens/s)", file=sys.stderr)
        budget = self.args.budget_minutes
        if budget and estimate > 60 * budget:
            kept = trim_to_budget(cells, *rates, 60 * budget)
            prompts = {task: group[: kept[task]] for task, group in prompts.items()}
            self.parity_prompts = self.parity_prompts[: kept.get("parity", 0)]
            trimmed = ", ".join(f"{task} {cells[task].prompts}->{n}" for task, n in kept.items())
            notes.append(f"--budget-minutes {budget:g} trimmed prompts: {trimmed}")
            now = estimate_seconds({t: replace(c, prompts=kept[t]) for t, c in cells.items()}, *rates)
            print(f"benchmarks: trimmed to fit {budget:g} minutes: {trimmed}; now at most {format_duration(now)}",
                  file=sys.stderr)
        self.config = config
        return prompts

    def after(self, label, target, draft, records):
        """llama-server stopped, then parity's samples, then this target's research sections."""
        self.close()
        if self.parity_modes and self.parity_prompts:
            records = records + run_parity(self.parity_modes, self.parity_prompts, self.config)
        self.curves[label] = self.curve
        weights = weight_bytes(target, getattr(target, "path", None))
        sections = research_sections(records, self.curve, weights, self.read_bandwidth)
        if self.args.plots:  # a file per figure and target type, when there are several
            sections += plot_section(self.args.out, records, f"-{label}" if len(self.types) > 1 else "")
        return records, sections

    def files(self) -> dict[str, str]:
        return {"cost_curve.json": json.dumps({label: asdict(c) for label, c in self.curves.items()}) + "\n"}


def research_sections(records, curve, weights: int | None, read_bandwidth: float | None) -> list[str]:
    """A target type's research sections: the research tasks' answers (structured output,
    fill-in-the-middle), where our rounds' time went and what -k auto chose, its cost curve, the analytic prediction at the measured acceptance, parity's
    pass@1, and the effective bandwidth of each mode."""
    main = [r for r in records if r.phase == "main"]
    summaries = summarise(main)
    predictions = predictions_by_group(summaries, curve)
    sections = task_sections(main) + round_sections(main) + cost_section(curve)
    if predictions:
        sections += ["## Analytic prediction", PREDICTION_NOTE, prediction_section(summaries, predictions)]
    rates = pass_rates([r for r in records if r.phase == "parity"])
    if rates:
        sections += ["## HumanEval parity (pass@1)", PARITY_NOTE, parity_table(rates)]
    return sections + bandwidth_table(summaries, weights, read_bandwidth)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m benchmarks.bench --serve`: the serving load measured against servers
started here, each in turn (`specsample bench serve --url` loads endpoints the user
runs; the loads, their rounds and their report are the bench's, load.py and
serve_summary.py).

For each slot count N of --slots every server is started (and gets one short warm-up
request); then, for every client count C of --clients, every task and every decoding
setting, a load: C clients sending the task's first prompts, to each server in
turn. Every load runs --repeats times; the passes over all loads come one after
another, and each load's round starts one server further on (A B C, B C A, C A B:
`rotation`), so each server takes each place in the order as often as the others
and a drift of the machine during the run falls on all alike, while the spread of
the repeats shows how far one load's figures can be trusted. One server works at a time (the others
wait idle, their engines asleep), so no two share the cores; and as all are up
together, the loads of two modes that a ratio compares are minutes apart, not the
length of the run: on a shared machine the same plain server's time for the same
request moved half an hour apart by more than most differences the report is after
(docs/benchmarks.md, "Serving under load"). The cost is memory: every
server of a slot count holds its models at once. The servers and what they are:

  ar               `specsample serve --autoregressive --parallel N`: the target alone
  spec-auto        `specsample serve -k auto --parallel N`: our adaptive speculation
  spec (per K)     `specsample serve -k K --parallel N`
  llamacpp-server  llama-server -np N (the native build) with drafting off per request
  llamacpp-spec    the same llama-server drafting --peer-k tokens (its -md)

N is how many requests a server decodes at once; the others wait in its queue. Both
llamacpp modes share one llama-server process per N. Every server reuses the start of
a prompt its slot holds (cache_prompt, on by default in both), so before every load
each server's slots are erased (ServerProcess.reset; llama-server's draft contexts
too, native.LlamaServer.reset), since the same prompts come back under the other
setting and every client count: within a load a request still finds what the ones
before it left (a shared instruction, a chat template's system prompt).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from pathlib import Path

from specsample.app.arguments import model_options
from specsample.bench.load import Load, run_load, unanswered_notes
from specsample.bench.modes import SETTINGS
from specsample.bench.options import counts
from specsample.bench.records import ServedRecord

from .calls import CallSplit
from .native import completion_request
from .peer_sampling import peer_sampling
from .servers import ServerProcess, ServerUnavailable

SERVE_FAMILIES = ("ar", "spec-auto", "spec", "llamacpp-server", "llamacpp-spec")
DEFAULT_SERVE_FAMILIES = ("ar", "spec-auto", "llamacpp-server", "llamacpp-spec")


@dataclass
class ServedMode:
    name: str  # the row label
    family: str
    k: int | str | None  # draft length the server (or each request, for llama-server) uses

    @property
    def native(self) -> bool:
        return self.family.startswith("llamacpp")

    def request_body(self, model: str, prompt_ids: list[int], max_tokens: int, sampling, seed: int, stops) -> dict:
        if self.native:
            # llama-server's OpenAI route takes its native fields beside the standard
            # ones: the same sampler settings and draft control as the native peer.
            body = completion_request(prompt_ids, max_tokens, sampling, seed, stops, self.k)
            body.pop("stream"), body.pop("return_tokens")
            body["max_tokens"] = body.pop("n_predict")
            return {"model": model, **body}
        return {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                **peer_sampling("openai", sampling), "stop": list(stops), "seed": seed}


def served_modes(families, ks: list[int], peer_ks: list[int]) -> list[ServedMode]:
    modes = []
    for family in families:
        if family == "spec":
            modes += [ServedMode(f"spec-k{k}", "spec", k) for k in ks]
        elif family == "llamacpp-spec":
            modes += [ServedMode(f"llamacpp-spec-k{k}", family, k) for k in peer_ks]
        else:
            modes.append(ServedMode(family, family, "auto" if family == "spec-auto" else None))
    return modes


def our_server_flags(mode: ServedMode, slots: int, trace: Path | None = None) -> list[str]:
    """`specsample serve`'s flags for one of our modes with `slots` slots. --parallel is
    always given: the server's own default is not one slot. `trace`: where -k auto's
    servers write their planner's trace, a file per server (traced_path)."""
    drafting = ["--autoregressive"] if mode.family == "ar" else ["-k", str(mode.k)]
    traced = ["--trace", str(traced_path(trace, mode.name, f"{slots}slots"))] if trace is not None and mode.k == "auto" \
        else []
    return [*drafting, "--parallel", str(slots), *traced]


def traced_path(trace: Path, *tags: str) -> Path:
    """A trace file of its own for one server (or one target's servers): --trace's name
    with the tags (mode, slot count; target type) before its suffix."""
    return trace.with_name(f"{trace.stem}-{'-'.join(tags)}{trace.suffix}")


def run_serving(modes: list[ServedMode], load: Load, slots: tuple[int, ...], *, model_argv: list[str],
                llama_server: Callable[[int], ServerProcess], log=None, keep=lambda records: None,
                trace: Path | None = None) -> tuple[list[ServedRecord], list[str], list[CallSplit]]:
    """Records (one per request) for every slot count, mode, client count, task and
    setting; notes on servers not run and requests not answered; and for each load of
    one of our servers, where its time went (calls.py). Our modes each get a
    `specsample serve` process per slot count; llama_server(N) starts the native one,
    which serves both llamacpp modes. `keep` sees each load's records when it ends; `trace`: our_server_flags'."""
    log = log or (lambda msg: print(f"specsample: {msg}", file=sys.stderr, flush=True))
    ours, natives = [m for m in modes if not m.native], [m for m in modes if m.native]
    records, notes, splits = [], [], []
    for n in slots:
        cells = [(partial(_our_server, mode, n, model_argv, trace), [mode]) for mode in ours]
        if natives:
            cells.append((partial(llama_server, n), natives))
        got, cell_notes = _serve(cells, n, load, log, splits, keep)
        records += got
        notes += cell_notes
    return records, notes, splits


def _our_server(mode: ServedMode, slots: int, model_argv: list[str], trace: Path | None) -> ServerProcess:
    flags = our_server_flags(mode, slots, trace)
    return specsample_server(model_argv, flags, "specsample serve " + " ".join(flags), parallel=slots)


def _serve(cells, slots: int, load: Load, log, splits: list[CallSplit], keep) -> tuple[list[ServedRecord], list[str]]:
    """Every server of one slot count started and warmed up, then each load sent to
    every mode in turn, --repeats times, in Load.rounds' rotating order."""
    servers, turns, records, notes = [], [], [], []
    try:
        for start, modes in cells:
            try:
                server = start()
            except ServerUnavailable as e:
                notes += [f"not run: {mode.name}, {slots} slots: {e}" for mode in modes]
                continue
            servers.append(server)
            model = server.request("/v1/models")["data"][0]["id"]
            for mode in modes:
                warm = next(iter(load.prompts.values()))[0]
                run_load(server.url + "/v1", [mode.request_body(model, warm.ids[:32], 8, SETTINGS["greedy"], 0, ())], 1)
                turns.append((mode, server, model))
        for repeat, (clients, task, setting), order in load.rounds(turns):
            for mode, server, model in order:
                done = _one_load(mode, server, model, slots, clients, task, setting, repeat, load, log, splits)
                records += done
                keep(done)
                notes += unanswered_notes(done)
    finally:
        for server in servers:
            server.close()
    return records, notes


def _one_load(mode: ServedMode, server: ServerProcess, model: str, slots: int, clients: int, task: str, setting: str,
              repeat: int, load: Load, log, splits: list[CallSplit]) -> list[ServedRecord]:
    group = load.prompts[task]
    bodies = [mode.request_body(model, p.ids, load.new_tokens(task), SETTINGS[setting], i, p.task.stop_strings)
              for i, p in enumerate(group)]
    server.reset([p.ids for p in group])
    log(f"serve load: {mode.name}, {slots} slots, {clients} clients, {task} {setting}, repeat {repeat + 1} of "
        f"{load.repeats}: {len(bodies)} requests")
    before = None if mode.native else server.text("/metrics")
    timings, wall = run_load(server.url + "/v1", bodies, clients)
    if before is not None:
        splits.append(CallSplit.between(before, server.text("/metrics"), mode=mode.name, task=task, setting=setting,
                                        slots=slots, clients=clients, wall_seconds=wall))
    return [ServedRecord(mode=mode.name, family=mode.family, k=mode.k, task=task, setting=setting,
                         prompt_id=p.prompt.id, clients=clients, slots=slots, wall_seconds=wall, timing=t,
                         repeat=repeat)
            for t, p in zip(timings, group)]


def specsample_server(model_argv: list[str], extra: list[str], name: str, parallel: int = 1) -> ServerProcess:
    """`specsample serve` with the bench's own model arguments, in a child process:
    it loads its models as a user's server would, and its threads never share a
    process with the load's client; `parallel`: its --parallel, the slots reset()
    erases."""
    return ServerProcess(lambda port, tmp: [sys.executable, "-m", "specsample", "serve", *model_argv, *extra,
                                            "--host", "127.0.0.1", "--port", str(port)], name=name, parallel=parallel)


def serve_argv(args, target_quant: str | None = None, n_ctx: int | None = None) -> list[str]:
    """This run's model arguments for a `specsample serve` child process (the target
    re-encoded as target_quant says, when given; each slot's context n_ctx, when given),
    with a queue that holds every client and never times out."""
    options = replace(model_options(args), target_quant=target_quant or args.target_quant,
                      ctx_size=n_ctx or args.ctx_size)
    queue = max(16, *counts(args.clients, "--clients"))
    return options.argv() + ["--max-queue", str(queue), "--queue-timeout", "3600"]


def target_file(args, quant: str) -> Path:
    """The target file our servers load for a --target-quants type: the GGUF file as
    given, or its re-encoding (made once, cached)."""
    from specsample.backends.models import resolve
    from specsample.backends.reencode import reencoded

    gguf = resolve(args.target).gguf_path
    return gguf if quant == "none" else reencoded(gguf, quant)

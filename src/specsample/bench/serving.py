"""`specsample bench --serve`: the serving load measured against each server in turn.

Each server runs alone (one process with the models at a time, so that no two
engines share the cores), gets one short warm-up request, then the load: C
clients sending the first R prompts of each task, once per decoding setting. The
servers and what they are:

  ar               `specsample serve --autoregressive`: the target alone
  spec-auto        `specsample serve -k auto`: our adaptive speculation
  spec (per K)     `specsample serve -k K`
  llamacpp-server  llama-server (the native build) with drafting off per request
  llamacpp-spec    the same llama-server drafting --peer-k tokens (its -md)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .load import LoadSummary, RequestTiming, run_load, summarise_load
from .modes import SETTINGS
from .native import completion_request
from .peer_sampling import peer_sampling
from .servers import ServerProcess, ServerUnavailable, specsample_server
from .tables import cell, greedy_identity, markdown_table

SERVE_FAMILIES = ("ar", "spec-auto", "spec", "llamacpp-server", "llamacpp-spec")
DEFAULT_SERVE_FAMILIES = ("ar", "spec-auto", "llamacpp-server", "llamacpp-spec")


@dataclass
class ServedMode:
    name: str  # the row label
    family: str
    k: int | str | None  # draft length the server (or each request, for llama-server) uses

    def request_body(self, model: str, prompt_ids: list[int], max_tokens: int, sampling, seed: int, stops) -> dict:
        if self.family.startswith("llamacpp"):
            # llama-server's OpenAI route takes its native fields beside the standard
            # ones: the same sampler settings and draft control as the native peer.
            body = completion_request(prompt_ids, max_tokens, sampling, seed, stops, self.k)
            body.pop("stream"), body.pop("return_tokens")
            body["max_tokens"] = body.pop("n_predict")
            return {"model": model, **body}
        return {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                **peer_sampling("openai", sampling), "stop": list(stops), "seed": seed}


@dataclass
class ServedRecord:
    """One request of the load: which server, task and prompt, and what its client saw.
    serve.jsonl holds one per line, the timing's fields after the others."""

    mode: str
    family: str
    k: int | str | None
    task: str
    setting: str
    prompt_id: str
    clients: int
    wall_seconds: float  # of the whole (task, setting) load this request was part of
    timing: RequestTiming

    def to_json(self) -> dict:
        row = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "timing"}
        return {**row, **vars(self.timing)}

    @classmethod
    def from_json(cls, row: dict) -> ServedRecord:
        timing = {name: value for name, value in row.items() if name in RequestTiming.__dataclass_fields__}
        rest = {name: value for name, value in row.items() if name not in timing}
        return cls(**rest, timing=RequestTiming(**timing))


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


def start_server(mode: ServedMode, model_argv: list[str], llama_server) -> ServerProcess:
    """A server for the mode; llama_server() starts the native one (both llamacpp
    modes share one process: drafting is switched per request)."""
    if mode.family == "ar":
        return specsample_server(model_argv, ["--autoregressive"], "specsample serve --autoregressive")
    if mode.family in ("spec", "spec-auto"):
        return specsample_server(model_argv, ["-k", str(mode.k)], f"specsample serve -k {mode.k}")
    return llama_server()


def run_serving(modes: list[ServedMode], prompts: dict, settings: tuple[str, ...], *, clients: int, model_argv,
                llama_server, new_tokens, log=None) -> tuple[list[ServedRecord], list[str]]:
    """Records (one per request) for every mode, task and setting; and notes on modes not run."""
    log = log or (lambda msg: print(f"specsample: {msg}", file=sys.stderr, flush=True))
    records, notes, native = [], [], None
    try:
        for mode in modes:
            is_native = mode.family.startswith("llamacpp")
            try:
                if is_native and native is None:
                    native = llama_server()
                server = native if is_native else start_server(mode, model_argv, llama_server)
            except ServerUnavailable as e:
                notes.append(f"not run: {mode.name}: {e}")
                continue
            try:
                done = _load_one_server(mode, server, prompts, settings, clients, new_tokens, log)
                failed = [r.timing.error for r in done if r.timing.error]
                if failed:
                    notes.append(f"{mode.name}: {len(failed)} of {len(done)} requests failed; first: {failed[0]}")
                records += done
            finally:
                if not is_native:
                    server.close()
    finally:
        if native is not None:
            native.close()
    return records, notes


def _load_one_server(mode, server, prompts, settings, clients, new_tokens, log) -> list[ServedRecord]:
    model = server.request("/v1/models")["data"][0]["id"]
    warm = next(iter(prompts.values()))[0]
    run_load(server.url, [mode.request_body(model, warm.ids[:32], 8, SETTINGS["greedy"], 0, ())], 1)
    records = []
    for task, group in prompts.items():
        for setting in settings:
            bodies = [mode.request_body(model, p.ids, new_tokens(task), SETTINGS[setting], i, p.task.stop_strings)
                      for i, p in enumerate(group)]
            log(f"serve load: {mode.name}, {task} {setting}: {len(bodies)} requests from {clients} clients")
            timings, wall = run_load(server.url, bodies, clients)
            for t, p in zip(timings, group):
                records.append(ServedRecord(mode.name, mode.family, mode.k, task, setting, p.prompt.id, clients, wall, t))
    return records


def summaries(records: list[ServedRecord]) -> dict[tuple, LoadSummary]:
    """One LoadSummary per (task, setting, mode), in first-seen order."""
    groups: dict[tuple, list[ServedRecord]] = {}
    for r in records:
        groups.setdefault((r.task, r.setting, r.mode), []).append(r)
    return {key: summarise_load([r.timing for r in rs], rs[0].clients, rs[0].wall_seconds)
            for key, rs in groups.items()}


def serve_table(records: list[ServedRecord]) -> str:
    by_key = summaries(records)
    rows = [["task", "setting", "server", "clients", "requests", "errors", "tokens", "wall s", "requests/s",
             "tokens/s", "tokens/s vs ar", "TTFT P50 / P99 s", "TPOT P50 / P99 ms", "ITL P50 / P99 ms", "acceptance"]]
    for (task, setting, mode), s in by_key.items():
        base = by_key.get((task, setting, "ar"))
        ratio = s.tokens_per_second / base.tokens_per_second if base and base.tokens_per_second else None
        rows.append([task, setting, mode, str(s.concurrency), str(s.requests), str(s.errors), str(s.completion_tokens),
                     f"{s.wall_seconds:.1f}", f"{s.requests_per_second:.3f}", f"{s.tokens_per_second:.2f}",
                     cell(ratio, ".2f"), _pair(s, "ttft", 1, ".2f"), _pair(s, "tpot", 1000, ".1f"),
                     _pair(s, "itl", 1000, ".1f"), cell(s.acceptance_rate, ".2f")])
    return markdown_table(rows)


def served_answer(r: ServedRecord) -> str | None:
    """What the greedy exactness table compares: the text the server streamed; None
    for a failed request."""
    return r.timing.text if r.timing.error is None else None


def serve_sections(records: list[ServedRecord]) -> tuple[list[str], str]:
    """serve.md's sections, and its main table (which the command line prints)."""
    table = serve_table(records)
    identity = greedy_identity(records, served_answer, ("server", "greedy answers identical to ar"))
    return ["## Serving load", SERVE_NOTE, table, "## Greedy exactness through the server", markdown_table(identity)], table


SERVE_NOTE = (
    "Each row: `requests` streamed completions (one per prompt of the task, token ids sent as the prompt) from "
    "`clients` concurrent clients using the `openai` package; every server runs alone and decodes one request at a "
    "time, so the others queue. requests/s and tokens/s = completed requests and completion tokens / wall time of "
    "the row. TTFT: request sent to first text, queueing included. TPOT: (last text - first text) / (tokens - 1), per "
    "request. ITL: gaps between streamed chunks (a speculative round sends several tokens in one chunk). P50/P99 are "
    "over the row's requests (TTFT, TPOT) or chunks (ITL); with fewer than 100 requests P99 sits near the worst one. "
    "tokens/s vs ar compares with `specsample serve --autoregressive` on the same prompts and setting."
)


def _pair(s: LoadSummary, name: str, scale: float, fmt: str) -> str:
    lo, hi = s.quantile(name, 50), s.quantile(name, 99)
    return "–" if lo is None else f"{format(lo * scale, fmt)} / {format(hi * scale, fmt)}"


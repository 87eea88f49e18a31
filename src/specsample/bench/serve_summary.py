"""serve.md's sections, from the records of a `bench serve` run (report.py writes the
file): per target type the table of every load and greedy exactness through the
servers (the research bench's --serve puts its servers against llama-server first). A load
that ran --repeats times is one row: each rate and time as the median of its repeats
with their range, each ratio to the baseline taken repeat by repeat (repeat i of both
ran in the same round, minutes apart) and shown the same way."""

from __future__ import annotations

from dataclasses import fields

from .load import LoadSummary, summarise_load
from .records import ServedRecord
from .stats import percentile
from .tables import cell, greedy_identity, markdown_table


def serve_sections(records: list[ServedRecord], baseline: str = "ar") -> tuple[list[str], str]:
    """serve.md's sections, and what the command line prints: the load table of each
    target type, and greedy exactness through the servers. Ratios are to the server
    (or --url endpoint) named `baseline`."""
    targets = list(dict.fromkeys(r.target for r in records))
    parts, printed = [], []
    for i, target in enumerate(targets):
        own = [r for r in records if r.target == target]
        table = serve_table(summaries(own), baseline)
        title = "" if len(targets) == 1 else f" (target {target})"
        parts += [f"## Serving load{title}", *([SERVE_NOTE.format(baseline=baseline)] if i == 0 else []), table]
        identity = served_identity(own, baseline)
        if len(identity) > 1:  # some server's greedy answers to compare with the baseline's
            parts += [f"## Greedy exactness through the server{title}", markdown_table(identity)]
        printed.append(table if len(targets) == 1 else f"Target {target}:\n{table}")
    return parts, "\n\n".join(printed)


def summaries(records: list[ServedRecord]) -> dict[tuple, list[LoadSummary]]:
    """Each load of one target type, keyed (task, setting, slots, clients, mode), as one
    LoadSummary per repeat in repeat order (one for a run from before --repeats), in
    reading order: tasks, settings and servers as they first came, slots and clients
    rising, so the servers under the same load sit together. An endpoint of --url has
    no slot count: None."""
    groups: dict[tuple, dict[int, list[ServedRecord]]] = {}
    for r in records:
        slots = None if r.family == "endpoint" else r.slot_count
        load = groups.setdefault((r.task, r.setting, slots, r.clients, r.mode), {})
        load.setdefault(r.repeat or 0, []).append(r)
    first: dict[tuple, int] = {}
    for i, key in enumerate(groups):
        for position in (0, 1, 4):
            first.setdefault((position, key[position]), i)
    order = sorted(groups, key=lambda k: (first[0, k[0]], first[1, k[1]], k[2] or 0, k[3], first[4, k[4]]))
    return {key: [summarise_load([r.timing for r in group], group[0].wall_seconds)
                  for _, group in sorted(groups[key].items())] for key in order}


def pooled(runs: list[LoadSummary]) -> LoadSummary:
    """The repeats of a load as one: counts and walls summed, per-request values together."""
    merged = {}
    for f in fields(LoadSummary):
        values = [getattr(s, f.name) for s in runs]
        if f.name == "refused":
            merged[f.name] = {status: sum(v.get(status, 0) for v in values) for status in sorted(set().union(*values))}
        elif isinstance(values[0], list):
            merged[f.name] = [x for v in values for x in v]
        else:
            merged[f.name] = sum(values)
    return LoadSummary(**merged)


def spread(values: list[float | None], fmt: str) -> str:
    """The median of the repeats' values, with their range where there are several:
    [10, 12, 11] -> "11.0 (10.0–12.0)" at ".1f". Repeats without a value are left out."""
    xs = [v for v in values if v is not None]
    if not xs:
        return "–"
    middle = format(percentile(xs, 50), fmt)
    return middle if len(xs) == 1 else f"{middle} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def paired(runs: list[LoadSummary], base: list[LoadSummary] | None, metric) -> list[float | None]:
    """metric(run) / metric(base), repeat by repeat: repeat i of both ran in the same
    round, so a drift of the machine between rounds cancels out of each ratio."""
    return [_ratio(metric(s), metric(b)) for s, b in zip(runs, base)] if base else []


RATES = {  # name -> (one repeat's figure, format)
    "tokens/s": (lambda s: s.tokens_per_second, ".2f"),
    "decode tokens/s": (lambda s: s.decode_tokens_per_second, ".2f"),
    "requests/s": (lambda s: s.requests_per_second, ".3f"),
    "TTFT P50 s": (lambda s: s.quantile("ttft", 50), ".2f"),
    "TTFT P90 s": (lambda s: s.quantile("ttft", 90), ".2f"),
}
VERSUS = ("tokens/s", "decode tokens/s", "TTFT P50 s")  # the ratios to the baseline


def serve_table(by_key: dict[tuple, list[LoadSummary]], baseline: str = "ar") -> str:
    rows = [["task", "setting", "slots", "clients", "server", "repeats", "answered", "refused (status)", "lost",
             "tokens/answer", *RATES, *(f"{name.removesuffix(' s')} ÷ {baseline}" for name in VERSUS),
             "TPOT P50 / P99 ms", "ITL P50 / P99 ms", "acceptance"]]
    for (task, setting, slots, clients, mode), runs in by_key.items():
        base = by_key.get((task, setting, slots, clients, baseline))
        whole = pooled(runs)
        rows.append([task, setting, cell(slots, ""), str(clients), mode, str(len(runs)),
                     f"{whole.answered}/{whole.requests}", _refused(whole), str(whole.lost),
                     cell(whole.tokens_per_answer, ".0f"),
                     *(spread([metric(s) for s in runs], fmt) for metric, fmt in RATES.values()),
                     *(spread(paired(runs, base, RATES[name][0]), ".2f") for name in VERSUS),
                     _pair(whole, "tpot", 1000, ".1f"), _pair(whole, "itl", 1000, ".1f"),
                     cell(whole.acceptance_rate, ".2f")])
    return markdown_table(rows)


def served_identity(records: list[ServedRecord], baseline: str = "ar") -> list[list[str]]:
    """Greedy answers of every server, slot count and client count against the
    baseline's (`ar`'s) with the fewest slots and clients: the answers closest to
    decoding one request alone. Each repeat's answer counts."""
    ar = [(r.slot_count, r.clients) for r in records if r.mode == baseline and r.setting == "greedy"]
    if not ar:
        return [["server", "slots", "clients", f"greedy answers identical to {baseline}"]]
    slots, clients = min(ar)
    endpoints = all(r.family == "endpoint" for r in records)  # --url: no slot count to show
    where = f"{clients} clients" if endpoints else f"{slots} slots, {clients} clients"
    return greedy_identity(
        records, served_answer, ("server", "slots", "clients", f"greedy answers identical to {baseline}'s ({where})"),
        label=lambda r: (r.mode, "–" if endpoints else str(r.slot_count), str(r.clients)),
        reference=lambda r: r.mode == baseline and (r.slot_count, r.clients) == (slots, clients))


def served_answer(r: ServedRecord) -> str | None:
    """What the greedy exactness table compares: the text the server streamed; None
    for a request not answered."""
    return r.timing.text if r.timing.outcome == "answered" else None


SERVE_NOTE = (
    "Each row is one load, sent `repeats` times: `answered` of the requests sent over all repeats (one per prompt "
    "of the task: token ids as the prompt to the servers the bench starts, text to a --url endpoint) streamed to the "
    "end by `clients` concurrent clients using the `openai` package, against a server that decodes up to `slots` "
    "requests at once (`specsample serve --parallel N`, llama-server `-np N`; an endpoint's own) and queues the "
    "rest; every server runs alone. refused: requests the server answered with an HTTP status instead (429: queue "
    "full, 503: waited too long; any other status is shown too); lost: neither an answer nor a status. tokens/s = "
    "completion tokens / wall time of the load (whole requests, prompt prefill included). decode tokens/s = tokens "
    "after each answer's first / the time during which at least one answer was streaming (prefill left out: an "
    "answer's first token and the wait before it are its TTFT; a newcomer's prefill that runs while others stream "
    "stays in). requests/s = answered / wall time. TTFT: request sent to first text, queueing included; P50 and P90 "
    "over a repeat's requests. Each of these is the median of the repeats, with their range in brackets; the "
    "repeats ran in rounds, every server once per round, the order turning by one from round to round. ÷ {baseline}: "
    "the same figure over {baseline}'s in the same round, median and range of the repeats' ratios (for TTFT, below "
    "1 is sooner). TPOT: (last text - first text) / (tokens - 1), per request; ITL: gaps between streamed chunks (a "
    "speculative round sends several tokens in one chunk); their P50/P99 over every repeat's requests or chunks "
    "(with fewer than 100, P99 sits near the worst one)."
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _refused(s: LoadSummary) -> str:
    refused = sum(s.refused.values())
    if not refused:
        return "0"
    return f"{refused} (" + ", ".join(f"{status}: {n}" for status, n in s.refused.items()) + ")"


def _pair(s: LoadSummary, name: str, scale: float, fmt: str) -> str:
    lo, hi = s.quantile(name, 50), s.quantile(name, 99)
    return "–" if lo is None else f"{format(lo * scale, fmt)} / {format(hi * scale, fmt)}"

"""serve.md's sections, from the records of a `bench --serve` run (report.py writes the
file): first our servers over llama-server at the same slots and clients, then per
target type the table of every load and greedy exactness through the servers."""

from __future__ import annotations

from .calls import SPLIT_NOTE, CallSplit, split_table
from .load import LoadSummary, summarise_load
from .records import ServedRecord
from .tables import cell, greedy_identity, markdown_table


def serve_sections(records: list[ServedRecord], splits: list[CallSplit] = ()) -> tuple[list[str], str]:
    """serve.md's sections, and what the command line prints: the summary and the load
    table of each target type; then, with `splits`, where our servers' time went."""
    targets = list(dict.fromkeys(r.target for r in records))
    parts, printed = [], []
    peers = peer_table(records)
    if peers:
        parts += ["## Summary: against llama-server, and against one slot", PEER_NOTE, peers]
        printed.append(peers)
    for i, target in enumerate(targets):
        own = [r for r in records if r.target == target]
        table = serve_table(summaries(own))
        title = "" if len(targets) == 1 else f" (target {target})"
        parts += [f"## Serving load{title}", *([SERVE_NOTE] if i == 0 else []), table]
        identity = served_identity(own)
        if len(identity) > 1:  # some server's greedy answers to compare with ar's
            parts += [f"## Greedy exactness through the server{title}", markdown_table(identity)]
        printed.append(table if len(targets) == 1 else f"Target {target}:\n{table}")
    if splits:
        parts += ["## Where our servers' time went", SPLIT_NOTE, split_table(list(splits))]
    return parts, "\n\n".join(printed)


def summaries(records: list[ServedRecord]) -> dict[tuple, LoadSummary]:
    """One LoadSummary per load of one target type, keyed (task, setting, slots,
    clients, mode), in reading order: tasks, settings and servers as they first came,
    slots and clients rising, so the servers under the same load sit together."""
    groups: dict[tuple, list[ServedRecord]] = {}
    for r in records:
        groups.setdefault((r.task, r.setting, r.slot_count, r.clients, r.mode), []).append(r)
    first: dict[tuple, int] = {}
    for i, key in enumerate(groups):
        for position in (0, 1, 4):
            first.setdefault((position, key[position]), i)
    order = sorted(groups, key=lambda k: (first[0, k[0]], first[1, k[1]], k[2], k[3], first[4, k[4]]))
    return {key: summarise_load([r.timing for r in groups[key]], groups[key][0].wall_seconds) for key in order}


def serve_table(by_key: dict[tuple, LoadSummary]) -> str:
    rows = [["task", "setting", "slots", "clients", "server", "answered", "refused (status)", "lost", "tokens/answer",
             "wall s", "tokens/s", "decode tokens/s", "tokens/s vs ar", "TTFT P50 / P99 s", "TPOT P50 / P99 ms",
             "ITL P50 / P99 ms", "acceptance"]]
    for (task, setting, slots, clients, mode), s in by_key.items():
        base = by_key.get((task, setting, slots, clients, "ar"))
        rows.append([task, setting, str(slots), str(clients), mode, f"{s.answered}/{s.requests}", _refused(s),
                     str(s.lost), cell(s.tokens_per_answer, ".0f"), f"{s.wall_seconds:.1f}",
                     f"{s.tokens_per_second:.2f}", cell(s.decode_tokens_per_second, ".2f"),
                     cell(_ratio(s.tokens_per_second, base and base.tokens_per_second), ".2f"),
                     _pair(s, "ttft", 1, ".2f"), _pair(s, "tpot", 1000, ".1f"), _pair(s, "itl", 1000, ".1f"),
                     cell(s.acceptance_rate, ".2f")])
    return markdown_table(rows)


def peer_table(records: list[ServedRecord]) -> str | None:
    """Each of our servers over llama-server -np N, over llama-server -np N -md at its best
    K, and over itself with one slot, under the same load (target, task, setting, slot
    count N, clients): tokens/s / decode tokens/s. None when there is nothing to compare."""
    families, ks = {r.mode: r.family for r in records}, {r.mode: r.k for r in records}
    rows = [["target", "task", "setting", "slots", "clients", "server", "÷ llama-server -np N",
             "÷ -np N -md (best K)", "÷ same server, 1 slot"]]
    for target in dict.fromkeys(r.target for r in records):
        by_key = summaries([r for r in records if r.target == target])
        for load in dict.fromkeys(key[:4] for key in by_key):
            task, setting, slots, clients = load
            here = {key[4]: s for key, s in by_key.items() if key[:4] == load}
            plain = next((s for mode, s in here.items() if families[mode] == "llamacpp-server"), None)
            spec = max((mode for mode in here if families[mode] == "llamacpp-spec"), default=None,
                       key=lambda mode: here[mode].decode_tokens_per_second or 0.0)
            for mode, s in here.items():
                if families[mode].startswith("llamacpp"):
                    continue
                alone = by_key.get((task, setting, 1, clients, mode)) if slots != 1 else None
                versus = [_both(s, plain), _both(s, here.get(spec)), _both(s, alone)]
                if spec is not None and versus[1] != "–":
                    versus[1] += f" (K={ks[spec]})"
                if any(v != "–" for v in versus):
                    rows.append([cell(target, ""), task, setting, str(slots), str(clients), mode, *versus])
    return markdown_table(rows) if len(rows) > 1 else None


def served_identity(records: list[ServedRecord]) -> list[list[str]]:
    """Greedy answers of every server, slot count and client count against `ar`'s with the
    fewest slots and clients: the answers closest to decoding one request alone."""
    ar = [(r.slot_count, r.clients) for r in records if r.mode == "ar" and r.setting == "greedy"]
    if not ar:
        return [["server", "slots", "clients", "greedy answers identical to ar"]]
    slots, clients = min(ar)
    return greedy_identity(
        records, served_answer,
        ("server", "slots", "clients", f"greedy answers identical to ar's ({slots} slots, {clients} clients)"),
        label=lambda r: (r.mode, str(r.slot_count), str(r.clients)),
        reference=lambda r: r.mode == "ar" and (r.slot_count, r.clients) == (slots, clients))


def served_answer(r: ServedRecord) -> str | None:
    """What the greedy exactness table compares: the text the server streamed; None
    for a request not answered."""
    return r.timing.text if r.timing.outcome == "answered" else None


SERVE_NOTE = (
    "Each row is one load: `answered` of the requests sent (one per prompt of the task, token ids sent as the "
    "prompt) streamed to the end by `clients` concurrent clients using the `openai` package, against a server that "
    "decodes up to `slots` requests at once (`specsample serve --parallel N`, llama-server `-np N`) and queues the "
    "rest; every server runs alone. refused: requests the server answered with an HTTP status instead (429: queue "
    "full, 503: waited too long; any other status is shown too); lost: neither an answer nor a status. tokens/s = "
    "completion tokens / wall time of the load (prompt prefill included). decode tokens/s = tokens after each "
    "answer's first / the time during which at least one answer was streaming (prefill left out: an answer's first "
    "token and the wait before it are its TTFT; a newcomer's prefill that runs while others stream stays in). "
    "TTFT: request sent to first text, queueing included. TPOT: (last text - first text) / (tokens - 1), per "
    "request. ITL: gaps between streamed chunks (a speculative round sends several tokens in one chunk). P50/P99 are "
    "over the load's requests (TTFT, TPOT) or chunks (ITL); with fewer than 100 requests P99 sits near the worst "
    "one. tokens/s vs ar compares with `specsample serve --autoregressive` under the same load."
)

PEER_NOTE = (
    "Each of our servers over a peer under the same load (target file, task, setting, slots N and clients), as "
    "tokens/s (prefill included) / decode tokens/s (prefill left out; both defined under the load table): "
    "llama-server -np N is llama.cpp's plain continuous batching, -np N -md its speculation with the same draft file "
    "(the K of --peer-k with the best decode tokens/s), and 1 slot is the same server of ours with --parallel 1, "
    "decoding one request at a time, under the same clients. Above 1 we are faster."
)


def _both(s: LoadSummary, base: LoadSummary | None) -> str:
    """"a / b": s over base in tokens/s and in decode tokens/s."""
    if base is None:
        return "–"
    ratios = (_ratio(s.tokens_per_second, base.tokens_per_second),
              _ratio(s.decode_tokens_per_second, base.decode_tokens_per_second))
    return " / ".join(cell(r, ".2f") for r in ratios)


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

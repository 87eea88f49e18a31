"""The reports' pieces: tables and notes, as markdown text (report.py writes the files)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from importlib import metadata

from .stats import ModeSummary


def main_table(summaries: list[ModeSummary]) -> str:
    rows = [["task", "setting", "mode", "K", "seqs", "tokens", "tokens/s", "speedup vs ar", "TTFT s", "TTFT vs ar",
             "ms/token", "decode tokens/s",
             "decode speedup", "acceptance", "tokens/target call", "P50 s", "P90 s", "P99 s"]]
    for s in summaries:
        rows.append([s.task, s.setting, s.mode, "-" if s.k is None else str(s.k), str(s.sequences), str(s.new_tokens),
                     cell(s.tokens_per_second, ".2f"), cell(s.speedup, ".2f"), cell(s.time_to_first_token, ".2f"),
                     cell(s.first_token_ratio, ".2f"), cell(s.ms_per_token, ".0f"),
                     cell(s.decode_tokens_per_second, ".2f"), cell(s.decode_speedup, ".2f"),
                     cell(s.acceptance_rate, ".2f"),
                     cell(s.tokens_per_target_call, ".2f"), cell(s.latency(50), ".2f"), cell(s.latency(90), ".2f"),
                     cell(s.latency(99), ".2f")])
    return markdown_table(rows)


def greedy_identity(records: list, answer: Callable = lambda r: r.token_ids,
                    header: tuple[str, ...] = ("mode", "greedy outputs identical to ar"),
                    label: Callable = lambda r: (r.mode,),
                    reference: Callable = lambda r: r.mode == "ar") -> list[list[str]]:
    """Per label (a mode): how many greedy outputs equal the reference's (`ar`'s) on
    the same task and prompt. `answer(record)` is what is compared (a Record's token
    ids, or the text a server streamed); None for a failed request, which is left out."""
    greedy = [r for r in records if r.setting == "greedy"]
    ar = {(r.task, r.prompt_id): answer(r) for r in greedy if reference(r) and answer(r) is not None}
    counts: dict[tuple, list[int]] = {}
    for r in greedy:
        key = (r.task, r.prompt_id)
        if reference(r) or key not in ar or answer(r) is None:
            continue
        c = counts.setdefault(label(r), [0, 0])
        c[0] += answer(r) == ar[key]
        c[1] += 1
    return [list(header)] + [[*cells, f"{a}/{n}"] for cells, (a, n) in counts.items()]


def machine_description(dtype: str | None, threads: int | None) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = ", ".join(f"{p} {_version(p)}" for p in ("torch", "transformers", "llama-cpp-python"))
    return f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, {versions}; dtype {dtype}, threads {threads}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def cell(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


THROUGHPUT_NOTE = (
    "Every figure in a row comes from its `seqs` sequences (one per prompt). tokens/s = all new tokens / all wall time "
    "of the mode (prompt prefill included); speedup is that over `ar` (our autoregressive loop) on the same prompts; "
    "ms/token is its inverse: both are whole requests, what a user waits for. TTFT s is the median time from the "
    "request to its first token (our loops: the call to the first emitted token, the prefill included, no "
    "calibration: the loop takes -k auto's policy ready, made and calibrated before the first request as a server "
    "makes it at start; llama-server: its prompt time), and TTFT vs ar its ratio to `ar`'s. A task whose prompts "
    "have kinds (chat, --prompts-file) has an overall row, then a row per kind (task/kind). P50/P90/P99 are "
    "per-sequence latencies over the row's sequences (with fewer than 100 sequences P99 sits close to the slowest "
    "one). decode tokens/s and decode speedup leave out the target's prompt prefill (modes that report it: our loops "
    "and llama-server; a model draft's own prefill stays in). Acceptance is per draft token (research peers, "
    "benchmarks/peers.py: estimated from their call counts)."
)

"""The physical ceiling of plain decoding: memory read bandwidth.

Autoregressive decoding reads every weight once per token, so target bytes x
tokens/s ("effective bandwidth", as gpt-fast prints it) cannot pass the machine's
read bandwidth; speculative decoding can, because one read scores several tokens.

The ceiling is the larger of two readings: a streaming probe (torch reducing a
buffer far larger than any CPU cache, on the run's thread count, best of a sum and a
dot product, best of several passes), and the effective bandwidth plain decoding
itself reached in the run. A probe can only undercount (one thread short, a
reduction kernel slower than the engine's loads): plain decoding read at least that
fast, so it never shows above 100%.
"""

from __future__ import annotations

import time
from pathlib import Path


def measure_read_bandwidth(threads: int | None = None, megabytes: int = 1024, reps: int = 5) -> float:
    """Bytes per second of the best full read of a `megabytes` buffer, summed and
    dotted by `threads` torch threads (default: torch's own count)."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
        buffer.sum()  # fault the pages in before timing
        best = float("inf")
        for read in (buffer.sum, lambda: torch.dot(buffer, buffer)):
            for _ in range(reps):
                t0 = time.perf_counter()
                read()
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return buffer.numel() * 4 / best


def read_ceiling(probe: float | None, plain_rates: list[float], weight_bytes: int | None) -> float | None:
    """The larger of the probe and what plain decoding achieved (bytes/s): the rate
    no autoregressive run can pass, as far as this run can tell."""
    achieved = [effective_bandwidth(weight_bytes, rate) for rate in plain_rates]
    readings = [b for b in [probe, *achieved] if b]
    return max(readings) if readings else None


def weight_bytes(backend, gguf_path: Path | None = None) -> int | None:
    """Bytes of weights one decoding step reads: the GGUF file for llama.cpp (its
    quantised tensors are read as stored), the parameters for a torch model."""
    if gguf_path is not None:
        return Path(gguf_path).stat().st_size
    model = getattr(backend, "model", None)
    if model is None:
        return None
    return sum(p.numel() * p.element_size() for p in model.parameters())


def effective_bandwidth(weight_bytes: int | None, tokens_per_second: float | None) -> float | None:
    if not weight_bytes or not tokens_per_second:
        return None
    return weight_bytes * tokens_per_second


def bandwidth_note(weight_bytes: int | None, probe: float | None, ceiling: float | None) -> str:
    if not weight_bytes:
        return ""
    note = (f"eff. GB/s = target weights ({weight_bytes / 1e9:.2f} GB) x decode tokens/s, the bandwidth plain decoding "
            "would need for that rate")
    if ceiling:
        note += (f"; the percentage is of the read ceiling, {ceiling / 1e9:.1f} GB/s: the larger of a read probe in "
                 f"this run ({(probe or 0) / 1e9:.1f} GB/s, torch streaming a 1 GiB buffer on the run's threads) and "
                 "what plain decoding itself reached, so no autoregressive row passes 100% and only speculation can")
    return note + "."


def _bandwidth_cell(weight_bytes: int | None, decode_rate: float | None, read_bandwidth: float | None) -> str:
    effective = effective_bandwidth(weight_bytes, decode_rate)
    if effective is None:
        return "–"
    share = f" ({100 * effective / read_bandwidth:.0f}%)" if read_bandwidth else ""
    return f"{effective / 1e9:.1f}{share}"


def bandwidth_table(summaries, weight_bytes: int | None, probe: float | None) -> list[str]:
    """summary.md's bandwidth section: each mode's decode rate as effective bandwidth,
    against the read ceiling; none where the weights' size is unknown."""
    if not weight_bytes:
        return []
    from specsample.bench.tables import markdown_table

    ceiling = read_ceiling(probe, [s.decode_tokens_per_second for s in summaries
                                   if s.mode == "ar" and s.decode_tokens_per_second], weight_bytes)
    rows = [["task", "setting", "mode", "eff. GB/s (% of read)"]]
    rows += [[s.task, s.setting, s.mode, _bandwidth_cell(weight_bytes, s.decode_tokens_per_second, ceiling)]
             for s in summaries]
    return ["## Effective bandwidth", bandwidth_note(weight_bytes, probe, ceiling), markdown_table(rows)]

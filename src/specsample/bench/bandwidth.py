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

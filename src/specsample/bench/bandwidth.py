"""The physical ceiling of plain decoding: memory read bandwidth.

Autoregressive decoding reads every weight once per token, so target bytes x
tokens/s ("effective bandwidth", as gpt-fast prints it) cannot pass the machine's
read bandwidth; speculative decoding can, because one read scores several tokens.
"""

from __future__ import annotations

import time
from pathlib import Path


def measure_read_bandwidth(megabytes: int = 512, reps: int = 5) -> float:
    """Bytes per second of the best of `reps` full reads of a buffer far larger than
    any CPU cache, summed by torch's own threads (the threads decoding uses)."""
    import torch

    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    buffer.sum()  # fault the pages in before timing
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - t0)
    return buffer.numel() * 4 / best


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

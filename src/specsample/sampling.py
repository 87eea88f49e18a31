"""Sampling controls: logits -> the probabilities a token is actually drawn from.

Target and draft go through the same function, so the draft probabilities used in
the acceptance ratio are exactly the distribution each draft token was drawn from
(after temperature, top-k and top-p), and greedy is a one-hot distribution rather
than a softmax that was never sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# Temperatures below this are greedy (vLLM's threshold too). There softmax(logits / T)
# keeps only e^-(gap / T) of the mass off the argmax: e^-100 for logits 1e-3 apart,
# which is the rounding noise of a float16 model's logits, so sampling differs from
# greedy only at exact ties (greedy takes the lowest id); while dividing by a smaller
# T overflows float32 (T = 1e-40: every logit inf, the softmax NaN).
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # 0, or anything below MIN_TEMPERATURE, means greedy (argmax)
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Probabilities after the sampling controls, always in float32.

    logits: [n, vocab] (any float dtype) -> [n, vocab] float32, rows sum to 1.
    """
    logits = logits.float()
    if config.greedy:
        # Ties resolve to the lowest token id, as torch.argmax does in plain greedy.
        probs = torch.zeros_like(logits)
        probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return probs
    logits = logits / config.temperature
    if 0 < config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        probs = _top_p_filter(probs, config.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # Keep the smallest prefix of tokens (by descending probability) whose mass
    # reaches top_p; the token that crosses the threshold is kept. Sorting a 152k
    # vocabulary costs ~11 ms a row on our CPU, so look at the top 256 first and widen
    # only when they hold less than top_p (with a margin, so that rounding cannot
    # decide whether the next token would have been kept).
    vocab = probs.shape[-1]
    k = min(vocab, 256)
    while True:
        top, index = probs.topk(k, dim=-1)  # [n, k], descending
        mass = top.cumsum(-1)  # [n, k]
        if k == vocab or bool((mass[:, -1] > top_p + 1e-6).all()):
            break
        k = min(vocab, k * 8)
    top = top.masked_fill(mass - top >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, index, top)
    return filtered / filtered.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row, by inverting the cumulative distribution.

    probs: [n, vocab] -> [n] int64. torch.multinomial takes ~2.6 ms per row over a
    152k vocabulary on our CPU (a tenth of a llama.cpp decoding step); a float64
    cumsum and a binary search take ~0.2 ms. float64 keeps the rounding error of the
    running sum (~1e-11 over 152k terms) far below anything a test could see.
    Zero-probability tokens are never chosen: their cumulative value equals the one
    before them, and the search returns the first index whose value exceeds u.
    """
    top, index = probs.max(-1)  # [n], [n]
    if bool((top >= 1.0).all()):  # one-hot rows (greedy): nothing to draw
        return index
    cdf = probs.double().cumsum(-1)  # [n, vocab]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]  # [n, 1]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)

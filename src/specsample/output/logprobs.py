"""Log-probabilities of tokens: of each emitted token, from the verify call's rows (so
speculation adds no target call), and of a prompt's tokens (prompt scoring).

Two kinds, as vLLM names them:
    raw        log_softmax of the model's logits: before logit_bias, the penalties,
               temperature, min_p, top-k and top-p. What evaluation harnesses expect
               (a log-likelihood of the text under the model), and the default.
    processed  log of the distribution each token was drawn from, after every control
               (-inf for tokens the controls removed; 0 for the token greedy picks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

MODES = ("raw", "processed")
MAX_TOP = 20  # OpenAI's cap on alternatives per token


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # the N likeliest tokens, likeliest first


def token_logprobs(logits: torch.Tensor, probs: torch.Tensor | None, tokens: list[int], top: int,
                   mode: str = "raw") -> list[TokenLogprob]:
    """Row i of logits [>= n, vocab] (the model's) or probs [>= n, vocab] (after the
    controls) scores tokens[i]. Only the chosen and the top entries are turned into
    log-probabilities (a logsumexp, a gather and a top-k per row, never a whole
    log-softmax row), so the cost stays far below a decoding step."""
    n = len(tokens)
    if n == 0:
        return []
    index = torch.tensor(tokens)[:, None]  # [n, 1]
    if mode == "raw":
        rows = logits[:n].float()
        # Row by row: a reduction over [n, vocab] may round differently for another n,
        # and a row's log-probabilities must not depend on how many rows its call scored.
        norm = torch.stack([torch.logsumexp(row, dim=-1) for row in rows])[:, None]  # [n, 1]
        transform = lambda values: values - norm  # noqa: E731
    else:
        rows = probs[:n].float()
        transform = torch.log
    chosen = transform(rows.gather(-1, index)).squeeze(-1).tolist()  # [n]
    if top <= 0:
        return [TokenLogprob(t, v) for t, v in zip(tokens, chosen)]
    values, best = rows.topk(min(top, rows.shape[-1]), dim=-1)  # [n, top], descending either way
    return [TokenLogprob(t, v, list(zip(i, w)))
            for t, v, i, w in zip(tokens, chosen, best.tolist(), transform(values).tolist())]


def score_prompt(target, prompt_ids: list[int], top: int = 0, chunk: int = 128,
                 cancelled: Callable[[], bool] = lambda: False) -> list[TokenLogprob | None] | None:
    """Raw log-probabilities of each prompt token given the tokens before it; None for
    the first, which nothing predicts. Scores in chunks of `chunk` tokens, so the rows
    held at once stay small (a 152k vocabulary is 0.6 MB a row). Leaves the target's
    cache holding the prompt.

    `cancelled()` is asked before each call to the target: once it says True, scoring
    stops there and returns None (a server's client that left frees the model within
    one call, not after the whole prompt)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) > target.context_length:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {target.name}: "
                         f"{target.context_length} tokens")
    from ..backends.base import claim_cache, finite_logits

    claim_cache(target)
    target.rollback(0)
    out: list[TokenLogprob | None] = [None]
    for start in range(0, len(prompt_ids), chunk):
        if cancelled():
            return None
        piece = prompt_ids[start : start + chunk]
        logits = finite_logits(target.score(piece, num_logits=len(piece)), target.name)  # [len(piece), vocab]
        following = prompt_ids[start + 1 : start + 1 + len(piece)]  # one short at the end: the last row predicts text to come
        out += token_logprobs(logits, None, following, top)
    return out

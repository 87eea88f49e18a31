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

from dataclasses import dataclass, field

import torch

MODES = ("raw", "processed")
MAX_TOP = 20  # OpenAI's cap on alternatives per token


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # the N likeliest tokens, likeliest first


def log_rows(logits: torch.Tensor, probs: torch.Tensor, mode: str) -> torch.Tensor:
    """logits [n, vocab] (the model's), probs [n, vocab] (after the controls) -> [n, vocab]."""
    if mode == "raw":
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(probs.float())


def token_logprobs(rows: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """rows [>= len(tokens), vocab] of log-probabilities; row i scores tokens[i]."""
    n = len(tokens)
    if n == 0:
        return []
    rows = rows[:n]
    chosen = rows.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()  # [n]
    if top <= 0:
        return [TokenLogprob(t, v) for t, v in zip(tokens, chosen)]
    values, index = rows.topk(min(top, rows.shape[-1]), dim=-1)  # [n, top]
    return [TokenLogprob(t, v, list(zip(i, w))) for t, v, i, w in zip(tokens, chosen, index.tolist(), values.tolist())]


def score_prompt(target, prompt_ids: list[int], top: int = 0, chunk: int = 128) -> list[TokenLogprob | None]:
    """Raw log-probabilities of each prompt token given the tokens before it; None for
    the first, which nothing predicts. Scores in chunks of `chunk` tokens, so the rows
    held at once stay small (a 152k vocabulary is 0.6 MB a row). Leaves the target's
    cache holding the prompt."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) > target.context_length:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {target.name}: "
                         f"{target.context_length} tokens")
    from .backends.base import claim_cache, finite_logits

    claim_cache(target)
    target.rollback(0)
    out: list[TokenLogprob | None] = [None]
    for start in range(0, len(prompt_ids), chunk):
        piece = prompt_ids[start : start + chunk]
        logits = finite_logits(target.score(piece, num_logits=len(piece)), target.name)  # [len(piece), vocab]
        following = prompt_ids[start + 1 : start + 1 + len(piece)]  # one short at the end: the last row predicts text to come
        out += token_logprobs(log_rows(logits, None, "raw"), following, top)
    return out

"""Drafters propose the next K tokens; the target decides which to keep."""

from __future__ import annotations

from typing import Protocol

import torch

from .backends.base import Backend
from .sampling import SamplingConfig, logits_to_probs, sample


class Drafter(Protocol):
    name: str
    calls: int  # model forward calls made so far

    def propose(
        self, context: list[int], k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k draft tokens [m] and the probabilities they were drawn from
        [m, vocab], or None when the drafter has no distribution. m may be 0."""
        ...


class ModelDrafter:
    """A small language model that drafts autoregressively with its own KV cache.

    Its cache is kept in step with the accepted text by comparing the cached tokens
    with the context at the start of each round: after a rejection the cache holds
    drafts that were thrown away (rolled back); after a full accept it lacks the last
    draft token, which was sampled but never fed back (the classic off-by-one), and
    the bonus token. Both are fed in the first draft call of the next round.
    """

    def __init__(self, backend: Backend, sampling: SamplingConfig):
        self.backend = backend
        self.sampling = sampling
        self.name = backend.name
        self.calls = 0
        self._cached: list[int] = []  # the tokens in the backend's cache

    def propose(self, context, k, generator):
        if self.backend.length != len(self._cached):  # someone else used the backend
            self._cached = []
        common = _common_prefix_length(self._cached, context)
        # At least one token must be fed to get the next-token logits.
        common = min(common, len(context) - 1)
        self.backend.rollback(common)
        feed = list(context[common:])
        self._cached = self._cached[:common]
        tokens, rows = [], []
        for i in range(k):
            logits = self.backend.score(feed, num_logits=1)  # [1, vocab]
            self.calls += 1
            self._cached += feed
            probs = logits_to_probs(logits, self.sampling)  # [1, vocab]
            token = int(sample(probs, generator)[0])
            tokens.append(token)
            rows.append(probs[0])
            feed = [token]  # not fed after the last draft: nobody needs its logits
        if not tokens:
            return torch.empty(0, dtype=torch.long), None
        return torch.tensor(tokens), torch.stack(rows)


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the
    last n tokens, trying n = max_ngram down to min_ngram.

    Example with max_ngram=2, context [1, 2, 3, 4, 2, 3], k=3: the suffix [2, 3]
    occurred at positions 1..2, followed by [4, 2, 3], so the draft is [4, 2, 3].
    The draft has no distribution: verification treats it as one-hot.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"ngram(n={min_ngram}..{max_ngram})"
        self.calls = 0  # no model

    def propose(self, context, k, generator):
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-n:]
            # Most recent earlier occurrence first; it must be followed by something.
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == suffix:
                    follow = context[start + n : start + n + k]
                    return torch.tensor(follow, dtype=torch.long), None
        return torch.empty(0, dtype=torch.long), None

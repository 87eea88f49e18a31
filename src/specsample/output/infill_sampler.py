"""llama.cpp's infill sampler, which llama.vim asks for (`"samplers": ["top_k", "top_p",
"infill"]`): at the end of a middle it leans on the end of text, and mid-line it keeps
the few tokens that stand for most of the mass once tokens that spell the start of one
another are counted together.

It is a filter: llama.cpp draws from the softmax of the logits it leaves (its last
sampler recomputes the probabilities from them), so the probability shifts inside it
only decide which tokens stay. Over the candidates the samplers before it left, in
descending order of probability (renormalized among them):

1. If 3 x P(end of generation) x n > P(text), with n candidates: keep the
   end-of-generation tokens only.
2. Merge pairs whose text is a prefix of the other's, into the likelier of the two
   (its probability takes the other's, which is dropped), in llama.cpp's loop order.
3. Keep tokens with p >= 0.2 and every end-of-generation token; none of the first
   kind left: the end-of-text token alone.
4. Renormalize; keep those with p >= 1 / (kept text tokens + 1) and the end tokens.

It plugs into the sampler as SamplingConfig's extra_step (InfillStep). Target and draft
rows go through it alike, so speculative sampling stays exact for the filtered
distribution. Its work is quadratic in the candidates in the worst case, so it asks for
a top_k before it (llama.vim sends 40).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

MAX_CANDIDATES = 1000  # the largest top_k the infill sampler may follow
FIRST_FLOOR = 0.2  # step 3's threshold (llama.cpp's)


@dataclass(eq=False)
class InfillVocab:
    """What the filter needs of a vocabulary: each token's text as llama.cpp's
    token_to_piece gives it without special tokens (bytes; b"" for those), the
    end-of-generation tokens, and the end-of-text token step 3 falls back to (None: a
    vocabulary without one keeps its likeliest candidate there instead)."""

    piece: Callable[[int], bytes]
    eog: frozenset[int]
    eot: int | None
    _pieces: dict[int, bytes] = field(default_factory=dict, repr=False)

    def text(self, token: int) -> bytes:
        if token not in self._pieces:
            self._pieces[token] = self.piece(token)
        return self._pieces[token]


def infill_vocab(backend) -> InfillVocab:
    """The filter's view of a backend's vocabulary: its tokenizer's `piece` where it has
    one (llama.cpp's own), else each token decoded alone."""
    tokenizer = backend.tokenizer
    piece = getattr(tokenizer, "piece", None) or (lambda t: tokenizer.decode([t]).encode())
    eog = frozenset(backend.eos_token_ids)
    eot = getattr(tokenizer, "end_of_text", None)
    if eot is None or eot < 0:
        eot = min(eog) if eog else None
    return InfillVocab(piece, eog, eot)


def infill_keep(ids: list[int], probs: list[float], vocab: InfillVocab) -> list[int]:
    """The candidates that stay (ids in descending order of probability, probs summing
    to 1 over them), by the four steps above."""
    n = len(ids)
    eog = [t in vocab.eog for t in ids]
    p_eog = sum(p for p, e in zip(probs, eog) if e)
    if 3 * p_eog * n > sum(p for p, e in zip(probs, eog) if not e):
        return [t for t, e in zip(ids, eog) if e]
    p = list(probs)
    alive = [True] * n
    texts = [vocab.text(t) for t in ids]
    # Who has whom as a prefix: the texts that start with texts[i0] sit together in sorted order.
    order = sorted(range(n), key=lambda i: texts[i])
    ranked = [texts[i] for i in order]
    for i0 in range(n):
        head = texts[i0]
        if not head:
            continue
        lo = bisect.bisect_left(ranked, head)
        hi = lo
        while hi < n and ranked[hi].startswith(head):
            hi += 1
        for i1 in sorted(order[lo:hi]):
            if not alive[i0]:
                break
            if i1 == i0 or not alive[i1]:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
            p[dst] += p[src]
            p[src], alive[src] = 0.0, False
    kept = [i for i in range(n) if alive[i] and (p[i] >= FIRST_FLOOR or eog[i])]
    texts_kept = sum(not eog[i] for i in kept)
    if texts_kept == 0:
        return [vocab.eot] if vocab.eot is not None else ids[:1]
    total = sum(p[i] for i in kept)
    floor = 1.0 / (texts_kept + 1)
    return [ids[i] for i in kept if p[i] / total >= floor or eog[i]]


def infill_filter(logits: torch.Tensor, vocab: InfillVocab) -> torch.Tensor:
    """logits [n, vocab] float32, -inf where earlier samplers removed a token ->
    the same with -inf wherever the infill sampler removes one."""
    out = torch.full_like(logits, float("-inf"))
    probs, finite = torch.softmax(logits, dim=-1), torch.isfinite(logits)
    for row in range(logits.shape[0]):
        candidates = finite[row].nonzero().flatten()
        if len(candidates) > MAX_CANDIDATES:
            raise ValueError(f"the infill sampler takes at most {MAX_CANDIDATES} candidates; put top_k before it")
        values, p = logits[row, candidates].tolist(), probs[row, candidates].tolist()
        # Descending probability; ties by id (llama.cpp's sort leaves them in no set order).
        ranked = sorted(zip(candidates.tolist(), values, p), key=lambda c: (-c[1], c[0]))
        keep = infill_keep([c[0] for c in ranked], [c[2] for c in ranked], vocab)
        index = torch.tensor(keep, dtype=torch.long)
        if vocab.eot is not None and keep == [vocab.eot] and not finite[row, vocab.eot]:
            out[row, vocab.eot] = 0.0  # the fallback: the end of text alone, with certainty
        else:
            out[row, index] = logits[row, index]
    return out


@dataclass(frozen=True)
class InfillStep:
    """The infill sampler as the step `infill` of a SamplingConfig's order (its extra_step)."""

    vocab: InfillVocab
    name: ClassVar[str] = "infill"
    max_candidates: ClassVar[int | None] = MAX_CANDIDATES

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return infill_filter(logits, self.vocab)

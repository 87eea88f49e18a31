"""A frequency-ranked draft vocabulary (FR-Spec, Zhao et al. 2025).

Most of a small draft model's time per token can go to its output layer: the 0.5B
Qwen's tied embedding / LM head is 136M of its 494M parameters, because the
vocabulary has 151,665 tokens. Scoring only the N most frequent ones makes each draft
step cheaper. Exactness does not depend on it: the draft distribution is zero outside
the kept set, drafts are drawn from exactly that distribution, and verification's
residual gives the target's mass on every other token.

Frequencies are counted on text every Python installation carries (the standard
library's own sources: code, comments and docstrings), so nothing is downloaded; the
counts are cached per tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections import Counter
from pathlib import Path

from ..files import read_cached_json, write_cached_json

CORPUS_CHARS = 4_000_000  # ~1M tokens: enough to rank the first tens of thousands


def corpus_text(limit: int = CORPUS_CHARS) -> str:
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\n".join(parts)[:limit]


def frequent_tokens(tokenizer, vocab_size: int, n: int, always: frozenset[int] = frozenset(),
                    cache: Path | None = None) -> list[int]:
    """The n most frequent token ids (plus `always`, e.g. end-of-turn tokens), sorted."""
    counts = _counts(tokenizer, vocab_size, cache)
    ranked = sorted(range(vocab_size), key=lambda t: (-counts.get(t, 0), t))
    keep = set(ranked[:n]) | {t for t in always if t < vocab_size}
    return sorted(keep)


def _counts(tokenizer, vocab_size: int, cache: Path | None) -> dict[int, int]:
    # Key the cache on the tokenizer itself: the same ids for the same sample text.
    probe = tokenizer.encode("def main():\n    return {'x': [1, 2.5]}  # héllo")
    key = hashlib.sha256(json.dumps([vocab_size, probe]).encode()).hexdigest()[:16]
    path = None if cache is None else cache / "vocab" / f"counts-{key}.json"
    cached = read_cached_json(path)
    if isinstance(cached, dict):
        return {int(t): c for t, c in cached.items()}
    text = corpus_text()
    # Tokenize in pieces: a tokenizer's cost can grow faster than linearly in length.
    counts = Counter()
    for start in range(0, len(text), 20_000):
        counts.update(tokenizer.encode(text[start : start + 20_000]))
    write_cached_json(path, counts)
    return dict(counts)


def restrict_draft_vocabulary(backend, n: int, cache: Path | None = None) -> int:
    """Make a draft backend score only its n most frequent tokens (plus its special
    tokens, so that it can still propose an end of turn). Returns the kept count."""
    if not hasattr(backend, "restrict_vocabulary"):
        raise ValueError(f"{backend.name}: a truncated draft vocabulary needs the hf backend "
                         "(llama.cpp computes its full output layer inside its own graph)")
    if backend.tokenizer is None:
        raise ValueError(f"{backend.name}: a truncated draft vocabulary needs a tokenizer to count tokens")
    special = set(backend.eos_token_ids)
    hf = getattr(backend.tokenizer, "hf", None)
    if hf is not None:
        special |= set(hf.get_added_vocab().values())
    keep = frequent_tokens(backend.tokenizer, backend.vocab_size, n, frozenset(special), cache)
    backend.restrict_vocabulary(keep)
    return len(keep)

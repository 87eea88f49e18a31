"""Suffix drafting: propose what most often followed the longest match of the text's
end in everything this process has served (SuffixDecoding, Oliaro et al. 2025; vLLM's
`suffix` method), as well as in the current prompt and answer.

A `SuffixIndex` keeps the prompts and answers served, per `cache_salt` (a partition
each: one tenant's text never drafts for another's), within `size` tokens in all,
the oldest document evicted first. A `SuffixDrafter` (one per generation) searches
its salt's partition and its own text, and gives every finished text to the index
(drafters.finish).

How a lookup finds the longest match. A partition is a `Corpus`: its documents end
to end, each closed by SEPARATOR, and a chain per ANCHOR-gram (the ANCHOR tokens a
match must at least span) linking each occurrence to the one before it. The last
ANCHOR tokens of the text pick a chain; its CANDIDATES most recent occurrences are
each extended backwards against the text (at most MAX_MATCH tokens), and those that
match longest form the match set. From there the draft is a walk down their
continuations: at each step the most frequent next token among the set, with its
share of the set as the draft's confidence there; the set narrows to the occurrences
that go on with it, and the walk stops where the share falls under MIN_SHARE.

Example, ANCHOR 2: the served text [5 6 7 8 | 1 6 7 8 | 2 6 7 9] and a text ending in
[.. 3 6 7]: the anchor [6 7] occurs three times, each matching 2 tokens (3 6 7 is
new); their continuations are 8, 8 and 9, so the draft is 8 with confidence 2/3, and
then nothing (both 8s are followed by a separator). A text ending in [2 6 7] matches
the last occurrence by 3 tokens, alone: the draft is 9, confidence 1.

Memory is a few bytes a token in arrays, plus a dictionary entry per distinct
anchor. Everything runs in the caller's thread; a server's sequences share it from
one thread (batching.py's greenlets switch only at model calls).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ..output.constraints import GrammarState
from .drafters import Draft, lookup_draft
from .plans import Offer, Plan, suffix_source

SEPARATOR = -1  # after each document: no match or continuation crosses it
ANCHOR = 4  # tokens a match spans at least (context lookup covers shorter ones)
MAX_MATCH = 64  # a match is extended backwards this far at most
CANDIDATES = 64  # occurrences of the anchor examined, most recent first
MIN_SHARE = 0.5  # a walk stops where its most frequent continuation has less of the match set


class Corpus:
    """Documents end to end, addressed by a position that only grows: position g is
    `_tokens[g - _offset]`; positions below `start` are evicted (their space is given
    back once they are half the buffer)."""

    def __init__(self):
        self._tokens = np.empty(256, dtype=np.int32)
        self._prev = np.empty(256, dtype=np.int64)  # at an anchor's start: its previous occurrence's, or -1
        self._offset = self.start = self.end = 0
        self._last: dict[int, int] = {}  # anchor key -> its latest start

    def __len__(self) -> int:
        return self.end - self.start

    def extend(self, tokens: list[int]) -> None:
        """Append tokens, and chain every anchor that ends in them."""
        if not tokens:
            return
        self._reserve(len(tokens))
        at = self.end - self._offset
        self._tokens[at : at + len(tokens)] = tokens
        first = max(self.start, self.end - ANCHOR + 1)  # the first anchor start not yet chained
        self.end += len(tokens)
        window = self._tokens[first - self._offset : self.end - self._offset]
        if len(window) < ANCHOR:
            return
        starts = len(window) - ANCHOR + 1
        grams = np.lib.stride_tricks.sliding_window_view(window, ANCHOR)  # [starts, ANCHOR]
        keys = _keys(grams).tolist()
        clean = (grams != SEPARATOR).all(axis=1).tolist()
        prev, last = [-1] * starts, self._last
        for i, key in enumerate(keys):
            if clean[i]:
                prev[i] = last.get(key, -1)
                last[key] = first + i
        self._prev[first - self._offset : first - self._offset + starts] = prev

    def close(self) -> None:
        """End the document: nothing after it continues it."""
        self.extend([SEPARATOR])

    def evict(self, n: int) -> None:
        """Forget the oldest n tokens."""
        self.start = min(self.end, self.start + n)
        dead = self.start - self._offset
        if dead > len(self) and dead > 1024:  # compact: the live half moves down
            self._tokens = self._tokens[dead : self.end - self._offset].copy()
            self._prev = self._prev[dead : self.end - self._offset].copy()
            self._offset = self.start
        if len(self._last) > 2 * len(self) + 1024:  # drop the anchors that only evicted text held
            self._last = {key: g for key, g in self._last.items() if g >= self.start}

    def _reserve(self, n: int) -> None:
        need = self.end - self._offset + n
        if need > len(self._tokens):
            size = max(need, 2 * len(self._tokens))
            self._tokens = np.resize(self._tokens, size)
            self._prev = np.resize(self._prev, size)

    def occurrences(self, tail: list[int]) -> list[tuple[int, int]]:
        """(match length, position after the match) of the anchor's most recent
        CANDIDATES occurrences that something follows; `tail`: the text's last
        MAX_MATCH tokens or fewer, the anchor last."""
        found, g = [], self._last.get(_keys(np.array([tail[-ANCHOR:]]))[0].item(), -1)
        reversed_tail = np.array(tail[::-1], dtype=np.int32)
        for _ in range(CANDIDATES):
            if g < self.start:
                break
            after = g + ANCHOR
            if after < self.end and self._tokens[after - self._offset] != SEPARATOR:
                n = min(len(tail), after - self.start)
                before = self._tokens[after - n - self._offset : after - self._offset][::-1]
                differ = np.flatnonzero(before != reversed_tail[:n])
                length = int(differ[0]) if differ.size else n
                if length >= ANCHOR:  # else another anchor with the same key
                    found.append((length, after))
            g = int(self._prev[g - self._offset])
        return found

    def following(self, after: int, k: int) -> list[int]:
        """Up to k tokens from position `after`, to the end of its document."""
        out = self._tokens[after - self._offset : min(self.end, after + k) - self._offset].tolist()
        return out[: out.index(SEPARATOR)] if SEPARATOR in out else out


def _keys(grams: np.ndarray) -> np.ndarray:
    """One int64 per row of ANCHOR tokens ([n, ANCHOR] -> [n]); rows that collide are
    told apart by the backward match (Corpus.occurrences)."""
    keys = np.zeros(len(grams), dtype=np.uint64)
    for j in range(grams.shape[1]):
        keys = keys * np.uint64(0x100000001B3) + grams[:, j].astype(np.uint64)  # wraps: a hash, not a code
    return keys.view(np.int64)


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    match: int  # tokens of the text's end that the occurrences drafted from match
    confidences: list[float]  # [len(tokens)]: each token's share of the occurrences still followed


NOTHING = Proposal([], 0, [])


def propose(corpora: list[Corpus], context: list[int], k: int) -> Proposal:
    """The most frequent continuation, up to k tokens, of the longest match of the
    context's end in `corpora` (module docstring)."""
    if len(context) < ANCHOR or k < 1:
        return NOTHING
    tail = context[-MAX_MATCH:]
    found = [(n, corpus, after) for corpus in corpora for n, after in corpus.occurrences(tail)]
    if not found:
        return NOTHING
    match = max(n for n, _, _ in found)
    paths = [corpus.following(after, k) for n, corpus, after in found if n == match]
    tokens, confidences = [], []
    for j in range(k):
        counts = collections.Counter(path[j] for path in paths if len(path) > j)
        if not counts:
            break
        token, count = counts.most_common(1)[0]
        share = count / len(paths)  # occurrences whose document ends here count against going on
        if share < MIN_SHARE:
            break
        tokens.append(token)
        confidences.append(share)
        paths = [path for path in paths if len(path) > j and path[j] == token]
    return Proposal(tokens, match, confidences)


class SuffixIndex:
    """The text served, one Corpus per cache_salt, within `size` tokens in all (their
    separators included); the oldest document, of whichever salt, goes first."""

    def __init__(self, size: int = 1 << 20):
        if size < 1:
            raise ValueError(f"the suffix index holds at least 1 token, got {size}")
        self.size, self.tokens = size, 0
        self._parts: dict[str | None, Corpus] = {}
        self._order: collections.deque[tuple[str | None, int]] = collections.deque()  # (salt, tokens), oldest first

    def corpus(self, salt: str | None) -> Corpus | None:
        return self._parts.get(salt)

    def add(self, tokens: list[int], salt: str | None = None) -> None:
        """A served text (a prompt and its answer), as one document of `salt`'s; a text
        longer than the whole index keeps its end."""
        tokens = tokens[-(self.size - 1):] if self.size > 1 else []
        if not tokens:
            return
        corpus = self._parts.setdefault(salt, Corpus())
        corpus.extend(tokens)
        corpus.close()
        self._order.append((salt, len(tokens) + 1))
        self.tokens += len(tokens) + 1
        while self.tokens > self.size:
            old, n = self._order.popleft()
            self.tokens -= n
            self._parts[old].evict(n)
            if not self._parts[old]:
                del self._parts[old]


class SuffixDrafter:
    """Drafts from an index of served text and from the current text (the prompt and
    the answer so far), never from another salt's. Its drafts are one-hot, as a
    lookup's; each match length class is a source of its own (plans.suffix_source).
    Without an index it searches the current text alone."""

    def __init__(self, index: SuffixIndex | None = None, salt: str | None = None):
        self.index, self.salt = index, salt
        self.name = "suffix"
        self.calls = 0  # no model
        self.model_backend = None
        self._own = Corpus()  # the current text
        self._text: list[int] = []  # what _own holds
        self._found: Proposal = NOTHING

    def lookup(self, context: list[int], k: int) -> Proposal:
        if len(context) < len(self._text) or context[: len(self._text)] != self._text:  # another text
            self._own, self._text = Corpus(), []
        self._own.extend(context[len(self._text):])
        self._text = list(context)
        served = self.index.corpus(self.salt) if self.index is not None else None
        return propose([self._own] if served is None else [served, self._own], context, k)

    def offer(self, context, k, grammar: GrammarState | None = None) -> Offer:
        found = self.lookup(context, k)
        if grammar is not None:
            cut = grammar.accepted_prefix(found.tokens)
            found = Proposal(cut, found.match, found.confidences[: len(cut)])
        self._found = found
        if not found.tokens:
            return Offer({})
        source = suffix_source(found.match)
        return Offer({source: len(found.tokens)}, 0, ((source, tuple(found.tokens)),))

    def draft(self, context, plan: Plan, sampler, grammar: GrammarState | None = None) -> Draft:
        if plan.source is None or plan.source.kind != "suffix":
            return Draft.empty()
        n = plan.length
        return lookup_draft(self._found.tokens[:n], plan.source, grammar, self._found.confidences[:n])

    def accept(self, num_accepted: int) -> None:
        pass  # the text's own index follows the context as it comes

    def end(self, text: list[int]) -> None:
        """A generation is over: its whole text (prompt and answer) joins the index."""
        if self.index is not None:
            self.index.add(text, self.salt)
        self._own, self._text = Corpus(), []

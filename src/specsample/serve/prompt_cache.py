"""Prompt prefixes kept in host memory beyond what the slots' own caches hold.

A slot's cache holds one text: the request that lands on it next replaces what it does
not share (cache_prompt keeps only the shared start). An agent's conversation loses its
prefix to every side request that takes its slot (aider's summaries, a title request),
and its next turn is scored whole again. So before a request overwrites most of a
slot, the worker copies the slot's cache out (Backend.save_sequence) into this cache;
a later request whose prompt starts with more of an entry than its slot holds gets the
entry restored into its slot, and scores only the rest.

Reuse stays exact: an entry is a cache of tokens at positions 0 to n - 1, and a
request reuses only the start it shares with the entry token for token, at the same
positions (the restore cuts the rest off, as a rollback does).

Example, salt None, room for two entries of this size: a conversation C = [s, u1, a1]
is stored when a side request X = [s, x] takes its slot; then C + [u2] finds C
(length 3) while its slot holds X (shares 1): C is restored and only [u2] scored.
Storing C + [u2, a2] later replaces C, which it extends (C can serve nothing the
longer entry cannot); storing a third text evicts the least recently used entry.

Entries are partitioned by `cache_salt` (worker.py): a request only ever sees its own
salt's, so neither its cached_tokens nor its time to the first token tell it anything
of another salt's text.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ..backends.base import Backend, NoRoom, SavedSequence, common_prefix_length

# serve --prompt-cache-mib. The default pair's keys and values take 2 x layers x KV
# width x 2 bytes a token: 28 KiB for the 1.5B target, 12 KiB for the 0.5B draft (from
# their GGUF headers: 28 and 24 layers, 256 and 128 wide), so 2 GiB hold about 52k tokens
# of text: six conversations of aider's 8k.
DEFAULT_MIB = 2048


@dataclass(frozen=True, eq=False)
class Entry:
    salt: str | None
    tokens: tuple[int, ...]  # the target's: what a prompt is matched against
    # What to restore: the target's cache, and the draft model's where there is one
    # (its own tokens: a draft that read a window of the text holds another list).
    target: SavedSequence
    draft: SavedSequence | None

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft is not None else 0)


class PromptCache:
    """Entries by salt, least recently used first; at most `max_bytes` held."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"the prompt cache's size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # id -> entry, LRU first
        self.bytes = 0
        # Counters for /metrics: restores, the tokens they gave back, entries stored
        # and evicted.
        self.hits = self.reused_tokens = self.stored = self.evicted = 0
        self.no_room = 0  # restores the backend had no room for (before_prompt): the prompt scored whole

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self, salt: str | None) -> list[Entry]:
        """The salt's entries, least recently used first."""
        return [e for e in self._entries.values() if e.salt == salt]

    def holds(self, salt: str | None, tokens: list[int]) -> bool:
        """Whether an entry of the salt starts with `tokens` (storing them would add nothing)."""
        tokens, n = tuple(tokens), len(tokens)
        return any(e.salt == salt and e.tokens[:n] == tokens for e in self._entries.values())

    def store(self, salt: str | None, target: SavedSequence, draft: SavedSequence | None = None) -> bool:
        """Keep the saved caches under `salt` (the most recently used), unless the salt
        holds an entry that starts with the same tokens already; entries it extends go,
        then the least recently used until it fits. False when it was not kept: held
        already, or larger than the whole cache."""
        entry = Entry(salt, tuple(target.tokens), target, draft)
        if not entry.tokens or entry.nbytes > self.max_bytes:
            return False
        n = len(entry.tokens)
        for key, old in list(self._entries.items()):
            if old.salt != salt:
                continue
            if old.tokens[:n] == entry.tokens:  # held whole already: only its use is new
                self._entries.move_to_end(key)
                return False
            if entry.tokens[: len(old.tokens)] == old.tokens:  # the new entry serves all it served
                self._drop(key)
        while self.bytes + entry.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        self._entries[id(entry)] = entry
        self.bytes += entry.nbytes
        self.stored += 1
        return True

    def longest(self, salt: str | None, tokens: list[int]) -> tuple[Entry, int] | None:
        """The salt's entry that shares the longest start with `tokens`, and that
        length (None: no entry shares a token); it becomes the most recently used."""
        best, length, tokens = None, 0, tuple(tokens)
        for key, entry in self._entries.items():
            if entry.salt == salt:
                n = common_prefix_length(entry.tokens, tokens)
                if n > length:
                    best, length = key, n
        if best is None:
            return None
        self._entries.move_to_end(best)
        return self._entries[best], length

    def reused(self, tokens: int) -> None:
        """An entry was restored, giving back `tokens` of a prompt."""
        self.hits += 1
        self.reused_tokens += tokens

    def drop(self, salt: str | None) -> int:
        """Forget every entry of `salt` (a slot erase); how many there were."""
        keys = [key for key, entry in self._entries.items() if entry.salt == salt]
        for key in keys:
            self._drop(key)
        return len(keys)

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes


def before_prompt(cache: PromptCache, salt: str | None, slot: Backend, draft: Backend | None, prompt: list[int],
                  reuse: bool) -> None:
    """Before `prompt` goes into a slot (of the target; `draft`: the draft model's, or
    None) filled under `salt`: what the slot holds is kept when the prompt would replace
    most of it (a side request in a conversation's slot); then, with `reuse`
    (cache_prompt), a longer start of the prompt held here than the slot's own is
    restored into the slot, the draft's with it, and generate() scores only the rest."""
    held = slot.cached_tokens() or []
    own = common_prefix_length(held, prompt) if reuse else 0
    found = cache.longest(salt, prompt) if reuse else None  # before keep() can evict it
    if len(held) - own > own:
        keep(cache, salt, slot, draft)
    entry, length = found or (None, 0)
    if min(length, len(prompt) - 1) <= own:  # generate() scores the prompt's last token again in any case
        return
    try:
        slot.restore_sequence(0, entry.target, length)
    except NoRoom:  # the slot is left empty: the prompt is scored whole, as without the cache
        cache.no_room += 1
        return
    if draft is not None and entry.draft is not None:
        # The draft's copy is its own text (a windowed draft reads less of it): it is
        # restored where it shares more with the prompt than the draft's slot does.
        drafted = common_prefix_length(entry.draft.tokens, tuple(prompt))
        if drafted > common_prefix_length(draft.cached_tokens() or [], prompt):
            try:
                draft.restore_sequence(0, entry.draft, drafted)
            except NoRoom:  # left empty: the drafter reads the prompt again
                cache.no_room += 1
    cache.reused(min(length, len(prompt) - 1))


def keep(cache: PromptCache, salt: str | None, slot: Backend, draft: Backend | None) -> None:
    """A slot's text, and the draft model's, into the cache under the salt that filled
    them (unless an entry holds it already)."""
    if not slot.length or cache.holds(salt, slot.cached_tokens() or []):
        return
    drafted = draft.save_sequence() if draft is not None and draft.saves_sequences and draft.length else None
    cache.store(salt, slot.save_sequence(), drafted)

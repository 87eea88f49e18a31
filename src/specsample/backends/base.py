"""The small interface every model engine implements.

A backend owns its KV cache; the generation loop only sees an integer length, and
marks on the backend object who filled the cache last (claim_cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .fim_tokens import FimFormat


class Tokenizer(Protocol):
    chat_template: str | None  # the model's own (jinja), None without one; tools.py reads its tool-call format

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def text_ids(self, text: str) -> list[int]:
        """Token ids of text as text: special-token spellings stay characters, and no
        BOS/EOS is added (the pieces of a prompt the caller assembles, output/fim.py)."""
        ...

    def chat_prompt(self, text: str) -> list[int]:
        """Token ids of a one-turn user chat, ready for the assistant's reply."""
        ...

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None,
                      check: Callable[[], None] | None = None) -> list[int]:
        """Token ids of a chat ({"role", "content"} dicts, and an assistant's earlier
        "tool_calls"), ready for the assistant's reply; `tools` ({"type": "function",
        "function": {...}} dicts) go to the chat template, which writes them in.
        `check()`, called between messages, may raise to stop (chat.chat_token_ids)."""
        ...


class Backend(Protocol):
    """Engines subclass it for the defaults below; what the loop and the bench read
    is declared here, never probed for."""

    name: str
    vocab_size: int  # rows of the tokenizer's vocabulary; logits are cut to this width
    eos_token_ids: frozenset[int]
    context_length: int
    tokenizer: Tokenizer | None
    engine: str = "other"  # "hf", "llamacpp": which engine runs the model (the bench picks its peers by it)
    # False for recurrent state, which cannot be rolled back: the loop then refuses to
    # draft with the model before any output.
    supports_rollback: bool = True
    # Identifies engine, model file and thread count in the planner's cost
    # cache (calibrate.py); None: no stable identity, nothing is cached.
    cost_key: str | None = None
    # The model's fill-in-the-middle tokens, read from its vocabulary; None: it has none.
    fim: FimFormat | None = None
    # save_sequence and restore_sequence work (the server's host prompt cache:
    # serve/prompt_cache.py); False: the engine cannot copy its cache out.
    saves_sequences: bool = False

    @property
    def length(self) -> int:
        """Tokens currently held in the cache."""
        ...

    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        """Append token_ids to the cache; logits for the last num_logits of them.

        Returns [num_logits, vocab_size]; row i predicts the token after
        token_ids[len(token_ids) - num_logits + i].
        """
        ...

    def rollback(self, length: int) -> None:
        """Forget every cached token past the first `length`."""
        ...

    def cached_tokens(self) -> list[int] | None:
        """The tokens the cache holds, in order, where the backend keeps count of them
        (a new prompt that starts with them need not be scored again: GenerationConfig's
        cache_prompt); None where it does not."""
        return None

    # Several sequences at once (batching.py): a backend that holds more than one
    # overrides these; score() and rollback() above are its sequence 0.
    sequences: int = 1

    def score_many(self, requests: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
        """score() for several sequences in one call: (sequence, token_ids, num_logits)
        each, at most one per sequence; each request's [num_logits, vocab] rows."""
        if [seq for seq, _, _ in requests] != [0]:
            raise ValueError(f"{self.name} holds one sequence (0); asked for {[seq for seq, _, _ in requests]}")
        _, token_ids, num_logits = requests[0]
        return [self.score(token_ids, num_logits)]

    def sequence_length(self, seq: int) -> int:
        return self.length

    def sequence_tokens(self, seq: int) -> list[int] | None:
        return self.cached_tokens()

    def rollback_sequence(self, seq: int, length: int) -> None:
        self.rollback(length)

    def save_sequence(self, seq: int) -> SavedSequence:
        """A copy of what sequence `seq`'s cache holds, which restore_sequence puts back
        into any sequence of this backend (where saves_sequences)."""
        raise NotImplementedError(f"{self.name} cannot copy its cache out")

    def restore_sequence(self, seq: int, saved: SavedSequence, length: int) -> None:
        """Sequence `seq`'s cache replaced by the first `length` tokens of `saved`, at
        their own positions: what scoring saved.tokens[:length] there would leave; or
        NoRoom raised, the sequence left empty, where the cache has no room for them."""
        raise NotImplementedError(f"{self.name} cannot restore a saved cache")


@dataclass(frozen=True, eq=False)
class SavedSequence:
    """One sequence's cache, copied out of its backend (save_sequence)."""

    tokens: tuple[int, ...]  # what its cells hold, in order: positions 0 to len - 1
    data: object  # the engine's own copy: llama.cpp's state bytes, a transformers cache
    nbytes: int  # the memory `data` holds


# What describes the model rather than one sequence of it: a view of some of its
# sequences (batching.Slot, SeparateSequences) takes these from the backend behind it.
MODEL_ATTRIBUTES = ("vocab_size", "eos_token_ids", "context_length", "tokenizer", "engine", "supports_rollback",
                    "cost_key", "fim", "saves_sequences")


def take_model_attributes(view: Backend, source: Backend) -> None:
    for attribute in MODEL_ATTRIBUTES:
        setattr(view, attribute, getattr(source, attribute))


class SeparateSequences(Backend):
    """Single-sequence backends (sharing one model's weights) as one backend holding
    several sequences, each request a call of its own: what transformers gets. Its
    cache (DynamicCache) is one tensor per layer for the whole batch, so a batched
    call would need every sequence padded to one length and rolled back together,
    while speculation rolls each back by its own verdict."""

    def __init__(self, backends: list[Backend]):
        if not backends:
            raise ValueError("need at least one backend")
        self.backends = backends
        self.sequences = len(backends)
        first = backends[0]
        self.name = first.name
        take_model_attributes(self, first)

    @property
    def length(self) -> int:
        return self.backends[0].length

    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        return self.backends[0].score(token_ids, num_logits)

    def rollback(self, length: int) -> None:
        self.backends[0].rollback(length)

    def sequence_length(self, seq: int) -> int:
        return self.backends[seq].length

    def cached_tokens(self) -> list[int] | None:
        return self.backends[0].cached_tokens()

    def sequence_tokens(self, seq: int) -> list[int] | None:
        return self.backends[seq].cached_tokens()

    def score_many(self, requests: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
        return [self.backends[seq].score(token_ids, num_logits) for seq, token_ids, num_logits in requests]

    def rollback_sequence(self, seq: int, length: int) -> None:
        self.backends[seq].rollback(length)

    def save_sequence(self, seq: int) -> SavedSequence:
        return self.backends[seq].save_sequence(0)

    def restore_sequence(self, seq: int, saved: SavedSequence, length: int) -> None:
        self.backends[seq].restore_sequence(0, saved, length)


def trim_padding(size: int, token_text) -> int:
    """Vocabulary size without trailing padding entries ("[PAD151665]" ... in Qwen).

    Checkpoints pad their embedding rows (Qwen: 151,665 tokens padded to 151,936),
    and converters name the extra rows "[PAD<id>]" or leave them empty. They are
    never real tokens; cutting them in every backend makes backends agree on the
    width of the distribution, so a llama.cpp draft can serve an HF target.
    """
    while size > 0 and _is_padding(token_text(size - 1)):
        size -= 1
    return size


def _is_padding(text: str | None) -> bool:
    return not text or text.startswith(("[PAD", "<pad_"))


class BackendError(RuntimeError):
    """What a backend returned, or holds, cannot be used; the message names the model."""


class NoRoom(BackendError):
    """A saved cache could not be put back for want of room (restore_sequence): the
    sequence is left empty, and its text can be scored again instead."""


def claim_cache(backend: Backend) -> object:
    """Take the backend's cache for the caller; returns the claim to check it with.

    A backend's cache holds one sequence. Whoever fills it (a stream for its target,
    a model drafter for its draft model) claims it first, and the newest claim wins,
    so a new stream simply takes over a backend that an earlier one left. The claim
    is kept on the backend object, which gives every engine this check without a
    change to the protocol.
    """
    claim = object()
    backend._cache_claim = claim
    return claim


def holds_cache(backend: Backend, claim: object | None, length: int) -> bool:
    """Whether the backend still holds the `length` tokens the claim's owner left:
    nobody has claimed it since, nor changed its length."""
    return claim is not None and getattr(backend, "_cache_claim", None) is claim and backend.length == length


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many first tokens two token lists share (what of a cache a new text can keep)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def check_cache(backend: Backend, claim: object, length: int) -> None:
    if not holds_cache(backend, claim, length):
        raise BackendError(
            f"{backend.name}: the cache no longer holds this generation's text; another generation or drafter "
            f"used the same backend object in between. A backend holds one sequence: finish (or drop) one "
            f"stream before starting the next, and give a draft model a backend of its own"
        )


def finite_logits(logits: torch.Tensor, model: str) -> torch.Tensor:
    """logits [n, vocab], unless a row holds NaN or +inf, or nothing but -inf.

    -inf alone is a token the backend rules out (a truncated draft vocabulary), so
    only each row's maximum is checked: NaN propagates into it, and it is +inf or
    -inf exactly when the row is unusable. One reduction, cheap beside the softmax;
    the n maxima are checked in Python (torch.isfinite is several ops, ~7 us a call,
    which the toy models' millions of rows in the tests feel).
    """
    if not all(map(math.isfinite, logits.amax(-1).tolist())):
        raise BackendError(f"{model} returned NaN or infinite logits; float16 weights overflow on some inputs: "
                           f"load the model in bfloat16 or float32 (if it already is, its weights are damaged: "
                           f"fetch or convert it again)")
    return logits


class VocabularyMismatch(ValueError):
    pass


class ChatTemplateError(ValueError):
    """A model's chat template refused the messages (its own raise_exception, or a
    template error): bad input, reported in one line, not a crash."""


def check_same_vocabulary(target: Backend, draft: Backend) -> None:
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatch(
            f"draft and target vocabularies differ: target {target.name} has "
            f"{target.vocab_size} tokens, draft {draft.name} has {draft.vocab_size}"
        )

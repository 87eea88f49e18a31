"""The small interface every model engine implements.

A backend owns its KV cache; the generation loop only sees an integer length.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def chat_prompt(self, text: str) -> list[int]:
        """Token ids of a one-turn user chat, ready for the assistant's reply."""
        ...


class Backend(Protocol):
    name: str
    vocab_size: int  # rows of the tokenizer's vocabulary; logits are cut to this width
    eos_token_ids: frozenset[int]
    context_length: int
    tokenizer: Tokenizer | None

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


class VocabularyMismatch(ValueError):
    pass


def check_same_vocabulary(target: Backend, draft: Backend) -> None:
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatch(
            f"draft and target vocabularies differ: target {target.name} has "
            f"{target.vocab_size} tokens, draft {draft.name} has {draft.vocab_size}"
        )

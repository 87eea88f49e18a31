"""The one rule for what a generation needs of a model's context, which stream()
checks for every model of the round and the server uses to size max_tokens."""

from __future__ import annotations


def new_token_room(context_length: int, prompt_length: int, k_max: int) -> int:
    """How many new tokens fit after a prompt of prompt_length tokens.

    Every model in a round holds the text so far plus up to k_max drafts, and the
    target scores one row past them (the bonus token's), so n new tokens need
    prompt_length + n + k_max + 1 positions. Below 1: the prompt alone leaves no room.
    """
    return context_length - prompt_length - k_max - 1

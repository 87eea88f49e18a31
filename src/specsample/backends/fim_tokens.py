"""A model's fill-in-the-middle tokens, as its backend finds them in its vocabulary.

llama.cpp names them in a GGUF's vocabulary (`llama_vocab_fim_pre` ...), and a Hugging
Face tokenizer has them among its tokens, spelled as the model family spells them
(FIM_SPELLINGS, the spellings llama.cpp's vocabulary loader recognises). A model without
prefix, suffix and middle tokens has no FimFormat, and a FIM request to it is refused.
The prompt built from them is output/fim.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class FimFormat:
    """A model's fill-in-the-middle token ids (None: the model has no such token)."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo: int | None = None  # opens the repository-level context
    file_sep: int | None = None  # starts each file of it
    bos: int | None = None  # the token the model's vocabulary puts first, if it wants one


# The spellings llama.cpp's vocabulary loader recognises for each FIM token, by family.
FIM_SPELLINGS = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
               "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
               "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
               "<|code_middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file_sep": ("<|file_sep|>",),
}


def fim_from_tokens(token_ids: Mapping[str, int], bos: int | None = None) -> FimFormat | None:
    """The FimFormat of a vocabulary given as token text -> id; None without prefix,
    suffix and middle tokens. The first spelling the vocabulary has wins, as in llama.cpp."""
    found = {role: next((token_ids[s] for s in spellings if s in token_ids), None)
             for role, spellings in FIM_SPELLINGS.items()}
    return fim_from_ids(found, bos)


def fim_from_ids(ids: Mapping[str, int | None], bos: int | None = None) -> FimFormat | None:
    """The FimFormat of role -> id (None or a negative id: no such token)."""
    known = {role: i for role, i in ids.items() if i is not None and i >= 0}
    if not all(role in known for role in ("prefix", "suffix", "middle")):
        return None
    return FimFormat(**known, bos=bos)

"""Fill-in-the-middle: a model's FIM tokens, and the prompt that asks it for the text
between a prefix and a suffix.

The tokens are the model's own: llama.cpp names them in a GGUF's vocabulary
(`llama_vocab_fim_pre` ...), and a Hugging Face tokenizer has them among its tokens,
spelled as the model family spells them (FIM_SPELLINGS, the spellings llama.cpp's
vocabulary loader recognises). A model without prefix, suffix and middle tokens has no
FimFormat, and a FIM request to it is refused.

The prompt is PSM (prefix, suffix, middle), with other files of the project before it
as llama.cpp's server lays out /infill (the repository-level pattern of Qwen2.5-Coder,
arXiv 2409.12186). Worked example, a model with repo and file-separator tokens, one
extra file `a.py` holding `x = 1`, prefix `def f(`, suffix `)`:

    <repo>myproject\\n <sep>a.py\\n x = 1 <sep>filename\\n <pre>def f( <suf>) <mid>

Without those tokens the files are joined by a plain-text snippet marker. Every text
piece is tokenized as text: a user's `<|fim_middle|>` stays those characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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


@dataclass(frozen=True)
class ExtraFile:
    """Another file of the project, given as context (llama.cpp's input_extra)."""

    filename: str
    text: str


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

# llama.cpp's server names the repository and the file being edited with these
# placeholders (its /infill takes no names for them); the separator between extra files
# when the model has no file-separator token is its plain-text one.
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


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


def fim_prompt(fim: FimFormat, text_ids: Callable[[str], list[int]], prefix: str, suffix: str,
               extra: Iterable[ExtraFile] = (), prompt: str = "") -> list[int]:
    """The prompt's token ids: the extra files (if any), then prefix token, prefix and
    `prompt` (text typed after the prefix, as llama.cpp's /infill places it), suffix token,
    suffix, middle token. `text_ids` tokenizes text as text, adding nothing."""
    ids = [fim.bos] if fim.bos is not None else []
    ids += extra_context(fim, text_ids, list(extra))
    ids += [fim.prefix] + text_ids(prefix) + text_ids(prompt)
    ids += [fim.suffix] + text_ids(suffix)
    return ids + [fim.middle]


def extra_context(fim: FimFormat, text_ids: Callable[[str], list[int]], extra: list[ExtraFile]) -> list[int]:
    """The repository-level context before the FIM prefix; nothing without extra files
    (llama.cpp's server writes its header even then; a plain FIM prompt is what a
    completion with a suffix gets, so /infill without files asks the same)."""
    if not extra:
        return []
    ids = [fim.repo] + text_ids(REPO_NAME + "\n") if fim.repo is not None else []
    for file in extra:
        if fim.file_sep is not None:
            ids += [fim.file_sep] + text_ids(file.filename + "\n")
        else:
            ids += text_ids(SNIPPET_SEPARATOR)
        ids += text_ids(file.text)
    if fim.file_sep is not None:
        ids += [fim.file_sep] + text_ids(CURRENT_FILE + "\n")
    return ids

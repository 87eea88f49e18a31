"""Fill-in-the-middle: the prompt that asks a model for the text between a prefix and a
suffix, in the model's own FIM tokens (backends/fim_tokens.py, Backend.fim).

The prompt is PSM (prefix, suffix, middle), with other files of the project before it
as llama.cpp's server lays out /infill (the repository-level pattern of Qwen2.5-Coder,
arXiv 2409.12186). Worked example, a model with repo and file-separator tokens, one
extra file `a.py` holding `x = 1`, prefix `def f(`, suffix `)`:

    <repo>myproject\\n <sep>a.py\\n x = 1 <sep>filename\\n <pre>def f( <suf>) <mid>

Without those tokens the files are joined by a plain-text snippet marker. Every text
piece is tokenized as text: a user's `<|fim_middle|>` stays those characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..backends.fim_tokens import FimFormat


@dataclass(frozen=True)
class ExtraFile:
    """Another file of the project, given as context (llama.cpp's input_extra)."""

    filename: str
    text: str


# llama.cpp's server names the repository and the file being edited with these
# placeholders (its /infill takes no names for them); the separator between extra files
# when the model has no file-separator token is its plain-text one.
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


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

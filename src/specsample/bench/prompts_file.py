"""`bench --prompts-file FILE`: the user's own prompts as a task.

One JSON object a line: `{"prompt": "..."}` (the user's turn, in the target's chat
template) or `{"messages": [{"role": ..., "content": ...}, ...]}` (a whole chat), with
an optional `"kind"` (rows are reported per kind, as the chat task's are) and `"id"`.
Blank lines and lines starting with `#` are skipped. Every prompt of the file runs
unless `--prompts prompts=N` asks for fewer; answers run to the end of the turn or
`--max-new-tokens` (default 256).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..app.arguments import UsageError
from .tasks import TASKS, Prompt, Task

NAME = "prompts"
MAX_NEW_TOKENS = 256
ROLES = ("system", "user", "assistant", "tool")


def read_prompts(path: Path) -> list[Prompt]:
    """The file's prompts, or a UsageError naming the line that is not one."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--prompts-file {path}: {e}") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            prompts.append(_prompt(json.loads(line) if _is_json(line) else None, f"{path}:{number}", len(prompts)))
    if not prompts:
        raise UsageError(f"--prompts-file {path} holds no prompt")
    return prompts


def register(path: Path) -> list[Prompt]:
    """Make the file's prompts the task named "prompts" (TASKS), and return them."""
    prompts = read_prompts(path)
    TASKS[NAME] = Task(NAME, chat=True, max_new_tokens=MAX_NEW_TOKENS, stop_strings=(), load=lambda: list(prompts))
    return prompts


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _prompt(row, where: str, index: int) -> Prompt:
    if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
        raise UsageError(f"{where}: each line is a JSON object with either \"prompt\" or \"messages\"")
    kind = row.get("kind")
    if kind is not None and (not isinstance(kind, str) or not kind.strip() or "/" in kind):
        raise UsageError(f"{where}: \"kind\" is a non-empty string without '/'")
    id = str(row.get("id", f"{NAME}-{index}"))
    if "prompt" in row:
        text = row["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"{where}: \"prompt\" is a non-empty string")
        return Prompt(NAME, id, text, kind=kind, messages=({"role": "user", "content": text},))
    messages = row["messages"]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
        raise UsageError(f"{where}: \"messages\" is a list of {{\"role\": one of {', '.join(ROLES)}, "
                         "\"content\": a string}")
    return Prompt(NAME, id, messages[-1]["content"], kind=kind, messages=tuple(dict(m) for m in messages))

"""Multi-turn sessions as a coding agent and an editor send them, built from the
installed Python's standard library (no download): each a sequence of OpenAI requests
in which a turn's request depends on the answers before it, deterministically.

- agent: a coding agent editing one file. Each turn sends the whole current file and
  asks for one change to one function; the answer is a search/replace block (even
  sessions) or the whole new function (odd ones: a whole file does not fit the bench's
  answer limit, a whole function does). The next turn's file holds the change: the
  model's own edit where it parses and applies exactly, else the scripted edit the
  instruction describes.
- tools: a tool-calling loop. One conversation, appended to: the assistant's tool call
  (the model's where it names one of the tools, else the turn's scripted call) and the
  tool's scripted result. Between turns a side request (a one-sentence summary, as
  aider sends) comes from the same client.
- fim: an editor's fill-in-the-middle requests down a growing file: each turn the text
  before the cursor is the file from its start up to a function's body, the text after
  it the lines after that body; the next turn's cursor is the next function's body,
  with the held-out body typed in (the installed Python's own, so every server sees the
  same file).

A session is a small object: `body()` is the next request (without `model`), and
`observe(reply)` feeds it the answer; `turns` of them make the session.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from dataclasses import dataclass, field

AGENT_MODULES = ("bisect", "fnmatch", "base64", "quopri")  # two short functions or more in FILE_LINES
TOOL_MODULES = ("html", "colorsys", "quopri", "string")
FIM_MODULES = ("calendar", "base64", "glob", "gettext")  # the first two hold short bodies early on
SHORT_FUNCTION = 14  # lines at most: a whole new function must fit the answer limit
FILE_LINES = 80  # an agent's file: the module's start, cut after its last top-level statement within this
FIM_SUFFIX_LINES = 20


@dataclass
class Reply:
    """What a server answered one turn: its text, and the tool calls it made (name,
    arguments as JSON text)."""

    text: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)


def module_source(name: str, lines: int | None = None) -> str:
    """The module's source; with `lines`, its start up to the end of the last top-level
    statement that ends within that many lines (a file of a size every turn can afford
    to prefill on two cores)."""
    source = inspect.getsource(importlib.import_module(name))
    if lines is None:
        return source
    end = max(node.end_lineno for node in ast.parse(source).body if node.end_lineno <= lines)
    return "".join(source.splitlines(keepends=True)[:end])


def short_functions(source: str) -> list[ast.FunctionDef]:
    """Top-level functions of at most SHORT_FUNCTION lines with at least one parameter."""
    return [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.args.args
            and n.end_lineno - n.lineno + 1 <= SHORT_FUNCTION]


def find_function(source: str, name: str) -> ast.FunctionDef | None:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


# ---- the agent's edits ----

def body_start(node: ast.FunctionDef) -> tuple[int, str]:
    """(0-based line where a new first statement goes, its indentation): after the
    signature and the docstring."""
    has_doc = ast.get_docstring(node) is not None
    first = node.body[1] if has_doc and len(node.body) > 1 else node.body[0]
    line = node.body[0].end_lineno if has_doc and len(node.body) == 1 else first.lineno - 1
    return line, " " * first.col_offset


INSTRUCTIONS = (
    ("guard", "Add a check at the start of `{f}` that raises TypeError when `{a}` is None."),
    ("rename", "Rename the parameter `{a}` of `{f}` to `{a}_value`, everywhere inside `{f}`."),
    ("print", "Make `{f}` print its argument `{a}` (with print) before anything else it does."),
)


def scripted_edit(source: str, kind: str, name: str, arg: str) -> str:
    """The edit an instruction describes, made without the model."""
    lines = source.splitlines(keepends=True)
    node = find_function(source, name)
    if kind == "rename":
        start, end = node.lineno - 1, node.end_lineno
        renamed = [re.sub(rf"\b{re.escape(arg)}\b", f"{arg}_value", line) for line in lines[start:end]]
        return "".join(lines[:start] + renamed + lines[end:])
    at, indent = body_start(node)
    new = ([f"{indent}if {arg} is None:\n", f'{indent}    raise TypeError("{arg} must not be None")\n']
           if kind == "guard" else [f'{indent}print("{name}", {arg})\n'])
    return "".join(lines[:at] + new + lines[at:])


SEARCH_REPLACE = re.compile(r"<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE", re.S)
FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.S)


def apply_search_replace(source: str, answer: str) -> str | None:
    """The file with the answer's first search/replace block applied, or None when
    there is none or its search text is not found exactly once."""
    block = SEARCH_REPLACE.search(answer)
    if block is None or not block.group(1) or source.count(block.group(1)) != 1:
        return None
    return source.replace(block.group(1), block.group(2), 1)


def apply_whole_function(source: str, answer: str, name: str) -> str | None:
    """The file with function `name` replaced by the answer's definition of it (the
    first fenced block, or the whole answer), or None when the answer holds none."""
    fenced = FENCE.search(answer)
    code = fenced.group(1) if fenced else answer
    try:
        new = find_function(code, name)
    except SyntaxError:
        return None
    old = find_function(source, name)
    if new is None or old is None:
        return None
    code_lines, lines = code.splitlines(keepends=True), source.splitlines(keepends=True)
    start = min([new.lineno, *(d.lineno for d in new.decorator_list)]) - 1
    replacement = "".join(code_lines[start:new.end_lineno]).rstrip("\n") + "\n"
    return "".join(lines[:old.lineno - 1]) + replacement + "".join(lines[old.end_lineno:])


class AgentSession:
    """A file edited over turns, one instruction a turn, cycling through the file's
    short functions and the instructions."""

    kind = "agent"

    def __init__(self, module: str, whole_function: bool, max_tokens: int):
        self.id, self.path = f"agent-{module}", f"{module}.py"
        self.source, self.whole_function, self.max_tokens = module_source(module, FILE_LINES), whole_function, max_tokens
        self.functions = [f.name for f in short_functions(self.source)]
        self.turn, self.applied = 0, []  # applied: per turn, whether the model's own edit was taken

    def _instruction(self) -> tuple[str, str, str, str]:
        """(kind, function, its first parameter as the file now has it, the instruction)."""
        name = self.functions[self.turn % len(self.functions)]
        arg = find_function(self.source, name).args.args[0].arg
        kind, text = INSTRUCTIONS[self.turn % len(INSTRUCTIONS)]
        return kind, name, arg, text.format(f=name, a=arg)

    def body(self) -> dict:
        _, name, _, instruction = self._instruction()
        form = (f"Answer with the whole new definition of `{name}` in one ```python block, and nothing else."
                if self.whole_function else
                "Answer with one search/replace block and nothing else, in this form:\n<<<<<<< SEARCH\n"
                "(lines copied exactly from the file)\n=======\n(the lines that replace them)\n>>>>>>> REPLACE")
        return {"messages": [
            {"role": "system", "content": "You are an expert Python programmer who edits code as asked."},
            {"role": "user", "content": f"{self.path}\n```python\n{self.source}```\n\n{instruction}\n{form}"}],
            "max_tokens": self.max_tokens}

    def observe(self, reply: Reply) -> None:
        kind, name, arg, _ = self._instruction()
        edited = (apply_whole_function(self.source, reply.text, name) if self.whole_function
                  else apply_search_replace(self.source, reply.text))
        if edited is not None:
            try:
                ast.parse(edited)
            except SyntaxError:
                edited = None
        if edited is None or find_function(edited, name) is None:
            edited = scripted_edit(self.source, kind, name, arg)
            self.applied.append(False)
        else:
            self.applied.append(True)
        self.source = edited
        self.turn += 1


# ---- the tool-calling loop ----

def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_STR, _INT = {"type": "string"}, {"type": "integer"}
TOOLS = [
    _tool("search_code", "Search the repository for a regular expression; answers path:line: text.",
          {"pattern": _STR}, ["pattern"]),
    _tool("read_file", "Read lines of a file of the repository.",
          {"path": _STR, "start_line": _INT, "end_line": _INT}, ["path"]),
    _tool("run_tests", "Run pytest on a test file.", {"path": _STR}, ["path"]),
    _tool("edit_file", "Replace one exact piece of a file's text with another.",
          {"path": _STR, "old_text": _STR, "new_text": _STR}, ["path", "old_text", "new_text"]),
]
READ_LINES = 30  # read_file answers this many lines at most


def _integer(value, default: int) -> int:
    """A tool argument read as an integer: 7 and "7" -> 7, anything else the default."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class ToolSession:
    """One conversation, appended to turn after turn: a call to a tool, the tool's result.
    The tools are scripted over the module's source."""

    kind = "tools"

    def __init__(self, module: str, max_tokens: int):
        self.id, self.path, self.module = f"tools-{module}", f"{module}.py", module
        self.source, self.max_tokens, self.turn = module_source(module, FILE_LINES), max_tokens, 0
        self.function = short_functions(self.source)[0]
        self.applied = []  # per turn, whether the model's own call was taken
        self.messages = [
            {"role": "system", "content": "You are a coding agent working in a repository. Call one tool per turn."},
            {"role": "user", "content": f"{self.path}:\n```python\n{self.source}```\n\nThe test "
                                        f"test_{self.function.name} in tests/test_{module}.py fails. Find out why "
                                        f"with the tools, then fix `{self.function.name}`."}]

    def body(self) -> dict:
        return {"messages": [dict(m) for m in self.messages], "tools": TOOLS, "max_tokens": self.max_tokens}

    def side_body(self) -> dict | None:
        """The side request before this turn: a summary of the last result (none before the first turn)."""
        if self.turn == 0:
            return None
        return {"messages": [{"role": "system", "content": "Summarize the exchange below in one sentence."},
                             {"role": "user", "content": self.messages[-1]["content"]}], "max_tokens": 8}

    def scripted_call(self) -> tuple[str, str]:
        f = self.function
        last = self.source.splitlines()[f.body[-1].lineno - 1].strip()
        calls = [("search_code", {"pattern": f"def {f.name}"}),
                 ("read_file", {"path": self.path, "start_line": f.lineno, "end_line": f.end_lineno}),
                 ("run_tests", {"path": f"tests/test_{self.module}.py"}),
                 ("edit_file", {"path": self.path, "old_text": last, "new_text": last + "  # fixed"})]
        name, arguments = calls[self.turn % len(calls)]
        return name, json.dumps(arguments)

    def result(self, name: str, arguments: str) -> str:
        """What the scripted tool answers."""
        try:
            args = json.loads(arguments)
        except ValueError:
            return "error: the arguments are not JSON"
        if not isinstance(args, dict):
            return "error: the arguments are not an object"
        lines = self.source.splitlines()
        if name == "search_code":
            try:
                hits = [f"{self.path}:{i}: {line}" for i, line in enumerate(lines, 1)
                        if re.search(str(args.get("pattern", "")), line)]
            except re.error:
                return "error: not a regular expression"
            return "\n".join(hits[:8]) or "no matches"
        if name == "read_file":
            if args.get("path") != self.path:
                return f"error: no such file: {args.get('path')}"
            start = max(1, _integer(args.get("start_line"), 1))
            end = min(_integer(args.get("end_line"), len(lines)), start + READ_LINES - 1)
            return "\n".join(f"{i}: {line}" for i, line in enumerate(lines[start - 1:end], start))
        if name == "run_tests":
            f = self.function.name
            return (f"FAILED tests/test_{self.module}.py::test_{f} - AssertionError: {f} returned the wrong value\n"
                    "1 failed, 7 passed in 0.12s")
        if name == "edit_file":
            found = str(args.get("old_text", "")) in self.source and args.get("old_text")
            return f"Applied the edit to {self.path}." if found else f"error: old_text not found in {self.path}"
        return f"error: no tool named {name}"

    def observe(self, reply: Reply) -> None:
        known = {t["function"]["name"] for t in TOOLS}
        own = next(((n, a) for n, a in reply.tool_calls if n in known), None)
        self.applied.append(own is not None)
        name, arguments = own or self.scripted_call()
        call_id = f"call_{self.turn}"
        self.messages += [{"role": "assistant", "content": None, "tool_calls": [
                               {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                          {"role": "tool", "tool_call_id": call_id, "content": self.result(name, arguments)}]
        self.turn += 1


# ---- the editor's fill-in-the-middle ----

class FimSession:
    """Fill-in-the-middle requests down a file: turn t holds out the body of the file's
    t-th function of 2 to SHORT_FUNCTION lines; the text before it is the whole file
    above (so each turn's prompt extends the last one's), after it FIM_SUFFIX_LINES lines."""

    kind = "fim"

    def __init__(self, module: str, max_tokens: int):
        self.id, self.max_tokens, self.turn, self.applied = f"fim-{module}", max_tokens, 0, []
        self.lines = module_source(module).splitlines(keepends=True)
        self.holes = []  # (first, end) 0-based line range of each held-out body
        for node in ast.walk(ast.parse("".join(self.lines))):
            if isinstance(node, ast.FunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body and 2 <= node.end_lineno - body[0].lineno + 1 <= SHORT_FUNCTION:
                    self.holes.append((body[0].lineno - 1, node.end_lineno))
        self.holes.sort()

    def body(self) -> dict:
        first, end = self.holes[self.turn % len(self.holes)]
        return {"prompt": "".join(self.lines[:first]), "suffix": "".join(self.lines[end:end + FIM_SUFFIX_LINES]),
                "max_tokens": self.max_tokens}

    def observe(self, reply: Reply) -> None:
        self.turn += 1


KINDS = ("agent", "tools", "fim")


def make_sessions(kinds: list[str], per_kind: int, max_tokens: int) -> list:
    """`per_kind` sessions of each kind, each on a module of its own."""
    out = []
    for kind in kinds:
        for i in range(per_kind):
            if kind == "agent":
                out.append(AgentSession(AGENT_MODULES[i], i % 2 == 1, max_tokens))
            elif kind == "tools":
                out.append(ToolSession(TOOL_MODULES[i], max_tokens))
            else:
                out.append(FimSession(FIM_MODULES[i], max_tokens))
    return out

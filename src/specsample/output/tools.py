"""Tool calls: the format a chat template teaches its model, the grammar that holds the
output to it, and the parse of the output into calls.

The format is read from the model's chat template, never assumed: a template that
shows its model `<tool_call>` blocks (Hermes-style: Qwen 2.5 and 3, Hermes, and the
models tuned on their data) gets HERMES; a template with no such markup has no
ToolFormat, and a request with tools is refused.

The grammar (a Constraint, so speculation stays exact and forced tokens are free):

- `required`, or a named function: the output is one call, or with parallel calls
  several separated by the format's separator, and nothing else;
- `auto`: any text, until the model writes the trigger (`<tool_call>`): from there the
  call must follow the format and one of the tools' schemas (llguidance's lazy
  lexeme: the text before the trigger matches as little as it can, so the trigger
  ends it). Text without the trigger is unconstrained, but for the model's control
  tokens other than end-of-sequence, which no grammar lets through;
- `none`: any text without the trigger.

Each call's body is JSON in the layout the template itself writes:
`{"name": "get_weather", "arguments": {"city": "Paris"}}`, the arguments held to the
function's parameter schema. Worked example, auto, after `Let me check.<tool_call>`:

    forced     \\n{"name": "          (one function: its name is forced too)
    free       get_weather | get_time (several: the model chooses among the names)
    forced     ", "arguments": {"city": "
    free       Paris  (any string), then "}}\\n</tool_call>" forced

ToolParser reads the text back, incrementally for streams: text outside the calls is
content, each call a name and its arguments' JSON text (as written: it parses and
follows the schema because the grammar held it to that).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .constraints import JSON_LAYOUT, Constraint

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes a call: `trigger`, then `opening`, the JSON body, `closing`;
    several calls apart by `separator`. With `fenced`, a call may also come as the
    body alone in a ```json block, as Qwen2.5-Coder writes calls more often than not
    (llama.cpp's Hermes parser reads them too); it is a call only when it names a tool."""

    name: str
    trigger: str
    opening: str
    closing: str
    separator: str
    fenced: bool = False


HERMES = ToolFormat("hermes", trigger="<tool_call>", opening="\n", closing="\n</tool_call>", separator="\n",
                    fenced=True)

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


def tool_format(template: str | None) -> ToolFormat | None:
    """The tool-call format a chat template shows its model, or None."""
    if template and "tools" in template and HERMES.trigger in template:
        return HERMES
    return None


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name and the JSON schema of its arguments
    (an object). `strict` refuses schema keywords the engine does not enforce, as
    response_format's strict does."""

    name: str
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {},
                                                      "additionalProperties": False})
    strict: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"a tool's name is 1 to 64 letters, digits, _ or -: {self.name!r}")


def tool_constraint(tools: list[Tool], fmt: ToolFormat, choice: str = "auto", parallel: bool = True,
                    markers: Mapping[str, int] | None = None) -> Constraint:
    """The grammar for `choice`: one of CHOICES, or the name of the one function to call.
    `markers`: the format's tags that the engine's tokenizer holds as one special token
    (special_markers), which the grammar names by id."""
    markers = markers or {}
    if choice == "none":
        return Constraint.lark(f"start: NO_CALL\n{_no_call('NO_CALL', fmt)}")
    if choice not in CHOICES:
        tools = [t for t in tools if t.name == choice]
        if not tools:
            raise ValueError(f"no tool is named {choice!r}")
    if not tools:
        raise ValueError(f"tool_choice {choice!r} needs at least one tool")
    tag = fmt.closing.strip()
    bodies = "\n".join(f"body_{i}: %json {json.dumps(_body_schema(t))}" for i, t in enumerate(tools))
    rules = [f"body: {' | '.join(f'body_{i}' for i in range(len(tools)))}", bodies,
             f"rest: {_lit(fmt.opening)} body {_lit(fmt.closing[: -len(tag)])} {_marker(tag, markers)}"]
    trigger = _marker(fmt.trigger, markers)
    if choice == "auto":
        if fmt.trigger in markers:
            # A special token cannot be text: it ends the text before it by itself,
            # and text may not spell it out instead (the reader could not tell them apart).
            rules += [_no_call("TEXT", fmt)]
            calls = [f"TEXT {trigger} rest"]
        else:
            # The text before a call ends at the trigger (lazy): from there the call is held.
            rules += ["TEXT: /(?s:.*)/", f"head[lazy]: TEXT {trigger}"]
            calls = ["head rest"]
        if fmt.fenced:
            rules += ["end: TEXT | fence_head NOT_A_TOOL", *_fenced_rules(tools, fmt)]
            calls.append("fence_head fenced")
        else:
            rules += ["end: TEXT"]
        rules.append(f"call: {' | '.join(calls)}")
        start = "start: call* end" if parallel else "start: end | call"
    else:
        rules += [f"call: {trigger} rest"]
        start = f"start: call ({_lit(fmt.separator)} call)*" if parallel else "start: call"
    # A strict tool's schema refuses keywords the engine cannot enforce (its x-guidance says so).
    return Constraint.lark("\n".join([start, *rules]))


def special_markers(target, fmt: ToolFormat) -> dict[str, int]:
    """The format's tags (trigger, closing tag) that the grammar engine's tokenizer
    holds as one special token: llguidance reads llama.cpp's user-defined `<...>`
    tokens so, Qwen's `<tool_call>` among them. Written as text in a grammar, such a
    tag could not be produced by its own token, the one the model writes."""
    from .constraints import engine_for

    tokenizer = engine_for(target).tokenizer
    out = {}
    for tag in (fmt.trigger, fmt.closing.strip()):
        ids = tokenizer.tokenize_str(tag)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            out[tag] = ids[0]
    return out


def _marker(text: str, markers: Mapping[str, int]) -> str:
    return f"<[{markers[text]}]>" if text in markers else _lit(text)


_WS = "[ \\t\\n]*"


def _fenced_rules(tools: list[Tool], fmt: ToolFormat) -> list[str]:
    """A ```json block that opens like a call, `{"name": `: if the name is a tool's,
    the rest is that tool's call (its arguments under its schema, then the fence's
    end); any other name leaves the rest of the answer free (NOT_A_TOOL, the last
    lexeme: were another to follow, it could begin anywhere and the exclusion would
    hold nothing), so a JSON answer that happens to have a name stays the model's own."""
    names = "|".join(t.name for t in tools)
    # The head ends at the colon (a lazy lexeme takes no whitespace it may leave): what
    # follows, space and the name, decides between a call and free text.
    rules = [f"fence_head[lazy]: TEXT /```(json)?\\n{_WS}\\{{{_WS}\"name\"{_WS}:/",
             f"fenced: {' | '.join(f'fenced_{i}' for i in range(len(tools)))}",
             f"NOT_A_TOOL: /(?s:.*)/ & ~/{_WS}\"({names})\"(?s:.*)/ & ~/(?s:.*){re.escape(fmt.trigger)}(?s:.*)/",
             f"ARGUMENTS_KEY: /{_WS},{_WS}\"arguments\"{_WS}:{_WS}/",
             f"FENCE_END: /{_WS}\\}}{_WS}```/"]
    for i, t in enumerate(tools):
        rules += [f"fenced_{i}: /{_WS}\"{t.name}\"/ ARGUMENTS_KEY arguments_{i} FENCE_END",
                  f"arguments_{i}: %json {json.dumps({**t.parameters, 'x-guidance': _layout(t)})}"]
    return rules


def _body_schema(tool: Tool) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": _layout(tool)}


def _layout(tool: Tool) -> dict:
    # llguidance's options for a schema: the layout response_format writes in, and the
    # unenforced keywords let through unless the tool is strict.
    return {**JSON_LAYOUT, "lenient": not tool.strict}


def _no_call(name: str, fmt: ToolFormat) -> str:
    """A terminal of any text that does not spell the trigger out."""
    return f"{name}: /(?s:.*)/ & ~/(?s:.*){re.escape(fmt.trigger)}(?s:.*)/"


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


# ---- reading the output back ------------------------------------------------------------

@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int  # the call's place among the answer's calls
    name: str


@dataclass
class Arguments:
    index: int
    text: str  # the next part of the call's arguments, JSON text


Delta = Content | CallStart | Arguments


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    finished: bool = False  # its closing came (else cut off: the arguments are what was written)


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')
FENCE = "```"
_FENCED_HEAD = re.compile(r'```(?:json)?\n' + _HEAD.pattern)
# A fenced call's header, step by step, to tell whether text may still become one.
_FENCED_STEPS = (("text", FENCE), ("optional", "json"), ("text", "\n"), ("space",), ("text", "{"), ("space",),
                 ("text", '"name"'), ("space",), ("text", ":"), ("space",), ("name",), ("space",), ("text", ","),
                 ("space",), ("text", '"arguments"'), ("space",), ("text", ":"))
_HEAD_STEPS = _FENCED_STEPS[3:]  # a tagged call's header, after its trigger


class ToolParser:
    """Text in, Deltas out, as it streams: content, each call's start (its name), and
    its arguments' text in parts. The text outside the calls is content as written,
    but for the whitespace between it and a call (the template's own layout). A call
    whose end never came (max_tokens) keeps the arguments written so far. `names`:
    the tools', which a fenced call must name (fenced formats only)."""

    def __init__(self, fmt: ToolFormat, names=()):
        self.fmt, self.names = fmt, frozenset(names) if fmt.fenced else frozenset()
        self.calls: list[ToolCall] = []
        self._buffer = ""  # text not yet told
        self._state = "text"  # "text", "head" (after the trigger, before the name), "arguments"
        self._closer = ""  # what ends the current call's body: the closing tag, or the fence
        self._after_call = False  # right after a call: whitespace there is layout, unless content came before
        self._told = False  # some content was told
        self._gap = ""  # the whitespace before the trigger last seen
        self.cut = False  # set by finish(): the text ended inside a call

    def feed(self, text: str) -> list[Delta]:
        self._buffer += text
        out: list[Delta] = []
        while {"text": self._text, "head": self._head, "arguments": self._arguments}[self._state](out):
            pass
        return out

    def finish(self) -> list[Delta]:
        """What the text held back tells once no more comes. A call cut off (max_tokens)
        before its name was whole tells nothing, and one cut off after its body closed
        (`}}` and part of the closing tag) is whole: neither leaves call markup in the
        content or a brace in the arguments. `cut` says the text ended inside a call."""
        out: list[Delta] = []
        self.cut = self._state != "text"
        if self._state == "text" and self.calls and self._after_call and self.fmt.trigger.startswith(self._buffer.strip()):
            # Only layout after the last call, or the start of the next one's trigger: cut
            # off between calls, with nothing of the next one to tell.
            self._buffer, self.cut = "", True
        if self._state == "head":
            if _may_open(self._buffer, self.names, _HEAD_STEPS):  # a call whose name never came whole
                self._buffer = ""
            else:  # a trigger that began no call: it was text after all
                self.cut = False
                self._buffer = self._gap + self.fmt.trigger + self._buffer
        elif self._state == "arguments":
            call = self.calls[-1]
            closed = re.fullmatch(r"\s*\}\s*(.*)", self._buffer, re.S)
            if closed is not None and self._closer.startswith(closed.group(1)) and _is_json(call.arguments):
                call.finished = True  # the body's own brace came; its closing tag did not
            else:
                self._tell_arguments(out, self._buffer)
                call.finished = _is_json(call.arguments)  # cut off right after the arguments' own brace
            self._buffer = ""
        if self._buffer.strip() or not self._after_call:
            self._content(out, self._buffer)
        self._buffer, self._state = "", "text"
        return out

    def _text(self, out: list[Delta]) -> bool:
        at = self._buffer.find(self.fmt.trigger)
        held = len(self._buffer) - _partial_suffix(self._buffer, self.fmt.trigger)
        if self.names:
            fence = self._buffer.find(FENCE, 0, at if at >= 0 else len(self._buffer))
            while fence >= 0:
                match = _FENCED_HEAD.match(self._buffer, fence)
                if match is not None and json.loads(match.group(1)) in self.names:
                    self._content(out, self._buffer[:fence].rstrip())
                    self._open(out, json.loads(match.group(1)), FENCE)
                    self._buffer = self._buffer[match.end():]
                    return True
                if match is None and _may_open(self._buffer[fence:], self.names):
                    held = min(held, fence)
                    break
                fence = self._buffer.find(FENCE, fence + 1, at if at >= 0 else len(self._buffer))
            held = min(held, len(self._buffer) - _partial_suffix(self._buffer, FENCE))
        if at >= 0 and at < held:
            before = self._buffer[:at].rstrip()
            self._content(out, before)
            self._gap = self._buffer[len(before):at]  # the layout before the call, text again if none comes
            self._buffer, self._state = self._buffer[at + len(self.fmt.trigger):], "head"
            return True
        # Hold back what may still open a call, and whitespace that may stand before it.
        stripped = self._buffer[:held].rstrip()
        self._content(out, stripped)
        self._buffer = self._buffer[len(stripped):]
        return False

    def _content(self, out: list[Delta], text: str) -> None:
        if self._after_call and not self._told:
            text = text.lstrip()
        if text:
            out.append(Content(text))
            self._after_call, self._told = False, True

    def _head(self, out: list[Delta]) -> bool:
        match = _HEAD.match(self._buffer)
        if match is None:
            return False  # the name is still on its way (the grammar holds what follows a trigger)
        self._open(out, json.loads(match.group(1)), self.fmt.closing.strip())
        self._buffer = self._buffer[match.end():]
        return True

    def _open(self, out: list[Delta], name: str, closer: str) -> None:
        self.calls.append(ToolCall(name, ""))
        out.append(CallStart(len(self.calls) - 1, name))
        self._state, self._closer = "arguments", closer

    def _arguments(self, out: list[Delta]) -> bool:
        match = re.search(r"\s*\}\s*" + re.escape(self._closer), self._buffer)
        if match is not None:
            self._tell_arguments(out, self._buffer[: match.start()])
            self.calls[-1].finished = True
            self._buffer, self._state, self._after_call = self._buffer[match.end():], "text", True
            return True
        # The last `}` may close the body, with the closer on its way: held back.
        keep = len(self._buffer)
        last = self._buffer.rfind("}")
        if last >= 0 and self._closer.startswith(self._buffer[last + 1:].lstrip()):
            keep = len(self._buffer[:last].rstrip())
        self._tell_arguments(out, self._buffer[:keep])
        self._buffer = self._buffer[keep:]
        return False

    def _tell_arguments(self, out: list[Delta], text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            out.append(Arguments(len(self.calls) - 1, text))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _may_open(text: str, names, steps=_FENCED_STEPS) -> bool:
    """Whether text, which begins with a fence, may still become the header of a
    fenced call of one of `names` (it has not yet, and nothing in it rules that out).
    With _HEAD_STEPS: text after a trigger, any name when `names` is empty."""
    i = 0
    for step in steps:
        rest = text[i:]
        if step[0] == "space":
            i += len(rest) - len(rest.lstrip())
        elif step[0] == "name":
            if not rest.startswith('"'):
                return not rest
            end = rest.find('"', 1)
            written = rest[1:] if end < 0 else rest[1:end]
            if names and not any(n.startswith(written) if end < 0 else n == written for n in names):
                return False
            if end < 0:
                return True
            i += end + 1
        else:
            word = step[1]
            if rest.startswith(word):
                i += len(word)
            elif word.startswith(rest):
                return True  # the text ends inside this step
            elif step[0] == "text":
                return False
        if i >= len(text):
            return True
    return not text[i:].strip()  # the whole header: it waits for the arguments' first character


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str, fmt: ToolFormat, names=()) -> tuple[str, list[ToolCall]]:
    """The whole output's content and calls, as the stream tells them."""
    parser = ToolParser(fmt, names)
    deltas = parser.feed(text) + parser.finish()
    return "".join(d.text for d in deltas if isinstance(d, Content)), parser.calls

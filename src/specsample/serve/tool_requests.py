"""A chat request's tools and messages as the chat template takes them, and the
grammar (tools.py) its answer is held to: the one path that checks them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..backends.base import Backend
from ..output.constraints import Constraint, ConstraintError
from ..output.tools import Tool, ToolFormat, special_markers, tool_constraint, tool_format
from .errors import APIError
from .schemas import ChatRequest, Message, ToolDef


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict]  # as the chat template gets them
    constraint: Constraint | None  # None: tool_choice none beside a response_format, which holds the answer
    format: ToolFormat | None  # how to read calls back; None: tool_choice none, no call can come
    names: tuple[str, ...] = ()  # the tools', which a call must name


def tool_plan(request: ChatRequest, target: Backend) -> ToolPlan | None:
    """None without tools. A model whose template shows no tool-call format, a
    tool_choice naming no tool, or a response_format beside calls is a 400. The
    first call builds the grammar engine's tokenizer (about a second): off the loop."""
    choice = _choice(request)
    if not request.tools:
        if choice not in ("none", "auto"):
            raise APIError(400, f"tool_choice {choice!r} needs tools", param="tool_choice", code="invalid_value")
        return None
    fmt = tool_format(target.tokenizer.chat_template)
    if fmt is None:
        raise APIError(400, "tools: this model's chat template shows it no tool-call format specsample reads "
                       "(it reads Hermes-style <tool_call> blocks, as Qwen 2.5 and 3 write them)", param="tools",
                       code="tools_unsupported")
    names = [t.function.name for t in request.tools]
    if len(set(names)) < len(names):
        raise APIError(400, "tools: two tools have the same name", param="tools", code="invalid_value")
    if choice not in ("none", "auto", "required") and choice not in names:
        raise APIError(400, f"tool_choice names {choice!r}, which is not among the tools", param="tool_choice",
                       code="invalid_value")
    if choice != "none" and request.response_format is not None and request.response_format.type != "text":
        raise APIError(400, "response_format and tool calls cannot be combined: give tool_choice \"none\" or no "
                       "response_format", param="response_format", code="invalid_value")
    tools = [_tool(i, t) for i, t in enumerate(request.tools)]
    if choice == "none" and request.response_format is not None and request.response_format.type != "text":
        return ToolPlan(template_tools(request.tools), None, None)
    try:
        constraint = tool_constraint(tools, fmt, choice, request.parallel_tool_calls is not False,
                                     special_markers(target, fmt))
    except ConstraintError as e:
        raise APIError(400, f"tools: {e}", param="tools", code="invalid_value") from None
    return ToolPlan(template_tools(request.tools), constraint, None if choice == "none" else fmt,
                    tuple(t.name for t in tools))


def _choice(request: ChatRequest) -> str:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.function.name


def _tool(index: int, tool: ToolDef) -> Tool:
    """A tool's schema, checked alone so that a bad one is named."""
    function, param = tool.function, f"tools[{index}].function.parameters"
    if function.parameters is None:
        return Tool(function.name, strict=bool(function.strict))
    if function.parameters.get("type", "object") != "object":
        raise APIError(400, f"{param}: a function's parameters are a JSON schema of an object", param=param,
                       code="invalid_value")
    try:
        Constraint.json_schema(function.parameters, strict=bool(function.strict))
    except ConstraintError as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_value") from None
    return Tool(function.name, function.parameters, bool(function.strict))


def template_tools(tools: list[ToolDef] | None) -> list[dict] | None:
    """OpenAI's tool shape, which is also what chat templates read (transformers' convention)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = {"name": tool.function.name}
        if tool.function.description is not None:
            function["description"] = tool.function.description
        function["parameters"] = tool.function.parameters if tool.function.parameters is not None else \
            {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def template_messages(messages: list[Message]) -> list[dict]:
    """Messages as chat templates read them: developer is system, content is text, and
    an earlier call's arguments are an object (templates write them with tojson)."""
    out = []
    for i, m in enumerate(messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise APIError(400, f"missing required parameter: messages.{i}.content (only an assistant message that "
                           "makes tool calls may go without)", param=f"messages.{i}.content",
                           code="missing_required_parameter")
        if m.tool_calls and m.role != "assistant":
            raise APIError(400, f"messages[{i}]: only an assistant message makes tool calls", param=f"messages.{i}",
                           code="invalid_value")
        content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
        message = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.function.name,
                                                   "arguments": _arguments(call.function.arguments, i, j)}}
                                     for j, call in enumerate(m.tool_calls)]
        if m.role == "tool" and m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _arguments(text: str, message: int, call: int):
    try:
        return json.loads(text)
    except ValueError:
        param = f"messages[{message}].tool_calls[{call}].function.arguments"
        raise APIError(400, f"{param}: not JSON", param=param, code="invalid_value") from None

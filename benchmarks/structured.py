"""The structured-output task: fields of a standard-library function's documentation,
extracted into one fixed JSON schema.

Every answer is constrained by the schema (our loops through constraints.py,
llama-server through its `json_schema` field) and checked against it. JSON under a
schema is where much of the text is forced (braces, quotes, keys, separators), so
the share of forced tokens is reported beside the speed.
"""

from __future__ import annotations

import importlib
import inspect
import json

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 60},
        "summary": {"type": "string", "maxLength": 240},
        "parameters": {
            "type": "array",
            "maxItems": 12,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 40}, "optional": {"type": "boolean"}},
                "required": ["name", "optional"],
                "additionalProperties": False,
            },
        },
        "returns": {"type": "string", "maxLength": 160},
        "raises": {"type": "array", "maxItems": 6, "items": {"type": "string", "maxLength": 40}},
    },
    "required": ["name", "summary", "parameters", "returns", "raises"],
    "additionalProperties": False,
}

INSTRUCTION = (
    "Extract these fields from the documentation below and answer in JSON: name (the function's name), summary (one "
    "sentence), parameters (each with its name and whether it is optional), returns (what it returns) and raises (the "
    "exceptions it may raise; an empty list if none are named).\n\n"
)

# Functions whose docstrings say what they take, return and raise, in modules every
# Python carries; their text is the installed Python's own.
FUNCTIONS = (
    "json.dumps", "re.sub", "textwrap.wrap", "shutil.copyfile", "subprocess.run", "heapq.nlargest",
    "statistics.median", "difflib.get_close_matches", "glob.glob", "shlex.split", "base64.b64decode",
    "urllib.parse.urlencode",
)


def structured_docs() -> list[tuple[str, str]]:
    """(qualified name, docstring) of FUNCTIONS."""
    out = []
    for qualified in FUNCTIONS:
        module, name = qualified.rsplit(".", 1)
        doc = inspect.getdoc(getattr(importlib.import_module(module), name))
        if doc:
            out.append((qualified, doc))
    return out


def prompt_text(qualified: str, doc: str) -> str:
    return f"{INSTRUCTION}Documentation of `{qualified}`:\n\n{doc}"


def is_valid(text: str, schema: dict) -> bool:
    """Whether text is JSON that validates against schema."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True

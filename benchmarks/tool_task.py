"""The tool-call task: requests a coding agent makes, each with the one tool it needs.

Each prompt is a user turn and one function (OpenAI's tool shape), written into the
target's chat template, and the answer is held to a call of that function
(tool_choice "required", one call: tools.py's grammar in our loops, the same layout
as a GBNF grammar on llama-server's /completion). Every answer is read back as calls, and is
valid when it holds at least one and each call's arguments follow the schema. A call
is mostly forced text (the wrapper, the name, the keys), which speculation takes for
free, and partly copied from the request (paths, names), which lookup drafts.
"""

from __future__ import annotations

import json

from specsample.output.tools import HERMES, parse_tool_calls


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_STR, _INT, _BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}

# (request, tool): one per schema shape a coding agent sends.
REQUESTS = (
    ("Show me lines 40 to 75 of src/parser/lexer.py.",
     _function("read_file", "Read a file of the repository, or a range of its lines.",
               {"path": _STR, "start_line": {"type": "integer", "minimum": 1}, "end_line": {"type": "integer",
                                                                                            "minimum": 1}},
               ["path"])),
    ("Run the tests in tests/test_tokenizer.py whose names mention unicode, with verbose output.",
     _function("run_tests", "Run the test suite, or part of it, with pytest.",
               {"path": _STR, "keyword": _STR, "verbose": _BOOL}, ["path", "verbose"])),
    ("Find every call to parse_header in Python files under src/, at most 20 results.",
     _function("search_code", "Search the repository for a regular expression.",
               {"pattern": _STR, "glob": _STR, "max_results": {"type": "integer", "minimum": 1, "maximum": 100}},
               ["pattern", "max_results"])),
    ("Commit src/cache.py and tests/test_cache.py with the message: Evict the oldest entry first.",
     _function("git_commit", "Commit the given files with a message.",
               {"message": _STR, "files": {"type": "array", "items": _STR, "minItems": 1}}, ["message", "files"])),
    ("Open a bug report titled 'Crash on empty config file', saying that loading an empty config.toml raises "
     "KeyError instead of using the defaults.",
     _function("create_issue", "Open an issue in the project's tracker.",
               {"title": _STR, "body": _STR,
                "labels": {"type": "array", "items": {"enum": ["bug", "feature", "docs", "question"]}}},
               ["title", "body", "labels"])),
    ("Install pytest-benchmark version 4.0.0 as a development dependency.",
     _function("install_package", "Install a Python package into the project's environment.",
               {"name": _STR, "version": _STR, "dev": _BOOL}, ["name", "dev"])),
    ("Rename the function load_cfg to load_config in src/settings.py.",
     _function("rename_symbol", "Rename a symbol and every reference to it.",
               {"file": _STR, "old_name": _STR, "new_name": _STR}, ["file", "old_name", "new_name"])),
    ("List the files in the docs directory, including hidden ones.",
     _function("list_directory", "List the entries of a directory.",
               {"path": _STR, "include_hidden": _BOOL}, ["path", "include_hidden"])),
    ("Send a GET request to https://api.example.com/v2/status with the header Accept: application/json.",
     _function("http_request", "Send an HTTP request and return the response.",
               {"method": {"enum": ["GET", "POST", "PUT", "DELETE"]}, "url": _STR,
                "headers": {"type": "object", "additionalProperties": _STR}}, ["method", "url"])),
    ("Run `make lint` with a timeout of 120 seconds.",
     _function("run_shell", "Run a shell command in the repository's root.",
               {"command": _STR, "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 3600}},
               ["command", "timeout_seconds"])),
    ("Replace the line `retries = 3` with `retries = 5` in src/client.py.",
     _function("edit_file", "Replace one exact piece of a file's text with another.",
               {"path": _STR, "old_text": _STR, "new_text": _STR}, ["path", "old_text", "new_text"])),
    ("Show the git diff of src/cache.py against the main branch.",
     _function("git_diff", "Show the differences of the working tree against a revision.",
               {"revision": _STR, "paths": {"type": "array", "items": _STR}}, ["revision"])),
)


def tool_requests() -> list[tuple[str, str, dict]]:
    """(id, user turn, tool) for each request."""
    return [(tool["function"]["name"], text, tool) for text, tool in REQUESTS]


def calls_valid(text: str, tools) -> bool:
    """At least one call, each finished, naming a tool and with arguments valid under its schema."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    _, calls = parse_tool_calls(text, HERMES, schemas)
    try:
        for call in calls:
            if not call.finished:
                return False
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return bool(calls)

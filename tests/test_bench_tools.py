"""The tool-call bench task: one request per tool schema, every answer read back as
calls and validated, our modes held by tools.py's grammar and llama-server by GBNF of
the same calls."""

import pytest

from specsample.bench.modes import OurMode, library_tools
from specsample.bench.runner import BenchConfig, PreparedPrompt, prompt_ids, run_bench
from specsample.bench.tasks import TASKS, load_task
from specsample.output.constraints import Constraint

from benchmarks.native import LlamaServerMode, call_grammar
from benchmarks.tasks import RESEARCH_TASKS  # noqa: F401 (registers the tools task)
from benchmarks.tool_task import calls_valid

from bench_helpers import FakeServer, PlainOnly
from toy import byte_backend, tool_backend

pytestmark = pytest.mark.pure


def test_each_request_carries_one_tool_whose_schema_compiles():
    prompts = load_task("tools")
    assert len(prompts) >= 12 and TASKS["tools"].held and TASKS["tools"].chat
    assert len({p.id for p in prompts}) == len(prompts) and all(len(p.tools) == 1 for p in prompts)
    for p in prompts:
        (tool,) = library_tools(p.tools)
        assert tool.name == p.id
        Constraint.json_schema(tool.parameters, strict=True)  # every keyword is enforced


def test_a_call_is_valid_only_when_it_names_the_tool_and_follows_its_schema():
    (tool,) = load_task("tools")[0].tools  # read_file: path required, lines >= 1
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
    assert calls_valid(call.format("read_file", '{"path": "a.py", "start_line": 2}'), [tool])
    assert not calls_valid("I would read the file.", [tool])
    assert not calls_valid(call.format("read_file", '{"start_line": 2}'), [tool])
    assert not calls_valid(call.format("read_file", '{"path": "a.py", "start_line": 0}'), [tool])
    assert not calls_valid(call.format("write_file", '{"path": "a.py"}'), [tool])
    assert not calls_valid('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.p', [tool])  # cut off
    # Cut off after its arguments closed: the call is whole, as the server reads it (tools.ToolParser.finish).
    assert calls_valid(call.format("read_file", '{"path": "a.py"}')[:-13], [tool])


def test_the_llama_server_grammar_is_gbnf_of_the_same_calls():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    tools = load_task("tools")[0].tools
    grammar = call_grammar(tools)
    assert grammar.startswith('root ::= "<tool_call>\\n" call-body "\\n</tool_call>"\n')
    assert "call-body ::=" in grammar and grammar.count("root ::=") == 1


def test_tool_runs_hold_every_answer_to_a_call_and_only_grammar_modes_run_them():
    target, draft = tool_backend(0), tool_backend(1, "draft")
    modes = [OurMode("ar", "ar", target), OurMode("spec-auto", "spec-auto", target, "auto", draft),
             LlamaServerMode("llamacpp-server", FakeServer()), PlainOnly()]
    prompts = {"tools": [PreparedPrompt(p, TASKS["tools"], prompt_ids(target, TASKS["tools"], p))
                         for p in load_task("tools", 2)]}
    records = run_bench(modes, prompts, BenchConfig(tasks=("tools",), settings=("greedy",), max_new_tokens=160))
    assert {r.mode for r in records} == {"ar", "spec-auto", "llamacpp-server"}
    ours = [r for r in records if r.mode != "llamacpp-server"]
    finished = [r for r in ours if r.stop_reason == "grammar"]
    assert finished and all(r.valid for r in finished) and all(r.stats["forced_tokens"] > 0 for r in ours)
    assert '"name": "read_file"' in target.tokenizer.decode(prompts["tools"][0].ids)  # the tool is in the prompt
    by_mode = {r.mode: r.token_ids for r in records if r.prompt_id == "read_file"}
    assert by_mode["ar"] == by_mode["spec-auto"]


def test_a_model_without_a_tool_format_cannot_run_the_task():
    target = byte_backend(0)
    (prompt,) = load_task("tools", 1)
    with pytest.raises(ValueError, match="tool-call format"):
        OurMode("ar", "ar", target).run(target.tokenizer.encode("q"), 8, None, 0, tools=prompt.tools)

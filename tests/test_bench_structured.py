"""The structured-output bench task: its prompts and schema, which modes run it, the
validity check on every answer, and the report's section."""

import json

import pytest

from specsample.bench.modes import SETTINGS, OurMode
from specsample.bench.report import write_report
from specsample.bench.runner import BenchConfig, PreparedPrompt, run_bench, total_steps
from specsample.bench.summary import TargetRun
from specsample.bench.tasks import TASKS, Prompt, Task, load_task

from benchmarks.native import LlamaServerMode, completion_request
from benchmarks.structured import SCHEMA, is_valid
from benchmarks.tasks import task_sections

from bench_helpers import FakeServer, PlainOnly
from toy import byte_backend

pytestmark = pytest.mark.pure

SMALL = {"type": "object", "properties": {"f": {"type": "string", "maxLength": 3}, "ok": {"type": "boolean"}},
         "required": ["f", "ok"], "additionalProperties": False}


def test_the_task_has_enough_deterministic_prompts_and_a_fixed_schema():
    first, second = load_task("structured"), load_task("structured")
    assert len(first) >= 8 and [p.id for p in first] == [p.id for p in second]
    assert all("JSON" in p.text and f"`{p.id}`" in p.text for p in first)
    task = TASKS["structured"]
    assert task.chat and task.schema is SCHEMA and set(SCHEMA["required"]) == set(SCHEMA["properties"])
    assert is_valid('{"name": "f", "summary": "s", "parameters": [{"name": "x", "optional": false}], '
                    '"returns": "r", "raises": []}', SCHEMA)
    assert not is_valid('{"name": "f"}', SCHEMA) and not is_valid('{"name": ', SCHEMA)


def test_structured_runs_hold_every_answer_to_the_schema_and_report_it(tmp_path):
    target, draft = byte_backend(0), byte_backend(1, "draft")
    server = FakeServer()
    modes = [OurMode("ar", "ar", target), OurMode("spec-k2", "spec", target, 2, draft),
             OurMode("spec-auto", "spec-auto", target, "auto", draft),
             LlamaServerMode("llamacpp-spec-k3", server, 3), PlainOnly()]
    task = Task("structured", chat=True, max_new_tokens=40, stop_strings=(), load=list, schema=SMALL,
                check=lambda text, prompt: is_valid(text, SMALL))
    prompts = {"structured": [PreparedPrompt(Prompt("structured", f"p{i}", "q"), task, target.tokenizer.encode(f"q{i}: "))
                              for i in range(2)]}
    config = BenchConfig(tasks=("humaneval",), settings=("greedy", "sample"), default_prompts=2)
    records = run_bench(modes, prompts, config)
    assert {r.mode for r in records} == {"ar", "spec-k2", "spec-auto", "llamacpp-spec-k3"}  # plain-only sits out
    assert len(records) == total_steps(modes, prompts, config) - len(modes) == 2 * 2 * 4
    assert all(r.valid for r in records)
    ours = [r for r in records if r.mode != "llamacpp-spec-k3"]
    assert all(r.stop_reason == "grammar" and r.stats["forced_tokens"] > 0 for r in ours)
    assert "json_schema" not in server.bodies[0] and server.bodies[-1]["json_schema"] == SMALL  # warm-up, then the task
    greedy = {r.mode: r.token_ids for r in records if r.setting == "greedy" and r.prompt_id == "p0"}
    assert greedy["ar"] == greedy["spec-k2"] == greedy["spec-auto"]

    write_report(tmp_path, [TargetRun("toy", records, task_sections(records))], command="specsample bench --test",
                 machine="toy")
    summary = (tmp_path / "summary.md").read_text()
    section = summary.split("## Structured output")[1].split("##")[0]
    rows = {row.split("|")[3].strip(): [c.strip() for c in row.split("|")[1:-1]]
            for row in section.splitlines() if row.startswith("| structured |")}
    assert rows["ar"][3] == "2/2" and rows["ar"][5].endswith("%") and rows["llamacpp-spec-k3"][5] == "–"
    from benchmarks.rounds import controller_table

    assert "forced" in controller_table(records)  # the research bench's table: grammar-forced tokens as a source
    assert json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])["valid"] is True


def test_the_peer_request_carries_the_schema():
    body = completion_request([1, 2], 64, SETTINGS["greedy"], 0, (), 3, json_schema=SCHEMA)
    assert body["json_schema"] == SCHEMA and body["speculative.n_max"] == 3
    assert "json_schema" not in completion_request([1, 2], 64, SETTINGS["greedy"], 0, (), 3)

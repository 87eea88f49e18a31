"""The fill-in-the-middle bench task: held-out function bodies of standard-library
modules, asked in the model's own FIM tokens; a model without them is refused."""

import inspect
import importlib

import pytest

from specsample.bench.modes import OurMode
from specsample.bench.runner import BenchConfig, PreparedPrompt, prompt_ids, run_bench
from specsample.bench.tasks import TASKS, Prompt, load_task
from specsample.output.fim import fim_prompt

from benchmarks.fim_task import fim_cases, similarity
from benchmarks.tasks import RESEARCH_TASKS  # noqa: F401 (registers the fim task)

from test_serve_fim import fim_pair
from toy import byte_backend

pytestmark = pytest.mark.pure


def test_each_case_is_a_body_cut_from_its_module_between_its_prefix_and_suffix():
    cases = fim_cases()
    assert len(cases) >= 12 and [c[0] for c in cases] == [c[0] for c in fim_cases()]
    for name, prefix, suffix, body in cases:
        source = inspect.getsource(importlib.import_module(name.split(".")[0]))
        assert prefix + body + suffix in source and body.strip() and prefix.rstrip().endswith((":", '"""', "'''"))
    assert similarity(cases[0][3], cases[0][3]) == 1.0 and similarity("pass", cases[0][3]) < 0.5


def test_the_prompt_is_the_models_own_fim_prompt_and_runs_in_our_modes():
    target, draft = fim_pair()
    task = TASKS["fim"]
    prompts = load_task("fim", 2)
    ids = prompt_ids(target, task, prompts[0])
    assert ids == fim_prompt(target.fim, target.tokenizer.text_ids, prompts[0].text, prompts[0].suffix)
    short = [Prompt("fim", f"p{i}", p.text[-60:], suffix=p.suffix[:40]) for i, p in enumerate(prompts)]  # tiny context
    prepared = {"fim": [PreparedPrompt(p, task, prompt_ids(target, task, p)) for p in short]}
    modes = [OurMode("ar", "ar", target), OurMode("spec-auto", "spec-auto", target, "auto", draft)]
    records = run_bench(modes, prepared, BenchConfig(tasks=("fim",), settings=("greedy",), max_new_tokens=8))
    greedy = {(r.mode, r.prompt_id): r.token_ids for r in records}
    assert all(greedy["ar", p.id] == greedy["spec-auto", p.id] for p in short)


def test_a_model_without_fim_tokens_cannot_run_the_task():
    with pytest.raises(ValueError, match="fill-in-the-middle tokens"):
        prompt_ids(byte_backend(0), TASKS["fim"], load_task("fim", 1)[0])


def test_the_report_scores_each_middle_against_the_body_it_stands_in_for():
    from specsample.bench.records import Record
    from benchmarks.tasks import fim_table

    def record(mode, prompt_id, text, stop):
        return Record(phase="main", task="fim", setting="greedy", prompt_id=prompt_id, prompt_index=0, prompt_tokens=9,
                      mode=mode, family=mode, k=None, seed=0, max_new_tokens=8, latency_seconds=1.0,
                      stop_reason=stop, stats={}, token_ids=[], text=text)

    bodies = {"m.f": "    return x + 1\n", "m.g": "    y = 2\n    return y\n"}
    rows = fim_table([record("ar", "m.f", "    return x + 1", "eos"), record("ar", "m.g", "pass", "length"),
                      record("spec-auto", "m.f", "return x", "eos")], bodies).splitlines()
    assert rows[2].split("|")[1:-1] == [" greedy ", " ar ", " 2 ", " 1/2 ", " 1/2 ",
                                        f" {(1 + similarity('pass', bodies['m.g'])) / 2:.2f} "]
    assert rows[3].split("|")[3:6] == [" 1 ", " 1/1 ", " 0/1 "]
    assert fim_table([record("ar", "other", "x", "eos")], bodies) is None

import time

import pytest

from benchmarks.parity import build_program, extract_code, pass_rates, run_program
from specsample.bench.tasks import load_task

from bench_helpers import record

pytestmark = pytest.mark.system

PROBLEM = load_task("humaneval", 1)[0].problem  # has_close_elements
GOOD_BODY = PROBLEM["canonical_solution"]
GOOD_CHAT = f"""Here you go:

```python
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
{GOOD_BODY}```

It compares every pair."""


def test_extract_code_prefers_the_block_with_the_entry_point():
    answer = "```python\nimport math\n```\nthen\n```python\ndef has_close_elements(a, b):\n    return 1\n```"
    assert extract_code(answer, "has_close_elements").startswith("def has_close_elements")
    assert extract_code("no fences here", "f") == "no fences here"
    assert extract_code("```python\ndef f():\n    return 1", "f") == "def f():\n    return 1"  # cut off


def test_chat_answer_passes():
    result = run_program(build_program(PROBLEM, GOOD_CHAT))
    assert result.passed, result.outcome


def test_bare_body_is_appended_to_the_prompt_and_cut_at_the_next_top_level_line():
    result = run_program(build_program(PROBLEM, GOOD_BODY + "\n\nprint(has_close_elements([1.0], 0.5))\nraise SystemExit(3)\n"))
    assert result.passed, result.outcome


def test_wrong_answer_fails():
    result = run_program(build_program(PROBLEM, "    return False\n"))
    assert not result.passed and result.outcome.startswith("failed")


def test_infinite_loop_times_out_in_the_subprocess():
    t0 = time.perf_counter()
    result = run_program(build_program(PROBLEM, "    while True:\n        pass\n"), timeout=1.5)
    assert not result.passed and result.outcome == "timed out"
    assert time.perf_counter() - t0 < 10


def test_candidate_cannot_touch_the_harness_process(tmp_path):
    # It runs in another process: exiting or killing "itself" leaves us alive.
    result = run_program("import os, sys\nsys.exit(1)\n")
    assert not result.passed


def test_pass_rates():
    records = [record(mode="ar", passed=True), record(mode="ar", passed=False), record(mode="spec-k3", passed=True),
               record(mode="spec-k3")]  # a main-phase record: no execution outcome, not counted
    rates = {r.mode: r for r in pass_rates(records)}
    assert (rates["ar"].passed, rates["ar"].total) == (1, 2) and rates["spec-k3"].rate == 1.0
    assert rates["spec-k3"].total == 1


def test_the_harness_says_what_it_is_not(tmp_path):
    """A candidate runs with the user's rights: it can write outside its folder. So
    nothing may call the harness a sandbox, and its docstring must say what it is."""
    from pathlib import Path

    import benchmarks
    from benchmarks import parity

    marker = tmp_path / "written-by-the-candidate"
    assert run_program(f"open({str(marker)!r}, 'w').write('x')\n").passed and marker.exists()
    doc = Path(benchmarks.__file__).parents[1] / "docs" / "benchmarks.md"
    texts = [parity.__doc__, run_program.__doc__, benchmarks.__doc__, parity.run_parity.__doc__]
    texts += [doc.read_text()] if doc.exists() else []
    for text in texts:
        assert "sandboxed" not in text and "isolated" not in text
    assert "not a sandbox" in parity.__doc__ and "network" in parity.__doc__

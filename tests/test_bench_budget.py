import pytest

from benchmarks.budget import TaskLoad, estimate_seconds, format_duration, trim_to_budget

pytestmark = pytest.mark.pure

CELLS = {"humaneval": TaskLoad(prompts=8, runs=6, new_tokens=384, prompt_tokens=150),
         "copy": TaskLoad(prompts=4, runs=6, new_tokens=384, prompt_tokens=250)}


def test_estimate_prices_every_generation_at_the_token_limit():
    # 6 runs x (384 tokens x 0.1 s + 150 prompt tokens x 0.01 s) per humaneval prompt.
    per_humaneval = 6 * (38.4 + 1.5)
    per_copy = 6 * (38.4 + 2.5)
    assert estimate_seconds(CELLS, 0.1, 0.01) == pytest.approx(8 * per_humaneval + 4 * per_copy)


def test_budget_that_fits_keeps_every_prompt():
    assert trim_to_budget(CELLS, 0.1, 0.01, budget_seconds=1e9) == {"humaneval": 8, "copy": 4}


def test_budget_trims_prompts_evenly_and_fits():
    total = estimate_seconds(CELLS, 0.1, 0.01)
    kept = trim_to_budget(CELLS, 0.1, 0.01, budget_seconds=total / 2)
    assert kept == {"humaneval": 4, "copy": 2}
    trimmed = {t: TaskLoad(kept[t], c.runs, c.new_tokens, c.prompt_tokens) for t, c in CELLS.items()}
    assert estimate_seconds(trimmed, 0.1, 0.01) <= total / 2


def test_budget_never_drops_a_task():
    assert trim_to_budget(CELLS, 0.1, 0.01, budget_seconds=1.0) == {"humaneval": 1, "copy": 1}


def test_format_duration():
    assert format_duration(600) == "10 min" and format_duration(3 * 3600) == "3.0 h"

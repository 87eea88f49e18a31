"""How long a run will take, before it starts, and trimming it to a budget.

The estimate prices every generation at the autoregressive rate measured on the
target (one 1-token call per token, plus the prompt prefill) and assumes every
answer runs to its task's token limit. Speculative modes on a CPU decode at about
that rate, and most answers stop earlier, so it is a ceiling more than a forecast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskLoad:
    """One task's generations: `prompts` prompts, each run `runs` times (modes x settings)."""

    prompts: int
    runs: int
    new_tokens: int
    prompt_tokens: float  # mean prompt length


def estimate_seconds(cells: dict[str, TaskLoad], token_seconds: float, prefill_token_seconds: float) -> float:
    return sum(_per_prompt(c, token_seconds, prefill_token_seconds) * c.prompts for c in cells.values())


def trim_to_budget(cells: dict[str, TaskLoad], token_seconds: float, prefill_token_seconds: float,
                   budget_seconds: float) -> dict[str, int]:
    """Prompts per cell that fit the budget: every count scaled by the same factor,
    never below one prompt. Tokens per answer are never cut: shortening answers
    would change what is measured, fewer prompts only widens the intervals.

    {"humaneval": 8 prompts, "copy": 4}, a half-size budget -> {"humaneval": 4, "copy": 2}."""
    total = estimate_seconds(cells, token_seconds, prefill_token_seconds)
    if total <= budget_seconds:
        return {name: c.prompts for name, c in cells.items()}
    scale = budget_seconds / total
    return {name: max(1, math.floor(c.prompts * scale)) for name, c in cells.items()}


def _per_prompt(cell: TaskLoad, token_seconds: float, prefill_token_seconds: float) -> float:
    return cell.runs * (cell.new_tokens * token_seconds + cell.prompt_tokens * prefill_token_seconds)


def format_duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"

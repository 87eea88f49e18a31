"""Interleaved benchmark runs: one record per prompt x mode x setting x task.

For every prompt all modes run back to back, in an order rotated by one each
prompt, so machine drift (thermal state, a neighbour's load) hits every mode alike.
Each mode first runs one short warm-up generation that is not recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .modes import SETTINGS
from .parity import build_program, run_program
from .tasks import Prompt, load_task


@dataclass
class BenchConfig:
    tasks: tuple[str, ...] = ("humaneval", "prose", "copy")
    settings: tuple[str, ...] = ("greedy", "sample")
    prompts: int = 1  # per task
    max_new_tokens: int = 64
    chat: bool = True
    seed: int = 0  # prompt i uses seed + i in every mode
    warmup_tokens: int = 8
    parity_prompts: int = 0  # HumanEval problems for the pass@1 check; 0 skips it
    parity_max_new_tokens: int = 192
    parity_setting: str = "sample"
    parity_timeout: float = 10.0

    def __post_init__(self) -> None:
        for setting in self.settings + (self.parity_setting,):
            if setting not in SETTINGS:
                raise ValueError(f"unknown setting {setting!r}; choose from {', '.join(SETTINGS)}")
        if self.prompts < 1 or self.max_new_tokens < 1:
            raise ValueError("--prompts and --max-new-tokens must be >= 1")


@dataclass
class PreparedPrompt:
    prompt: Prompt
    ids: list[int]


def prepare(target, tasks: tuple[str, ...], n: int, chat: bool) -> dict[str, list[PreparedPrompt]]:
    """Token ids of the first n prompts of each task, chat-templated or plain."""
    out = {}
    for task in tasks:
        prompts = load_task(task, n)
        tok = target.tokenizer
        out[task] = [PreparedPrompt(p, tok.chat_prompt(p.text(chat)) if chat else tok.encode(p.text(chat))) for p in prompts]
    return out


def run_bench(modes, prompts: dict[str, list[PreparedPrompt]], config: BenchConfig, progress=None) -> list[dict]:
    """Warm up every mode, then run them all on every prompt, task and setting."""
    # A short prompt: the warm-up is for first-call costs, not for a long prefill.
    warmup_ids = next(iter(prompts.values()))[0].ids[:32]
    for mode in modes:
        mode.run(warmup_ids, config.warmup_tokens, SETTINGS["greedy"], config.seed)
        _tick(progress, f"warm-up {mode.name}")
    records, turn = [], 0
    for task, task_prompts in prompts.items():
        for setting in config.settings:
            for i, prepared in enumerate(task_prompts):
                for mode in _rotated(modes, turn):
                    records.append(_run_one(mode, prepared, task, setting, i, config.max_new_tokens, config.seed + i))
                    _tick(progress, f"{task} {setting} {mode.name}")
                turn += 1
    return records


def run_parity(modes, prompts: list[PreparedPrompt], config: BenchConfig, progress=None) -> list[dict]:
    """Sample HumanEval answers with every given mode and execute them (sandboxed)."""
    records = []
    for i, prepared in enumerate(prompts):
        for mode in _rotated(modes, i):
            record = _run_one(mode, prepared, "humaneval", config.parity_setting, i,
                              config.parity_max_new_tokens, config.seed + i, phase="parity")
            program = build_program(prepared.prompt.problem, record["text"])
            execution = run_program(program, timeout=config.parity_timeout)
            record.update(passed=execution.passed, outcome=execution.outcome)
            records.append(record)
            _tick(progress, f"parity {mode.name}")
    return records


def _run_one(mode, prepared: PreparedPrompt, task: str, setting: str, index: int, max_new_tokens: int,
             seed: int, phase: str = "main") -> dict:
    t0 = time.perf_counter()
    outcome = mode.run(prepared.ids, max_new_tokens, SETTINGS[setting], seed)
    latency = time.perf_counter() - t0
    return {
        "phase": phase, "task": task, "setting": setting, "prompt_id": prepared.prompt.id, "prompt_index": index,
        "prompt_tokens": len(prepared.ids), "mode": mode.name, "family": mode.family, "k": mode.k, "seed": seed,
        "max_new_tokens": max_new_tokens, "latency_seconds": latency, "stop_reason": outcome.stop_reason,
        "stats": outcome.stats, "token_ids": outcome.token_ids, "text": outcome.text,
    }


def _rotated(modes: list, turn: int) -> list:
    r = turn % len(modes)
    return modes[r:] + modes[:r]


def _tick(progress, label: str) -> None:
    if progress is not None:
        progress.set_postfix_str(label, refresh=False)
        progress.update(1)


def total_steps(modes, prompts, config: BenchConfig, parity_modes: int = 0, parity_prompts: int = 0) -> int:
    generations = sum(len(p) for p in prompts.values()) * len(config.settings) * len(modes)
    return len(modes) + generations + parity_modes * parity_prompts

"""Interleaved benchmark runs: one record per prompt x mode x setting x task.

For every prompt all modes run back to back, in an order rotated by one each
prompt, so machine drift (thermal state, a neighbour's load) hits every mode alike.
Each mode first runs one short warm-up generation that is not recorded. A task with a
JSON schema or tools runs only the modes that can hold an answer to a grammar, and
every answer is checked against it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..output.fim import fim_prompt
from .load import rotation
from .modes import SETTINGS
from .records import Record
from .tasks import TASKS, Prompt, Task, load_task


@dataclass
class BenchConfig:
    tasks: tuple[str, ...] = ("humaneval", "summarize", "copy")
    settings: tuple[str, ...] = ("greedy", "sample")
    prompts: dict[str, int] = field(default_factory=dict)  # per task; a task not named gets default_prompts
    default_prompts: int = 8
    max_new_tokens: int | None = None  # None: each task's own limit (an override for quick smoke runs)
    seed: int = 0  # prompt i uses seed + i in every mode
    warmup_tokens: int = 8

    def prompt_count(self, task: str) -> int:
        return self.prompts.get(task, self.default_prompts)

    def new_tokens(self, task: str) -> int:
        return self.max_new_tokens or TASKS[task].max_new_tokens


@dataclass
class PreparedPrompt:
    prompt: Prompt
    task: Task
    ids: list[int]


def prepare(target, tasks: tuple[str, ...], counts: dict[str, int]) -> dict[str, list[PreparedPrompt]]:
    """Token ids of the first counts[task] prompts of each task, asked as the task asks."""
    out = {}
    for name in tasks:
        task = TASKS[name]
        out[name] = [PreparedPrompt(p, task, prompt_ids(target, task, p)) for p in load_task(name, counts[name])]
    return out


def prompt_ids(target, task: Task, prompt: Prompt) -> list[int]:
    """A prompt's ids as its task asks it: in the chat template (with its tools), as a
    fill-in-the-middle prompt in the model's FIM tokens, or as plain text."""
    tokenizer = target.tokenizer
    if prompt.messages is not None:
        return tokenizer.chat_messages([dict(m) for m in prompt.messages], list(prompt.tools) or None)
    if prompt.tools:
        return tokenizer.chat_messages([{"role": "user", "content": prompt.text}], list(prompt.tools))
    if prompt.suffix is not None:
        if target.fim is None:
            raise ValueError(f"the {task.name} task needs a model with fill-in-the-middle tokens; {target.name} has none")
        return fim_prompt(target.fim, tokenizer.text_ids, prompt.text, prompt.suffix)
    return tokenizer.chat_prompt(prompt.text) if task.chat else tokenizer.encode(prompt.text)


def run_bench(modes, prompts: dict[str, list[PreparedPrompt]], config: BenchConfig, progress=None,
              keep=lambda records: None) -> list[Record]:
    """Warm up every mode, then run them all on every prompt, task and setting; `keep`
    sees each record as soon as it is made (a list of one, as --serve's loads give
    theirs)."""
    # A short prompt: the warm-up is for first-call costs, not for a long prefill.
    warmup_ids = next(iter(prompts.values()))[0].ids[:32]
    for mode in modes:
        mode.run(warmup_ids, config.warmup_tokens, SETTINGS["greedy"], config.seed)
        tick(progress, f"warm-up {mode.name}")
    records, turn = [], 0
    for task, task_prompts in prompts.items():
        for setting in config.settings:
            for i, prepared in enumerate(task_prompts):
                for mode in rotation(runs_task(modes, prepared.task), turn):
                    records.append(run_one(mode, prepared, setting, i, config.new_tokens(task), config.seed + i))
                    keep(records[-1:])
                    tick(progress, f"{task} {setting} {mode.name}")
                turn += 1
    return records


def runs_task(modes: list, task: Task) -> list:
    """The modes that can run a task: all, unless a grammar holds its answers."""
    return [m for m in modes if not task.held or getattr(m, "structured", False)]


def run_one(mode, prepared: PreparedPrompt, setting: str, index: int, max_new_tokens: int,
             seed: int, phase: str = "main") -> Record:
    task, schema, tools = prepared.task, prepared.task.schema, prepared.prompt.tools
    held = {"schema": schema} if schema is not None else {"tools": tools} if tools else {}
    t0 = time.perf_counter()
    outcome = mode.run(prepared.ids, max_new_tokens, SETTINGS[setting], seed, prepared.task.stop_strings, **held)
    latency = time.perf_counter() - t0
    return Record(phase=phase, task=prepared.task.name, setting=setting, prompt_id=prepared.prompt.id,
                  prompt_index=index, prompt_tokens=len(prepared.ids), mode=mode.name, family=mode.family, k=mode.k,
                  seed=seed, max_new_tokens=max_new_tokens, latency_seconds=latency, stop_reason=outcome.stop_reason,
                  stats=outcome.stats, token_ids=outcome.token_ids, text=outcome.text,
                  valid=task.check(outcome.text, prepared.prompt) if task.check else None, kind=prepared.prompt.kind)


def tick(progress, label: str) -> None:
    if progress is not None:
        progress.set_postfix_str(label, refresh=False)
        progress.update(1)


def total_steps(modes, prompts, config: BenchConfig) -> int:
    generations = sum(len(p) * len(runs_task(modes, p[0].task)) for p in prompts.values() if p) * len(config.settings)
    return len(modes) + generations

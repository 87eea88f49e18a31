"""The research bench's tasks, registered beside the bench's own (specsample.bench.tasks.TASKS)
when this module is imported (benchmarks/bench.py does), and the sections of summary.md
that read their answers.

humaneval-chat  the HumanEval problems in the chat template, answered to EOS: the instruct
                models restate the prompt before answering, so this is partly an echo
summarize       one-sentence summaries of long standard-library module docstrings
copy            rewrite a HumanEval canonical solution with descriptive names: the
                answer repeats much of the prompt, the case prompt lookup is built for
structured      fields of standard-library function docs as JSON under a fixed schema
                (structured.py): constrained output, where much of the text is forced
tools           requests a coding agent makes, each with the one tool it needs
                (tool_task.py): the answer is a call held to the tool's schema
fim             a function body held out of a standard-library module, asked for
                between its prefix and suffix in the model's FIM tokens (fim_task.py)
"""

from __future__ import annotations

from specsample.bench.records import Record
from specsample.bench.tables import cell, markdown_table
from specsample.bench.tasks import TASKS, Prompt, Task, fenced, humaneval_problems, stdlib_docstrings

from . import fim_task, structured, tool_task
from .fim_task import held_out_bodies, similarity

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with only the code, in one ```python block.\n\n"
SUMMARIZE_INSTRUCTION = "Summarise the following documentation in one sentence.\n\n"
COPY_INSTRUCTION = "Rewrite this function with descriptive variable names. Reply with only the code.\n\n"

# Docstrings between these lengths (characters, ~200-400 tokens): long enough to
# summarise, short enough that the prompt prefill does not dominate the timing.
SUMMARY_MIN_CHARS, SUMMARY_MAX_CHARS = 800, 1600


def humaneval_chat_prompts() -> list[Prompt]:
    return [Prompt("humaneval-chat", p["task_id"], HUMANEVAL_INSTRUCTION + fenced(p["prompt"]), p)
            for p in humaneval_problems()]


def copy_prompts() -> list[Prompt]:
    return [Prompt("copy", p["task_id"], COPY_INSTRUCTION + fenced(p["prompt"] + p["canonical_solution"]), p)
            for p in humaneval_problems()]



def structured_prompts() -> list[Prompt]:
    return [Prompt("structured", name, structured.prompt_text(name, doc)) for name, doc in structured.structured_docs()]


def tool_prompts() -> list[Prompt]:
    return [Prompt("tools", name, text, tools=(tool,)) for name, text, tool in tool_task.tool_requests()]


def fim_prompts() -> list[Prompt]:
    return [Prompt("fim", name, prefix, {"body": body}, suffix=suffix)
            for name, prefix, suffix, body in fim_task.fim_cases()]



def summarize_prompts() -> list[Prompt]:
    chosen = [(name, doc) for name, doc in stdlib_docstrings() if SUMMARY_MIN_CHARS <= len(doc) <= SUMMARY_MAX_CHARS]
    # Longest first, name as the tie-break: the same order on every run of a Python version.
    chosen.sort(key=lambda item: (-len(item[1]), item[0]))
    return [Prompt("summarize", name, SUMMARIZE_INSTRUCTION + doc) for name, doc in chosen]


RESEARCH_TASKS = (
    Task("humaneval-chat", chat=True, max_new_tokens=512, stop_strings=(), load=humaneval_chat_prompts),
    # One sentence is asked for; a blank line means the model has moved on to a
    # second paragraph, which is no longer the answer.
    Task("summarize", chat=True, max_new_tokens=128, stop_strings=("\n\n",), load=summarize_prompts),
    Task("copy", chat=True, max_new_tokens=384, stop_strings=(), load=copy_prompts),
    Task("structured", chat=True, max_new_tokens=512, stop_strings=(), load=structured_prompts,
         schema=structured.SCHEMA, check=lambda text, prompt: structured.is_valid(text, structured.SCHEMA)),
    Task("tools", chat=True, max_new_tokens=192, stop_strings=(), load=tool_prompts, calls=True,
         check=lambda text, prompt: tool_task.calls_valid(text, prompt.tools)),
    # The model ends a middle with its end-of-text token; 256 tokens hold every body.
    Task("fim", chat=False, max_new_tokens=256, stop_strings=(), load=fim_prompts),
)
TASKS.update((t.name, t) for t in RESEARCH_TASKS)


def task_sections(main: list[Record]) -> list[str]:
    """summary.md's sections on the answers of the held and fim tasks, where there are any."""
    parts = []
    held = structured_table(main)
    if held:
        parts += ["## Structured output", STRUCTURED_NOTE, held]
    middles = fim_table(main, held_out_bodies()) if any(r.task == "fim" for r in main) else None
    if middles:
        parts += ["## Fill-in-the-middle", FIM_NOTE, middles]
    return parts


def structured_table(records: list[Record]) -> str | None:
    """Per task with a schema, setting and mode: answers valid under the schema, the
    share of tokens the grammar forced, and the time spent in the grammar engine."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if r.valid is not None:
            groups.setdefault((r.task, r.setting, r.mode), []).append(r)
    if not groups:
        return None
    rows = [["task", "setting", "mode", "valid answers", "ended by the grammar", "forced tokens",
             "grammar ms/token", "grammar share of time"]]
    for (task, setting, mode), group in groups.items():
        stats = [r.stats for r in group]
        tokens = sum(st.get("new_tokens", 0) for st in stats)
        ours = all("forced_tokens" in st for st in stats)  # peers report neither
        forced = sum(st["forced_tokens"] for st in stats) if ours else None
        grammar = sum(st["constraint_seconds"] for st in stats) if ours else None
        total = sum(st.get("total_seconds", 0.0) for st in stats)
        rows.append([task, setting, mode, f"{sum(r.valid for r in group)}/{len(group)}",
                     f"{sum(r.stop_reason in ('grammar', 'eos') for r in group)}/{len(group)}",
                     cell(forced / tokens if ours and tokens else None, ".0%"),
                     cell(1000 * grammar / tokens if ours and tokens else None, ".2f"),
                     cell(grammar / total if ours and total else None, ".1%")])
    return markdown_table(rows)


def fim_table(records: list[Record], bodies: dict[str, str]) -> str | None:
    """Per setting and mode of the fim task: middles that ended at the model's end of
    text, middles equal to the held-out body, and how much of it they repeat."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if r.task == "fim" and r.prompt_id in bodies:
            groups.setdefault((r.setting, r.mode), []).append(r)
    if not groups:
        return None
    rows = [["setting", "mode", "seqs", "ended by end of text", "equal to the held-out body", "mean similarity"]]
    for (setting, mode), group in groups.items():
        scores = [similarity(r.text, bodies[r.prompt_id]) for r in group]
        rows.append([setting, mode, str(len(group)), f"{sum(r.stop_reason == 'eos' for r in group)}/{len(group)}",
                     f"{sum(r.text.strip() == bodies[r.prompt_id].strip() for r in group)}/{len(group)}",
                     f"{sum(scores) / len(scores):.2f}"])
    return markdown_table(rows)


FIM_NOTE = (
    "Each middle against the function body it stands in for (benchmarks/fim_task.py): equal after surrounding whitespace, "
    "and difflib's similarity ratio, 0 to 1, averaged over the row's sequences. Speed is what the task measures; this "
    "says the middles are real code, and llama-server's beside ours says the two read the same FIM prompt.")

STRUCTURED_NOTE = (
    "Every answer is parsed and validated against the task's JSON schema (tools: read back as calls, valid when it "
    "holds one or more and each call's arguments follow its tool's schema). Forced tokens: the share of new tokens the "
    "grammar allowed alone (braces, quotes, keys, separators); with a drafter they are drafted free and accepted "
    "with probability 1, in plain decoding each still costs a target call. Grammar time: masks, forced tokens and "
    "state moves in the grammar engine (llguidance), per new token and as a share of the mode's wall time. Peers "
    "report neither (llama-server applies the same schema through its own grammar sampler).")

"""`specsample bench`: speculative decoding timed on the user's models, hardware and
prompts, against plain decoding; `bench serve --url`: any OpenAI-compatible endpoints
(llama-server, vLLM, ours) under load. Research measurements (llama-server and other
peers run here, the demo, parity, cost curves, relays, studies) live in benchmarks/ at
the repository root, which imports this package; the names below are what its studies
may use without reaching into the modules (tests/test_imports.py holds them to it).

cli.py        the `bench` subcommand: its parser, and the run its options ask for
options.py    its options, and what they name: the target's type, draft lengths, the
              report's command and machine lines
sequence_run.py  the per-sequence run: every mode, on each target type a research run names
serve_run.py  bench serve --url: each endpoint in turn under concurrent clients
tasks.py      tasks: prompts, chat or raw, token limit and stop strings each; chat_task.py:
              general chat; prompts_file.py: --prompts-file, the user's own prompts as a
              task (benchmarks/tasks.py registers the research tasks)
modes.py      what is timed: our loops, behind the interface the research peers share
runner.py     interleaved runs -> one Record per prompt x mode x setting x task
records.py    Record: one timed generation, a line of records.jsonl; ServedRecord: one
              request of a --serve load, a line of serve.jsonl
stats.py      percentiles and per-mode aggregates
tables.py     the reports' tables and notes, as markdown
summary.py    summary.md's sections for one target type
report.py     the one writer of the output folder: records and markdown
load.py       a serving load: its clients, rounds and figures; serve_summary.py: serve.md's
              tables; endpoints.py: the loads sent to endpoints the user runs
"""

import importlib

# name -> the module that defines it: imported when first asked for, so that
# `import specsample.bench` stays light.
PUBLIC = {"markdown_table": "tables", "machine_description": "tables", "read_records": "records", "humaneval_problems": "tasks",
          "BENCH_CONTEXT": "options", "threads": "options"}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)

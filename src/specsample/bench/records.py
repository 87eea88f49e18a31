"""The benchmark's record: one timed generation, as runner.py makes it and records.jsonl
holds it (one JSON object a line). Every reader of a run's results reads these."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(kw_only=True)
class Record:
    """One timed generation: a prompt x mode x setting x task, or a parity sample.
    records.jsonl holds one per line, keys in field order; the optional fields at the
    end are left out where None, as the files committed under docs/results/ have them."""

    phase: str  # "main", or "parity" for the pass@1 samples
    task: str
    setting: str  # a key of modes.SETTINGS
    prompt_id: str
    prompt_index: int
    prompt_tokens: int
    mode: str
    family: str
    k: int | str | None  # the draft length, "auto", or None for modes that draft nothing
    seed: int
    max_new_tokens: int
    latency_seconds: float
    stop_reason: str
    stats: dict  # GenerationStats.as_dict() keys; peers fill what they can
    token_ids: list[int]
    text: str
    valid: bool | None = None  # tasks with a schema: the answer holds to it
    passed: bool | None = None  # parity: the completion passed its tests
    outcome: str | None = None  # parity: how the program ended (parity.Execution.outcome)
    target: str | None = None  # the target type, in a run over several (--target-quants)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _OPTIONAL or getattr(self, f.name) is not None}

    @classmethod
    def from_json(cls, row: dict) -> Record:
        return cls(**row)


_OPTIONAL = ("valid", "passed", "outcome", "target")


def read_records(path: Path) -> list[Record]:
    """A records.jsonl file, as any run of `specsample bench` wrote it."""
    return [Record.from_json(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]

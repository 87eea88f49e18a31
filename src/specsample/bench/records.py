"""The benchmark's records, one JSON object a line: Record, one timed generation, as
runner.py makes it and records.jsonl holds it; ServedRecord, one request of a
`bench --serve` load and what its client saw (RequestTiming), as serve.jsonl holds it.
Every reader of a run's results reads these."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
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
    kind: str | None = None  # the prompt's kind, where its task has kinds (chat, --prompts-file)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _OPTIONAL or getattr(self, f.name) is not None}

    @classmethod
    def from_json(cls, row: dict) -> Record:
        return cls(**row)


_OPTIONAL = ("valid", "passed", "outcome", "target", "kind")


def read_records(path: Path) -> list[Record]:
    """A records.jsonl file, as any run of `specsample bench` wrote it."""
    return [Record.from_json(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


@dataclass
class RequestTiming:
    """What the client saw of one streamed request, in seconds on its own clock."""

    index: int
    sent: float  # since the load started
    first_text: float | None  # after `sent`
    finished: float  # after `sent`: the last text, or the error
    completion_tokens: int
    chunk_gaps: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    drafted: int = 0
    accepted: int = 0
    error: str | None = None
    status: int | None = None  # the HTTP status the server answered instead of a completion

    @property
    def outcome(self) -> str:
        """answered (a whole answer), refused (an HTTP status instead: 429 when a queue is
        full and 503 when a request waited too long are how a loaded server says no; any
        other status is counted here too, and shown), or lost (neither: the connection
        dropped, the stream stopped short of its end, or the client gave up)."""
        if self.error is None:
            return "answered"
        return "refused" if self.status is not None else "lost"

    @property
    def tpot(self) -> float | None:
        if self.first_text is None or self.completion_tokens < 2:
            return None
        return (self.finished - self.first_text) / (self.completion_tokens - 1)

    @property
    def decoding(self) -> tuple[float, float] | None:
        """When this answer streamed, from its first text to its last, in load time; None
        for a request that was not answered or streamed nothing."""
        if self.error is not None or self.first_text is None:
            return None
        return self.sent + self.first_text, self.sent + self.finished


@dataclass(kw_only=True)
class ServedRecord:
    """One request of a `bench serve` load: which server with how many slots, target
    type, task, setting and prompt, how many clients were sending, and what its client
    saw. serve.jsonl holds one per line, keys in field order, the timing's after the
    others; target, slots, repeat and status are left out where None, as runs made
    before they existed have them (their servers had one slot each, their loads ran
    once); an endpoint of `bench serve --url` has no slot count either."""

    mode: str
    family: str
    k: int | str | None
    target: str | None = None  # the target type (q4_k_m, bf16)
    task: str
    setting: str
    prompt_id: str
    clients: int
    slots: int | None = None  # requests the server decodes at once (--parallel, llama-server -np)
    wall_seconds: float  # of the whole load this request was part of
    timing: RequestTiming
    repeat: int | None = None  # which of the load's --repeats, from 0

    @property
    def slot_count(self) -> int:
        return 1 if self.slots is None else self.slots

    def to_json(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "timing" and (f.name not in _SERVED_OPTIONAL or getattr(self, f.name) is not None)}
        timing = {name: value for name, value in vars(self.timing).items() if name != "status" or value is not None}
        return {**row, **timing}

    @classmethod
    def from_json(cls, row: dict) -> ServedRecord:
        timing = {name: value for name, value in row.items() if name in RequestTiming.__dataclass_fields__}
        rest = {name: value for name, value in row.items() if name not in timing}
        return cls(**rest, timing=RequestTiming(**timing))


_SERVED_OPTIONAL = ("target", "slots", "repeat")

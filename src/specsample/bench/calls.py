"""Where one load's time went in our server: its /metrics read before and after the
load (serve/metrics.py), as model calls by model and by the requests each call served,
and the worker's busy time. What is left of the busy time after the calls is the
sequences' own work between calls (sampling, verifying, detokenizing, stop strings,
the policy), which runs on the worker's one thread, one sequence after another; what
is left of the wall time after that is the worker waiting for requests (HTTP, queue
hand-over, clients between requests).

llama-server reports nothing comparable for a batched call, so the split is ours
alone; it is what a note needs to say where a target was missed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .tables import markdown_table

_SAMPLE = re.compile(r'^specsample_model_call(s|_tokens|_seconds)_total\{model="(\w+)",sequences="(\d+)"\} (\S+)$')
_BUSY = "specsample_worker_busy_seconds "


def scrape(text: str) -> tuple[dict[tuple[str, int], list[float]], float]:
    """({(model, requests served): [calls, tokens, seconds]}, worker busy seconds) from
    a /metrics page."""
    calls: dict[tuple[str, int], list[float]] = {}
    busy = 0.0
    for line in text.splitlines():
        if line.startswith(_BUSY):
            busy = float(line.split()[-1])
        elif (m := _SAMPLE.match(line)) is not None:
            kind, model, sequences, value = m.groups()
            row = calls.setdefault((model, int(sequences)), [0.0, 0.0, 0.0])
            row[{"s": 0, "_tokens": 1, "_seconds": 2}[kind]] = float(value)
    return calls, busy


@dataclass(kw_only=True)
class CallSplit:
    """One load of one of our servers: its model calls and the worker's busy time."""

    mode: str
    target: str | None = None
    task: str
    setting: str
    slots: int
    clients: int
    wall_seconds: float  # the load's, on the client's clock
    busy_seconds: float  # the worker's, during the load
    # model ("target", "draft") -> requests served by a call -> [calls, tokens, seconds]
    calls: dict[str, dict[int, list[float]]] = field(default_factory=dict)

    @classmethod
    def between(cls, before: str, after: str, **load) -> CallSplit:
        """The split of a load from the /metrics pages read before and after it."""
        (calls_before, busy_before), (calls_after, busy_after) = scrape(before), scrape(after)
        calls: dict[str, dict[int, list[float]]] = {}
        for key, row in sorted(calls_after.items()):
            earlier = calls_before.get(key, [0.0, 0.0, 0.0])
            diff = [a - b for a, b in zip(row, earlier)]
            if diff[0] > 0:
                calls.setdefault(key[0], {})[key[1]] = diff
        return cls(busy_seconds=busy_after - busy_before, calls=calls, **load)

    def seconds(self, model: str) -> float:
        return sum(row[2] for row in self.calls.get(model, {}).values())

    @property
    def own_work_seconds(self) -> float:
        """Busy time outside model calls: every sequence's work between them."""
        return max(0.0, self.busy_seconds - self.seconds("target") - self.seconds("draft"))

    def to_json(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "target" or self.target is not None}
        row["calls"] = {model: {str(n): r for n, r in by_n.items()} for model, by_n in self.calls.items()}
        return row

    @classmethod
    def from_json(cls, row: dict) -> CallSplit:
        calls = {model: {int(n): r for n, r in by_n.items()} for model, by_n in row["calls"].items()}
        return cls(**{**row, "calls": calls})


def split_table(splits: list[CallSplit]) -> str:
    """A row per load: its target calls by requests served (calls, tokens and ms per
    call), and the wall time split into target calls, draft calls, own work and idle."""
    rows = [["target", "task", "setting", "slots", "clients", "server", "target calls by requests served: "
             "n: calls (tokens, ms per call)", "wall s", "target s", "draft s", "own work s", "idle s"]]
    for s in splits:
        by_n = "; ".join(f"{n}: {int(calls)} ({tokens / calls:.1f}, {1000 * seconds / calls:.0f})"
                         for n, (calls, tokens, seconds) in sorted(s.calls.get("target", {}).items()))
        idle = max(0.0, s.wall_seconds - s.busy_seconds)
        rows.append([s.target or "", s.task, s.setting, str(s.slots), str(s.clients), s.mode, by_n or "none",
                     f"{s.wall_seconds:.1f}", f"{s.seconds('target'):.1f}", f"{s.seconds('draft'):.1f}",
                     f"{s.own_work_seconds:.1f}", f"{idle:.1f}"])
    return markdown_table(rows)


SPLIT_NOTE = (
    "Our servers' own account of each load, from their /metrics before and after it (bench/calls.py): "
    "target calls by how many requests each served, with the tokens and milliseconds of an average call; "
    "then the load's wall time as target calls, draft-model calls, own work (the requests' work between "
    "calls on the worker's one thread: sampling, verifying, detokenizing, stop strings, the policy) and "
    "idle (the worker waiting for requests). llama-server has no such account of a batched call.")

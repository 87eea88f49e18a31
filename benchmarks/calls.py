"""Where one load's time went in our server: its /metrics read before and after the
load (serve/metrics.py), as model calls by model, by the requests each call served and
by phase (the rounds' calls apart from those that took in text), and the worker's busy
time. What is left of the busy time after the calls is the
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

from specsample.bench.tables import markdown_table

_SAMPLE = re.compile(r'^specsample_model_call(s|_tokens|_seconds)_total\{([^}]*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_BUSY = "specsample_worker_busy_seconds "


def scrape(text: str) -> tuple[dict[tuple[str, int, str], list[float]], float]:
    """({(model, requests served, phase): [calls, tokens, seconds]}, worker busy
    seconds) from a /metrics page; a page from before the phase label reads as
    decode calls."""
    calls: dict[tuple[str, int, str], list[float]] = {}
    busy = 0.0
    for line in text.splitlines():
        if line.startswith(_BUSY):
            busy = float(line.split()[-1])
        elif (m := _SAMPLE.match(line)) is not None:
            kind, labels, value = m.groups()
            label = dict(_LABEL.findall(labels))  # in whatever order the client writes them
            row = calls.setdefault((label["model"], int(label["sequences"]), label.get("phase", "decode")),
                                   [0.0, 0.0, 0.0])
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
    # The rounds' calls: model ("target", "draft") -> requests served by a call ->
    # [calls, tokens, seconds]
    calls: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    # Calls taking in text (prompt chunks, the draft catching up): model -> [calls,
    # tokens, seconds]. They cost by their size: averaged with the rounds' calls, a
    # server with longer catching-up calls looked as if its rounds' calls cost more.
    prompt_calls: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def between(cls, before: str, after: str, **load) -> CallSplit:
        """The split of a load from the /metrics pages read before and after it."""
        (calls_before, busy_before), (calls_after, busy_after) = scrape(before), scrape(after)
        calls: dict[str, dict[int, list[float]]] = {}
        prompt_calls: dict[str, list[float]] = {}
        for key, row in sorted(calls_after.items()):
            earlier = calls_before.get(key, [0.0, 0.0, 0.0])
            diff = [a - b for a, b in zip(row, earlier)]
            if diff[0] <= 0:
                continue
            model, sequences, phase = key
            if phase == "prompt":
                total = prompt_calls.setdefault(model, [0.0, 0.0, 0.0])
                prompt_calls[model] = [a + b for a, b in zip(total, diff)]
            else:
                calls.setdefault(model, {})[sequences] = diff
        return cls(busy_seconds=busy_after - busy_before, calls=calls, prompt_calls=prompt_calls, **load)

    def seconds(self, model: str) -> float:
        """Seconds in the rounds' calls to `model`."""
        return sum(row[2] for row in self.calls.get(model, {}).values())

    @property
    def prompt_seconds(self) -> float:
        return sum(row[2] for row in self.prompt_calls.values())

    @property
    def own_work_seconds(self) -> float:
        """Busy time outside model calls: every sequence's work between them."""
        return max(0.0, self.busy_seconds - self.seconds("target") - self.seconds("draft") - self.prompt_seconds)

    def to_json(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "target" or self.target is not None}
        row["calls"] = {model: {str(n): r for n, r in by_n.items()} for model, by_n in self.calls.items()}
        return row

    @classmethod
    def from_json(cls, row: dict) -> CallSplit:
        calls = {model: {int(n): r for n, r in by_n.items()} for model, by_n in row["calls"].items()}
        return cls(**{**row, "calls": calls})  # a row from before prompt_calls reads as decode calls alone


def split_table(splits: list[CallSplit]) -> str:
    """A row per load: the rounds' target calls by requests served (calls, tokens and
    ms per call), the calls taking in prompts, and the wall time split into those,
    the rounds' target and draft calls, own work and idle."""
    rows = [["target", "task", "setting", "slots", "clients", "server", "rounds' target calls by requests served: "
             "n: calls (tokens, ms per call)", "prompt calls: target; draft (tokens, ms per call)", "wall s",
             "prompt s", "target s", "draft s", "own work s", "idle s"]]
    for s in splits:
        by_n = "; ".join(f"{n}: {_calls(row)}" for n, row in sorted(s.calls.get("target", {}).items()))
        prompts = "; ".join(_calls(s.prompt_calls[m]) if m in s.prompt_calls else "0" for m in ("target", "draft"))
        idle = max(0.0, s.wall_seconds - s.busy_seconds)
        rows.append([s.target or "", s.task, s.setting, str(s.slots), str(s.clients), s.mode, by_n or "none",
                     prompts if s.prompt_calls else "not counted", f"{s.wall_seconds:.1f}", f"{s.prompt_seconds:.1f}",
                     f"{s.seconds('target'):.1f}", f"{s.seconds('draft'):.1f}", f"{s.own_work_seconds:.1f}",
                     f"{idle:.1f}"])
    return markdown_table(rows)


def _calls(row: list[float]) -> str:
    calls, tokens, seconds = row
    return f"{int(calls)} ({tokens / calls:.1f}, {1000 * seconds / calls:.0f})"


SPLIT_NOTE = (
    "Our servers' own account of each load, from their /metrics before and after it (bench/calls.py): "
    "the rounds' target calls by how many requests each served, with the tokens and milliseconds of an "
    "average call, and apart from them the calls that took in text (prompt chunks, the draft model catching "
    "up on a prompt or on plain steps' tokens), which cost by their size; then the load's wall time as those "
    "prompt calls, the rounds' target and draft-model calls, own work (the requests' work between calls on "
    "the worker's one thread: sampling, verifying, detokenizing, stop strings, the policy) and idle (the "
    "worker waiting for requests). llama-server has no such account of a batched call.")

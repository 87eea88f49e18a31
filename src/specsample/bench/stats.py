"""Small statistics: percentiles and per-mode aggregates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .records import Record


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default). [1, 2, 3, 4] at q=50 -> 2.5; at q=90 -> 3.7."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class ModeSummary:
    task: str
    setting: str
    mode: str
    family: str
    k: int | None
    sequences: int
    new_tokens: int
    seconds: float
    accepted: int
    drafted: int
    target_calls: int
    latencies: list[float]
    decode_seconds: float | None = 0.0  # wall time less prompt prefill; None when a mode does not report prefill
    speedup: float | None = None  # tokens/s over the `ar` mode's, same task and setting
    decode_speedup: float | None = None  # the same with the target's prompt prefill left out
    first_token: list[float] = field(default_factory=list)  # each sequence's time to its first token, where reported
    first_token_ratio: float | None = None  # the median first_token over the `ar` mode's

    @property
    def time_to_first_token(self) -> float | None:
        """The median over the row's sequences; None unless every one reported it."""
        return percentile(self.first_token, 50) if self.first_token and len(self.first_token) == self.sequences \
            else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        return self.new_tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def ms_per_token(self) -> float | None:
        return 1000 * self.seconds / self.new_tokens if self.new_tokens else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_target_call(self) -> float | None:
        return self.new_tokens / self.target_calls if self.target_calls else None

    def latency(self, q: float) -> float:
        return percentile(self.latencies, q)


def summarise(records: list[Record], baseline: str = "ar") -> list[ModeSummary]:
    """One summary per (task, setting, mode), in first-seen order, with speedups
    over the baseline mode of the same task and setting. A task whose prompts have
    kinds (chat, a prompts file) gets a row per kind, "task/kind", after its overall row."""
    groups: dict[tuple, ModeSummary] = {}
    for r in records:
        for task in (r.task, f"{r.task}/{r.kind}") if r.kind else (r.task,):
            _add(groups, task, r)
    for s in groups.values():
        base = groups.get((s.task, s.setting, baseline))
        if base is not None and base.tokens_per_second:
            s.speedup = s.tokens_per_second / base.tokens_per_second
        if base is not None and base.decode_tokens_per_second and s.decode_tokens_per_second:
            s.decode_speedup = s.decode_tokens_per_second / base.decode_tokens_per_second
        if base is not None and base.time_to_first_token and s.time_to_first_token is not None:
            s.first_token_ratio = s.time_to_first_token / base.time_to_first_token
    return list(groups.values())


def _add(groups: dict[tuple, ModeSummary], task: str, r: Record) -> None:
    key = (task, r.setting, r.mode)
    s = groups.get(key)
    if s is None:
        s = groups[key] = ModeSummary(task, r.setting, r.mode, r.family, r.k, 0, 0, 0.0, 0, 0, 0, [])
    st = r.stats
    s.sequences += 1
    s.new_tokens += st["new_tokens"]
    s.seconds += r.latency_seconds
    s.accepted += st.get("accepted") or 0
    s.drafted += st.get("drafted") or 0
    s.target_calls += st.get("target_calls") or 0
    s.latencies.append(r.latency_seconds)
    if s.decode_seconds is not None and "prefill_seconds" in st:
        s.decode_seconds += r.latency_seconds - st["prefill_seconds"]
    else:
        s.decode_seconds = None
    if st.get("first_token_seconds") is not None:
        s.first_token.append(st["first_token_seconds"])

"""A benchmark Record with every field a test does not care about filled in."""

from specsample.bench.records import Record


def record(**fields) -> Record:
    defaults = dict(phase="main", task="t", setting="greedy", prompt_id="p0", prompt_index=0, prompt_tokens=4,
                    mode="ar", family="ar", k=None, seed=0, max_new_tokens=16, latency_seconds=1.0,
                    stop_reason="length", stats={}, token_ids=[], text="")
    return Record(**{**defaults, **fields})

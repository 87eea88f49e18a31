"""The bench tests' helpers: a Record with every field a test does not care about filled
in, and fakes of the servers and peers the bench drives."""

import copy

from specsample.bench.modes import Outcome
from specsample.bench.records import Record


def record(**fields) -> Record:
    defaults = dict(phase="main", task="t", setting="greedy", prompt_id="p0", prompt_index=0, prompt_tokens=4,
                    mode="ar", family="ar", k=None, seed=0, max_new_tokens=16, latency_seconds=1.0,
                    stop_reason="length", stats={}, token_ids=[], text="")
    return Record(**{**defaults, **fields})


# A llama-server /completion answer: nine tokens of JSON, ended by the end-of-sequence token.
ANSWER = {"content": '{"f": "ab", "ok": true}', "tokens": list(range(9)), "stop_type": "eos",
          "timings": {"predicted_n": 9, "prompt_ms": 1.0, "predicted_ms": 9.0, "prompt_n": 3}}


class FakeServer:
    """A started server without a process, as bench/servers.py's ServerProcess (and
    native.py's LlamaServer, which adds `complete`) are driven: answers /v1/models and
    /metrics, answers every /completion with `answer`, and records the bodies it is
    sent in `bodies` and its start, resets and close in `events`."""

    def __init__(self, name="server", events=None, answer=ANSWER):
        self.name, self.url, self.answer = name, f"http://{name}", answer
        self.events = [] if events is None else events
        self.bodies, self.reads = [], 0
        self.events.append(f"start {name}")

    def request(self, route, body=None):
        return {"data": [{"id": "m"}]}

    def text(self, route):
        """/metrics: every read finds one more 4-request target call and a second more busy."""
        self.reads += 1
        return (f'specsample_model_calls_total{{model="target",sequences="4"}} {self.reads}.0\n'
                f'specsample_model_call_tokens_total{{model="target",sequences="4"}} {8 * self.reads}.0\n'
                f'specsample_model_call_seconds_total{{model="target",sequences="4"}} {0.25 * self.reads}\n'
                f"specsample_worker_busy_seconds {self.reads}.0\n")

    def complete(self, body):
        self.bodies.append(body)
        return copy.deepcopy(self.answer)

    def reset(self, prompts):
        self.events.append(f"reset {self.name}")

    def close(self):
        self.events.append(f"close {self.name}")


class PlainOnly:
    """A peer that cannot take a schema (as transformers' generate here)."""

    name = family = "plain-only"
    k, structured = None, False

    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=()):
        return Outcome([1] * max_new_tokens, "", "length", {"new_tokens": max_new_tokens})

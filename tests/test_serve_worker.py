"""The worker on its own, in the test's thread: a job whose client left stops within
one target call, wherever the worker was (scoring a prompt, between prompts, before a
generation)."""

import pytest

from specsample.decoding.generate import GenerationConfig
from specsample.output.logprobs import score_prompt
from specsample.serve.events import End, Ended, PromptScored
from specsample.serve.worker import QueuedRequest, ChoiceTask, Worker

from serve_helpers import ToyBackend

pytestmark = pytest.mark.pure

PROMPT = [5, 6, 7, 8, 9] * 60  # 300 tokens: three scoring calls of 128 tokens


class Inline:
    """Stands in for the request's event loop: events are queued at once."""

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


class LeavesAt(ToyBackend):
    """A target whose client leaves during its call numbered `at`."""

    def __init__(self, at: int):
        super().__init__(0, context_length=4096)
        self.at, self.job = at, None

    def score(self, token_ids, num_logits):
        logits = super().score(token_ids, num_logits)
        if self.calls == self.at:
            self.job.cancel()
        return logits


def run(target, tasks) -> list:
    job = QueuedRequest(tasks, lambda draft: None, Inline())
    target.job = job
    Worker(target, max_queue=1)._generate(job, 0)
    events = []
    while not job.events.empty():
        events.append(job.events.get_nowait())
    return events


def echo_tasks(prompts: int, generate: bool = False) -> list[ChoiceTask]:
    config = GenerationConfig(max_new_tokens=50) if generate else None
    return [ChoiceTask(i, PROMPT, config, prompt_logprobs=0) for i in range(prompts)]


@pytest.mark.parametrize("at", [1, 2, 3, 5])
def test_scoring_stops_within_one_call_of_a_cancellation(at):
    """Echo scoring of four prompts (3 calls each): cancelled during call `at` (mid-prompt,
    or the last call of a prompt), not one more call is made."""
    target = LeavesAt(at)
    events = run(target, echo_tasks(4))
    assert target.calls == at
    assert events[-1] == Ended(End.CANCELLED)
    assert sum(isinstance(e, PromptScored) for e in events) == (at - 1) // 3  # those finished before


def test_a_generation_does_not_start_after_its_prompt_was_scored_for_nobody():
    target = LeavesAt(3)  # the last scoring call of the first prompt
    events = run(target, echo_tasks(1, generate=True))
    assert target.calls == 3 and events[-1] == Ended(End.CANCELLED)


def test_without_a_cancellation_every_prompt_is_scored():
    target = LeavesAt(at=0)
    events = run(target, echo_tasks(2))
    assert target.calls == 6 and events[-1] == Ended(End.DONE)
    assert [e.index for e in events if isinstance(e, PromptScored)] == [0, 1]


def test_score_prompt_returns_none_once_cancelled():
    target = ToyBackend(0, context_length=4096)
    asked = []

    def cancelled():
        asked.append(target.calls)
        return target.calls == 2

    assert score_prompt(target, PROMPT, cancelled=cancelled) is None
    assert target.calls == 2 and asked == [0, 1, 2]
    assert len(score_prompt(ToyBackend(0, context_length=4096), PROMPT)) == len(PROMPT)

"""What the loop tells the policy: each round's calls as its own clock timed them,
and when a sequence is over."""

import gc

import pytest

from specsample.backends.base import BackendError
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import SamplingConfig

from toy import FakeClock, PoisonedBackend, TrigramBackend, random_table

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0)
TABLE = random_table(8, seed=3)


class CountingPolicy(FixedK):
    """FixedK that keeps what it is told."""

    def __init__(self, k):
        super().__init__(k)
        self.begun, self.ended, self.reports = 0, 0, []

    def begin(self, context, max_new_tokens):
        self.begun += 1

    def observe(self, report):
        self.reports.append(report)

    def end(self):
        self.ended += 1


class SlowBackend(TrigramBackend):
    """Each score() moves the clock by `seconds`."""

    def __init__(self, table, clock, seconds=1.0):
        super().__init__(table, name="slow")
        self.clock, self.seconds = clock, seconds

    def score(self, token_ids, num_logits):
        self.clock.now += self.seconds
        return super().score(token_ids, num_logits)


def drafter():
    return ModelDrafter(TrigramBackend(TABLE + 0.3 * random_table(8, seed=4), name="draft"), GREEDY)


def test_the_policy_is_told_the_tokens_fed_and_the_clock_around_the_call():
    clock = FakeClock()
    target, policy = SlowBackend(TABLE, clock), CountingPolicy(2)
    generate(target, [1, 2, 3], GenerationConfig(max_new_tokens=12, sampling=GREEDY), drafter(), policy, clock)
    # Every round after the first feeds its pending token plus its drafts (the first only its drafts).
    fed = [len(r.sources) + (i > 0) for i, r in enumerate(policy.reports)]
    assert [r.target_tokens for r in policy.reports] == fed
    assert [r.target_seconds for r in policy.reports] == [1.0] * len(fed)
    assert all(r.round_seconds >= 1.0 for r in policy.reports)


def test_a_round_without_a_call_reports_none():
    # One token to go: no drafts, and the prefill's last row already predicts it, so no call is made.
    clock = FakeClock()
    target, policy = SlowBackend(TABLE, clock), CountingPolicy(3)
    result = generate(target, [1, 2, 3], GenerationConfig(max_new_tokens=1, sampling=GREEDY), drafter(), policy,
                      clock)
    assert result.stats.target_calls == 0
    [report] = policy.reports
    assert (report.target_tokens, report.target_seconds) == (0, 0.0)


def test_the_policy_hears_the_end_once_when_the_stream_finishes():
    policy = CountingPolicy(2)
    result = generate(TrigramBackend(TABLE), [1, 2, 3], GenerationConfig(max_new_tokens=15, sampling=GREEDY),
                      drafter(), policy)
    assert len(result.token_ids) == 15
    assert (policy.begun, policy.ended) == (1, 1)


@pytest.mark.parametrize("how", ["closed", "collected", "failed"])
def test_the_policy_hears_the_end_once_when_the_stream_is_abandoned_or_fails(how):
    policy = CountingPolicy(2)
    # Poisoned: the target's rows turn to NaN once the text reaches 12 tokens, after the first two chunks.
    target = PoisonedBackend(TABLE, float("nan"), after=12) if how == "failed" else TrigramBackend(TABLE)
    s = stream(target, [1, 2, 3], GenerationConfig(max_new_tokens=50, sampling=GREEDY), drafter(), policy)
    chunks = iter(s)
    next(chunks), next(chunks)
    assert (policy.begun, policy.ended) == (1, 0)
    if how == "closed":
        chunks.close()
        chunks.close()  # a second close is a no-op
    elif how == "collected":
        del chunks, s
        gc.collect()
    else:
        with pytest.raises(BackendError, match="poisoned"):
            list(chunks)
    assert (policy.begun, policy.ended) == (1, 1)


def test_a_stream_never_started_or_without_a_drafter_never_ends_the_policy():
    policy = CountingPolicy(2)
    config = GenerationConfig(max_new_tokens=5, sampling=GREEDY)
    s = stream(TrigramBackend(TABLE), [1, 2, 3], config, drafter(), policy)
    del s
    gc.collect()
    generate(TrigramBackend(TABLE), [1, 2, 3], config, None, policy)
    assert (policy.begun, policy.ended) == (0, 0)

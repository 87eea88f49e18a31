"""The admission loop (admission.py) on a toy target: a slot is free again once its work
ends, whether it returned, raised or was cancelled; no more sequences run than there
are slots; work is admitted in the order the policy starts it, each on the slot free
longest when it asks for free[0]; the loop goes on until the policy says stop."""

import pytest

from specsample.decoding.admission import Admission
from specsample.decoding.batching import Cancelled, Scheduler, slots
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from toy import TrigramSequences, random_table

pytestmark = pytest.mark.pure

TABLE = random_table(6, seed=0)
GREEDY = SamplingConfig(temperature=0.0)


def loop(sequences: int, prefill_chunk: int = 128):
    target = TrigramSequences(TABLE, sequences)
    return target, slots(target), Admission(Scheduler(target, prefill_chunk), sequences)


def generating(on, length: int, prompt=(1, 2)):
    """Work for a slot: a greedy generation of `length` tokens on it."""
    return lambda seq: generate(on[seq], list(prompt), GenerationConfig(max_new_tokens=length, sampling=GREEDY))


def in_order(admission: Admission, work: list) -> list:
    """A policy: the work in order, each on the slot free longest, until all has run.
    Returns the jobs (filled in as they start), the policy and the (item, slot) starts."""
    jobs, started, waiting = [], [], list(enumerate(work))

    def admit(admission: Admission) -> bool:
        while waiting and admission.free:
            item, run = waiting.pop(0)
            started.append((item, admission.free[0]))
            jobs.append(admission.start(admission.free[0], run))
        return admission.scheduler.live > 0

    return jobs, admit, started


def test_a_slot_is_free_again_after_its_work_raised_before_or_after_a_model_call():
    target, on, admission = loop(2)

    def fails_at_once(seq):
        raise RuntimeError("before any call")

    def fails_after_a_call(seq):
        on[seq].score([1, 2, 3], 1)
        raise RuntimeError("after a call")

    jobs, admit, started = in_order(admission, [fails_at_once, fails_after_a_call, generating(on, 3)])
    admission.run(admit)
    assert [str(j.error) for j in jobs[:2]] == ["before any call", "after a call"]
    assert jobs[2].error is None and len(jobs[2].result.token_ids) == 3
    # The first failed inside start(): its slot 0 was free again before the third came,
    # behind slot 1, which had been free longer.
    assert started == [(0, 0), (1, 1), (2, 0)]
    assert sorted(admission.free) == [0, 1] and admission.scheduler.live == 0


def test_a_cancelled_sequence_gives_its_slot_to_the_next_work():
    target, on, admission = loop(1, prefill_chunk=4)
    left = []
    long_prompt = generating(on, 3, prompt=[1, 2, 3, 4, 5] * 4)  # five chunks of 4 tokens
    jobs, started, waiting = [], [], [long_prompt, generating(on, 2)]

    def admit(admission: Admission) -> bool:
        if waiting and admission.free:
            cancelled = (lambda: bool(left)) if not jobs else None
            started.append(admission.free[0])
            jobs.append(admission.start(admission.free[0], waiting.pop(0), cancelled))
        if len(target.calls) == 2:
            left.append(True)  # the long prompt's owner leaves after two of its chunks
        return admission.scheduler.live > 0

    admission.run(admit)
    assert isinstance(jobs[0].error, Cancelled)
    assert jobs[1].error is None and len(jobs[1].result.token_ids) == 2
    assert started == [0, 0] and admission.free == [0]
    assert [seq for call in target.calls for seq, _ in call] == [0] * len(target.calls)


def test_never_more_sequences_than_slots_and_the_slot_free_longest_comes_first():
    target, on, admission = loop(3)
    running, most = [], []

    def counted(length):
        run = generating(on, length)

        def counted_run(seq):
            running.append(seq)
            most.append(len(running))
            try:
                return run(seq)
            finally:
                running.remove(seq)
        return counted_run

    lengths = [6, 2, 4, 1, 3, 5, 2]
    jobs, admit, started = in_order(admission, [counted(n) for n in lengths])
    admission.run(admit)
    assert [len(j.result.token_ids) for j in jobs] == lengths
    assert max(most) == 3 and all(len(call) <= 3 for call in target.calls)
    assert [item for item, _ in started] == list(range(len(lengths)))  # the policy's order
    # Slot 1 (2 tokens) frees first, then slot 2 (4 tokens) after item 3 on slot 1 (1 token):
    # each newcomer takes the slot that has been free longest.
    assert started[:4] == [(0, 0), (1, 1), (2, 2), (3, 1)]
    assert sorted(admission.free) == [0, 1, 2]


def test_a_slot_in_use_cannot_be_started_on_again():
    _, on, admission = loop(2)
    admission.start(0, generating(on, 4))
    with pytest.raises(ValueError, match="slot 0 is not free"):
        admission.start(0, generating(on, 4))
    assert admission.free == [1]


def test_the_loop_admits_before_every_round_until_the_policy_says_stop():
    target, on, admission = loop(1)
    asked = []

    def admit(admission: Admission) -> bool:
        asked.append(len(target.calls))
        if not asked[1:]:
            admission.start(0, generating(on, 5))
        return len(asked) < 4  # stop after three rounds, whatever still runs

    admission.run(admit)
    assert asked == [0, 1, 2, 3] and len(target.calls) == 3
    assert admission.scheduler.live == 1 and admission.free == []

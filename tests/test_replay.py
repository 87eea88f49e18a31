"""The planner's replay (benchmarks/replay.py): recorded models under the real loop and
planner reproduce the recorded greedy answer, and a planner number moves the
modelled time (what benchmarks/sensitivity.py measures)."""

import dataclasses

import pytest

from benchmarks.replay import Costs, Recording, check_replayed, play_batch, play_single
from benchmarks.sensitivity import scaled, tuning_numbers
from specsample.policy.config import PLANNER

pytestmark = pytest.mark.pure

# A memory-bound target (a call of 9 tokens costs 1.2 plain steps) and a cheap draft:
# drafting pays wherever the draft is right.
MEASURED = {"target": [0.1, 0.102, 0.104, 0.106, 0.108, 0.11, 0.112, 0.116, 0.12], "draft_step": 0.005,
            "draft_first": 0.005, "draft_token": 0.001, "draft_long": 0.1, "own_work": 0.001}


def recording(prompt_id: str, start: int, misses: set[int]) -> Recording:
    """A 40-token answer (then EOS) of tokens start .. start + 39 after a 6-token
    prompt; the draft's argmax is right except at `misses`, where it says 2."""
    prompt = [start + 100 + i for i in range(6)]
    answer = [start + i for i in range(40)] + [0]
    draft = [2 if i in misses else t for i, t in enumerate(answer)]
    return Recording(prompt_id, prompt, answer, draft, [0.9] * len(answer), 0, 128)


def test_the_replay_emits_the_recorded_answer_and_k_max_moves_its_time():
    rec = recording("a", 10, misses={7, 20})
    default = play_single([rec], Costs(MEASURED), MEASURED, PLANNER)
    assert default.tokens == len(rec.answer)
    assert default.tokens_per_call > 2  # it drafted: the draft is right 38 times in 40
    one = play_single([rec], Costs(MEASURED), MEASURED, dataclasses.replace(PLANNER, k_max=1))
    assert one.tokens_per_call <= 2 and one.seconds > 1.2 * default.seconds


def test_the_replay_is_deterministic_and_its_noise_is_seeded():
    rec = recording("a", 10, misses={3})
    runs = [play_single([rec], Costs(MEASURED, noise=0.2, seed=s), MEASURED, PLANNER).seconds for s in (0, 0, 1)]
    assert runs[0] == runs[1] != runs[2]


def test_a_batch_replays_every_answer_through_its_slots():
    recs = [recording(name, start, misses={5}) for name, start in (("a", 10), ("b", 50), ("c", 200))]
    played = play_batch(recs, Costs(MEASURED), MEASURED, PLANNER, sequences=2)
    assert played.tokens == sum(len(r.answer) for r in recs)


def test_another_answer_than_the_recording_is_caught():
    rec = recording("a", 10, misses=set())
    check_replayed(rec, list(rec.answer))
    with pytest.raises(AssertionError):
        check_replayed(rec, rec.answer[:-2] + [0])


def test_variants_stay_valid_configurations():
    """Half and double of every tuning number make a PlannerConfig (its checks pass),
    decays stay decays, and each variant differs from the default."""
    for name in tuning_numbers():
        for factor in (0.5, 2.0):
            value = scaled(name, getattr(PLANNER, name), factor)
            dataclasses.replace(PLANNER, **{name: value})
            assert value != getattr(PLANNER, name), name
    assert scaled("hidden_decay", 0.95, 2.0) == pytest.approx(0.975)

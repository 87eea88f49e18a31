"""-k auto's check on what a batch realised: drafting is barred for a batch size where
rounds with draft-model steps made fewer tokens per second than plain ones
(estimates.RealisedRates), and the controllers of the batch then step plain."""

import pytest

from specsample.control import AdaptiveController
from specsample.estimates import Costs, RealisedRates
from specsample.plans import MODEL, DraftCall, Offer, RoundReport
from test_control_batch import with_draft_widths

pytestmark = pytest.mark.pure

SEQUENCES = 4


def batch_round(rates: RealisedRates, tokens: int, seconds: float, drafted: bool, prompt: bool = False,
                size: int = SEQUENCES) -> None:
    """One round of `size` sequences, each emitting `tokens` over the same call-to-call time."""
    for key in range(size):
        rates.observe(key, size, tokens, seconds, drafted, prompt)


def test_drafting_that_realises_less_than_plain_steps_is_barred():
    rates = RealisedRates()
    for _ in range(6):  # drafting: 2 tokens each a round of 0.5 s, 16 tokens/s
        assert not rates.barred(SEQUENCES)
        batch_round(rates, 2, 0.5, drafted=True)
    assert rates.barred(SEQUENCES)  # no plain rate to compare with yet: plain steps are measured
    for _ in range(6):  # plain: 1 token each a round of 0.17 s, 23.5 tokens/s
        batch_round(rates, 1, 0.17, drafted=False)
    assert rates.rate(SEQUENCES, True) == pytest.approx(16.0, rel=0.02)
    assert rates.rate(SEQUENCES, False) == pytest.approx(4 / 0.17, rel=0.02)
    assert rates.barred(SEQUENCES)


def test_drafting_that_realises_more_than_plain_steps_goes_on():
    """The negative control: the same rounds with drafting at 40 tokens/s."""
    rates = RealisedRates()
    for _ in range(6):
        batch_round(rates, 3, 0.3, drafted=True)
    assert rates.barred(SEQUENCES)  # the plain steps' probe
    for _ in range(6):
        batch_round(rates, 1, 0.17, drafted=False)
    assert not rates.barred(SEQUENCES)


def rounds_until(rates: RealisedRates, barred: bool, tokens: int, seconds: float, drafted: bool) -> int:
    """Rounds played until the bar is `barred` (at most 100)."""
    for played in range(100):
        if rates.barred(SEQUENCES) == barred:
            return played
        batch_round(rates, tokens, seconds, drafted)
    return 100


def test_stale_evidence_is_measured_afresh():
    """Barred, drafting's evidence fades until it is tried again, in a block of rounds;
    where it still loses it is barred again. Evidence goes stale after
    log(stale / evidence) / log(decay) rounds: 21 here."""
    rates = RealisedRates(decay=0.95)
    assert rounds_until(rates, True, 2, 0.5, drafted=True) == 7  # 6 rounds' weight at this decay, and a half
    assert 5 <= rounds_until(rates, False, 1, 0.17, drafted=False) <= 30  # plain evidence, then drafting's stale
    probe = rounds_until(rates, True, 2, 0.5, drafted=True)
    assert 3 <= probe <= 6


def test_plain_rounds_are_probed_where_drafting_wins():
    rates = RealisedRates(decay=0.95)
    assert rounds_until(rates, True, 3, 0.3, drafted=True) == 7
    assert rounds_until(rates, False, 1, 0.17, drafted=False) == 7  # plain evidence: drafting wins
    assert 15 <= rounds_until(rates, True, 3, 0.3, drafted=True) <= 30  # until the plain rate is stale
    assert 3 <= rounds_until(rates, False, 1, 0.17, drafted=False) <= 6


def test_rounds_that_took_in_a_prompt_a_batch_of_one_and_other_sizes_are_apart():
    rates = RealisedRates()
    for _ in range(10):
        batch_round(rates, 2, 0.5, drafted=True, prompt=True)  # a newcomer's prefill in every call
        batch_round(rates, 2, 0.5, drafted=True, size=1)
    assert rates.rounds(SEQUENCES, True) == 0 and rates.rounds(1, True) == 0
    assert not rates.barred(SEQUENCES) and not rates.barred(1)
    for _ in range(6):
        batch_round(rates, 2, 0.5, drafted=True, size=3)
    assert rates.barred(3) and rates.rounds(SEQUENCES, True) == 0


def test_a_round_closes_when_a_sequence_reports_again():
    """A sequence that left after its last round (the load then posts 3) does not hold
    the round open, nor does a newcomer that has not reported yet (the load posts 5)."""
    rates = RealisedRates()
    for key in range(4):
        rates.observe(key, 5, 1, 0.2, False, False)
    assert rates.rounds(4, False) == 0
    rates.observe(0, 3, 1, 0.2, False, False)
    assert rates.rounds(4, False) == 1
    for key in (1, 2):
        rates.observe(key, 3, 1, 0.2, False, False)
    assert rates.rounds(3, False) == 1  # all 3 posted have reported


def test_a_round_is_one_call_to_call_time_and_every_sequence_drafts_or_not_together():
    rates = RealisedRates()
    for key, (tokens, drafted) in enumerate([(3, True), (1, False), (1, False), (2, True)]):
        rates.observe(key, 4, tokens, 0.4 + 0.01 * key, drafted, False)
    assert rates.rounds(4, True) == 1 and rates.rounds(4, False) == 0
    assert rates.rate(4, True) == pytest.approx(7 / 0.415)


# A BF16 target on the CPU: wide calls cost little more than narrow ones, so the cost
# model predicts that drafting together pays (test_control_batch) while the load's
# draft steps, catch-up and own work took more than it priced.
BF16 = [92.5, 112.8, 121.9, 141.7, 150.0, 158.0, 166.0, 172.0, 178.4]


def batch_of_controllers(accept: float = 0.8) -> list[AdaptiveController]:
    costs = Costs()
    costs.warm_start([ms / 1000 for ms in BF16], 0.0127, 0.0032, 0.0129,
                     wide={16: 0.21, 24: 0.25, 36: 0.3})
    with_draft_widths(costs, {w: 0.0127 for w in (2, 3, 4)})  # as if the draft's steps were batched free
    parent = AdaptiveController(k_max=4, costs=costs)
    sequences = [parent] + [parent.fork() for _ in range(SEQUENCES - 1)]
    for s in sequences:
        for i in range(4):
            rate = s.acceptance[MODEL].at(i)
            rate.hits, rate.trials = accept * 50, 50
        s.begin(list(range(8)), 1000)
    return sequences


def report(m: int, emitted: int, seconds: float) -> RoundReport:
    drafts = [DraftCall(1, 0.05, SEQUENCES)] * m
    return RoundReport([MODEL] * m, [None] * m, min(m, emitted - 1), SEQUENCES * (m + 1), 0.15, drafts, seconds,
                       tuple(range(emitted)), waited_seconds=seconds - 0.01)


def rounds_of(sequences, rounds: int, draft_seconds: float) -> list[int]:
    """Each sequence plans, then reports its round: 2 tokens from a drafting round of
    `draft_seconds`, 1 from a plain one of 0.17 s. The lengths of the last plans."""
    lengths = []
    for _ in range(rounds):
        lengths = [s.plan(Offer({MODEL: 4}, 1)).length for s in sequences]
        for s, m in zip(sequences, lengths):
            s.observe(report(m, 2, draft_seconds) if m else report(0, 1, 0.17))
    return lengths


def test_a_batch_whose_drafting_realised_less_than_plain_steps_steps_plain():
    """4 sequences drafting at 16 tokens/s (2 tokens each in 0.5 s) against 23.5 plain:
    after the evidence of both, every plan is plain; the negative control, drafting at
    40 tokens/s (0.2 s), goes on drafting."""
    sequences = batch_of_controllers()
    assert all(rounds_of(sequences, 1, 0.5))  # the cost model predicts a gain
    assert rounds_of(sequences, 30, 0.5) == [0] * SEQUENCES
    load = sequences[0].load.realised
    assert load.rounds(SEQUENCES, False) >= 6 and load.rate(SEQUENCES, True) < load.rate(SEQUENCES, False)

    winning = batch_of_controllers()
    assert any(rounds_of(winning, 30, 0.2))
    assert not winning[0].load.realised.barred(SEQUENCES)


def test_one_sequence_keeps_the_cost_models_choice():
    """The same losing rounds with the other three gone: a batch of one is not barred."""
    sequences = batch_of_controllers()
    for s in sequences[1:]:
        s.end()
    assert all(rounds_of(sequences[:1], 30, 0.5))


def test_a_size_without_evidence_takes_the_bar_of_the_nearest_size_with_it():
    """While a newcomer's prompt is read, the others plan as 3 in rounds that are left out
    of the rates: they take the bar of 4."""
    rates = RealisedRates()
    assert rounds_until(rates, True, 2, 0.5, drafted=True) == 6
    assert rates.barred(3) and rates.barred(2) and not rates.barred(1)
    # From there size 3 goes on by its own rounds: plain steps measured, then drafting tried.
    for _ in range(3):
        batch_round(rates, 1, 0.1, drafted=False, size=3)
    assert rates.barred(3)
    for _ in range(3):
        batch_round(rates, 1, 0.1, drafted=False, size=3)
    assert not rates.barred(3) and not rates.barred(2) and rates.barred(4)  # 2 takes the nearer 3

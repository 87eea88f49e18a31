"""The batch-composition study's arithmetic: how far rows scored in company are from
the same rows scored alone (studies/batch_numerics.py)."""

import math

import pytest
import torch

from benchmarks.studies.batch_numerics import OTHER_SIZES, Drift, tokens_in_call

pytestmark = pytest.mark.pure


def test_identical_rows_drift_by_nothing():
    alone = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    drift = Drift()
    drift.add(alone, alone.clone())
    assert (drift.rows, drift.max_logit_diff, drift.tv, drift.argmax_changed) == (2, 0.0, [0.0, 0.0], 0)
    assert drift.cells() == ["0", "0 / 0", "0 of 2"]


def test_a_shift_of_every_logit_moves_the_logits_but_not_the_distribution():
    alone = torch.tensor([[1.0, 2.0, 3.0]])
    drift = Drift()
    drift.add(alone, alone + 0.25)
    assert drift.max_logit_diff == pytest.approx(0.25)
    assert drift.tv == [pytest.approx(0.0, abs=1e-12)] and drift.argmax_changed == 0


def test_a_swapped_top_pair_changes_the_argmax_and_the_total_variation_is_the_moved_mass():
    alone = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])  # softmax [1/4, 3/4]; [1/2, 1/2]
    batched = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # [3/4, 1/4]; unchanged
    drift = Drift()
    drift.add(alone, batched)
    assert drift.max_logit_diff == pytest.approx(math.log(3.0))
    assert drift.tv == [pytest.approx(0.5), 0.0] and drift.argmax_changed == 1


def test_drift_accumulates_over_calls_keeping_the_worst_difference():
    drift = Drift()
    drift.add(torch.zeros(1, 4), torch.tensor([[0.0, 0.0, 0.5, 0.0]]))
    drift.add(torch.zeros(4, 4), torch.zeros(4, 4) - 0.125)
    assert drift.rows == 5 and drift.max_logit_diff == 0.5 and len(drift.tv) == 5
    assert drift.argmax_changed == 1  # ties in the alone row break to the first index; 0.5 moves it
    assert drift.cells()[2] == "1 of 5"


def test_rows_of_different_shapes_are_refused():
    with pytest.raises(ValueError, match="different shapes"):
        Drift().add(torch.zeros(1, 4), torch.zeros(4, 4))


def test_a_call_holds_the_step_and_the_first_others_steps():
    assert tokens_in_call(4, 0) == 4
    assert tokens_in_call(1, 3) == 1 + sum(OTHER_SIZES[:3])
    assert tokens_in_call(4, 7) == 4 + sum(OTHER_SIZES)

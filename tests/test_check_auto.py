"""`check` under -k auto, on backends whose calls take real time: the adaptive controller
drafts from its own timings, as in use. Not pure: what it chooses follows the wall
clock, which tests running beside it would move."""

import importlib
import time

import pytest

from specsample.check import CheckConfig, check
from specsample.drafters import ModelDrafter

from test_check import DRAFT, PROMPTS, SAMPLING, TARGET
from test_distribution import accept_everything
from toy import TrigramBackend

pytestmark = pytest.mark.system

rounds_module = importlib.import_module("specsample.rounds")


class Sleepy(TrigramBackend):
    """Calls that take real time, the same for 1 or 5 tokens: drafting pays."""

    def __init__(self, table, seconds, name="sleepy"):
        super().__init__(table, name=name)
        self.seconds = seconds

    def score(self, token_ids, num_logits):
        time.sleep(self.seconds)
        return super().score(token_ids, num_logits)


@pytest.mark.parametrize("wrong_verify", [None, accept_everything])
def test_auto_checks_the_controllers_own_draft_lengths(monkeypatch, wrong_verify):
    """-k auto: the adaptive controller drafts (up to k_max) as it would in use, the
    reference scores the second token in a one-token call; a wrong sampler still fails."""
    if wrong_verify is not None:
        monkeypatch.setattr(rounds_module, "verify", wrong_verify)
    config = CheckConfig(samples=1500, k="auto", k_max=4, sampling=SAMPLING)
    result = check(Sleepy(TARGET, 0.001), ModelDrafter(Sleepy(DRAFT, 0.0001, name="draft"), SAMPLING), PROMPTS, config)
    assert any(p.acceptance_rate is not None for p in result.prompts)  # it drafted
    assert result.passed == (wrong_verify is None)

"""The heart of the paper: speculative samples follow the target distribution.

Each check of the fixed-length samplers (model, windowed, n-gram and autoregressive
drafting; modified rejection sampling, verifier="rejection") draws SAMPLES = 4,000
sequences of L = 4 new tokens from a trigram toy target (vocabulary 6) and tests them
token by token (toy.assert_follows): every token, given the tokens before it, must be a
draw from the target's row for its context; every draw from the same row is pooled,
and a Pearson chi-square over every row (cells expected below 5 pooled) gives an
exact-tail p-value. A check fails when p < toy.ALPHA = 1e-6: a
correct sampler fails one with probability at most 1e-6 over the seeds a run could
draw (the seeds are fixed, so a run is deterministic). The negative controls show
what it catches: wrong acceptance or recovery rules and a bonus token from the wrong
row already at an eighth of this N (CONTROL_SAMPLES = 500, p < 1e-25; a test's power
grows with its sample, so what fails at 500 fails at 4,000), and, at this N, a target
whose token-0 logit is off by 0.4 in every row (token 0's probability scaled by
e^0.4 = 1.49; p ~ 1e-20). Its
limit: a logit off by 0.3 gives p ~ 4e-7 here, one off by 0.2 p ~ 4e-6 even at 8,000
sequences. (The whole-sequence fit used before, at N = 20,000 and p < 1e-3, caught an
offset of 0.2 only just, at p = 2e-4: at this suite's rate of 1e-6 it would not have.)
The coupled verifier has its own checks in test_coupled.py.

The planner's checks further down (-k auto, whose draft lengths follow a fake
clock and each round's outcome) are the same token-by-token test on N = 6,000
sequences, at the same rate; their two wrong draft-length rules must fail it, and do
(a drawn token dropped when the draft was unsure: p ~ 4e-26; a length that depends on
the current round's verdict: p ~ 4e-11). They keep the positive checks' N: at 3,000 the
first lands at p ~ 8e-9 and the second at 0.02, too near the level to show anything.
"""

import pytest
import torch

from specsample.decoding import rounds as rounds_module
from specsample.decoding.drafters import Draft, HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig
from specsample.decoding.sampling import SamplingConfig, logits_to_probs, sample
from specsample.decoding.verify import Verdict, verify
from specsample.policy.make import make_policy
from specsample.policy.estimates import Goodput

from toy import (ALPHA, CostedBackend, DrafterWrapper, FakeClock, TrigramBackend, assert_does_not_follow,
                 assert_follows, empirical, mixed_tables, random_table)

pytestmark = pytest.mark.pure

VOCAB, LENGTH = 6, 4
N = 6_000  # each adaptive check (the planner's), token by token as the fixed-length ones
SAMPLES = 4_000  # each fixed-length check, token by token
# The wrong verify rules' controls: an eighth of SAMPLES, as each still fails far below
# ALPHA there (p < 1e-25, the seeds 0..499 of SAMPLES' own). A check's power only grows
# with its sample, so what fails at 500 fails at the positive checks' 4,000 too.
CONTROL_SAMPLES = 500
PROMPT = [1, 2]
TARGET = random_table(VOCAB, seed=0)
DRAFTS = {
    "close": TARGET + 0.3 * random_table(VOCAB, seed=1, scale=1.0),  # high acceptance
    "far": random_table(VOCAB, seed=2),  # unrelated: frequent rejections
}


def fixed(drafter, sampling, k, target=None, verifier="rejection", n=SAMPLES):
    """n outputs of `target` (the toy target unless given) by modified rejection
    sampling (or `verifier`), `drafter` drafting K = k."""
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier=verifier)
    return empirical(n, target or TrigramBackend(TARGET), PROMPT, config, drafter, k)


def model_drafter(kind, sampling):
    return ModelDrafter(TrigramBackend(DRAFTS[kind], name=kind), sampling)


SETTINGS = [
    # draft, K, temperature, top_k, top_p
    ("close", 1, 1.0, 0, 1.0),
    ("close", 3, 1.0, 0, 1.0),
    ("far", 2, 1.0, 0, 1.0),
    ("far", 4, 0.7, 0, 1.0),
    ("close", 2, 1.3, 3, 1.0),
    ("far", 3, 1.0, 0, 0.8),
    ("close", 4, 0.8, 4, 0.9),
]


@pytest.mark.parametrize("kind,k,temperature,top_k,top_p", SETTINGS)
def test_model_drafter_preserves_target_distribution(kind, k, temperature, top_k, top_p):
    sampling = SamplingConfig(temperature, top_k, top_p)
    assert_follows(fixed(model_drafter(kind, sampling), sampling, k), TrigramBackend(TARGET), PROMPT, sampling)


@pytest.mark.parametrize("k,temperature", [(1, 1.0), (2, 0.7)])
def test_windowed_model_drafter_preserves_target_distribution(k, temperature):
    # Window 1 after a head of 1: from the second round on the trigram draft sees
    # (first prompt token, last token) instead of the last two, so its proposals
    # change; what is emitted must not. K stays below the answer's length so that a
    # second round comes (at K = 3 one round emitted all of it, and the check repeated
    # the unwindowed drafter's to the count).
    sampling = SamplingConfig(temperature)
    windowed = ModelDrafter(TrigramBackend(DRAFTS["close"], name="close"), sampling, window=1, head=1)
    assert_follows(fixed(windowed, sampling, k), TrigramBackend(TARGET), PROMPT, sampling)


@pytest.mark.parametrize("k,top_p", [(2, 1.0), (3, 0.9)])
def test_ngram_drafter_preserves_target_distribution(k, top_p):
    sampling = SamplingConfig(1.0, 0, top_p)
    assert_follows(fixed(NgramDrafter(max_ngram=2), sampling, k), TrigramBackend(TARGET), PROMPT, sampling)


def test_autoregressive_preserves_target_distribution():
    sampling = SamplingConfig(0.9, 0, 0.95)
    assert_follows(fixed(None, sampling, 1), TrigramBackend(TARGET), PROMPT, sampling)


def accept_everything(draft_tokens, draft_probs, target_probs, generator):
    bonus = torch.multinomial(target_probs[-1], 1, generator=generator)
    return Verdict(draft_tokens.tolist() + bonus.tolist(), len(draft_tokens))


def recover_from_target(draft_tokens, draft_probs, target_probs, generator):
    """Right acceptance rule, but resamples from the target instead of the residual."""
    verdict = verify(draft_tokens, draft_probs, target_probs, generator)
    n = verdict.num_accepted
    if n == len(draft_tokens):
        return verdict
    recovered = torch.multinomial(target_probs[n], 1, generator=generator)
    return Verdict(verdict.tokens[:n] + recovered.tolist(), n)


@pytest.mark.parametrize("wrong_verify", [accept_everything, recover_from_target])
def test_negative_control_wrong_sampler_fails_the_check(monkeypatch, wrong_verify):
    """At CONTROL_SAMPLES = 500: p = 0 (below the smallest float) accepting everything,
    p ~ 3e-26 recovering from the target (2e-225 at SAMPLES)."""
    monkeypatch.setattr(rounds_module, "verify", wrong_verify)
    sampling = SamplingConfig()
    counts = fixed(model_drafter("far", sampling), sampling, 2, n=CONTROL_SAMPLES)
    p = assert_does_not_follow(counts, TrigramBackend(TARGET), PROMPT, sampling)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


def bonus_from_the_last_drafts_row(draft_tokens, draft_probs, target_probs, generator):
    """Wrong, and only sometimes: after a full accept, the bonus token is drawn from the
    row of the last draft (the target after K - 1 drafts) instead of the row after all K."""
    verdict = verify(draft_tokens, draft_probs, target_probs, generator)
    k = len(draft_tokens)
    if k == 0 or verdict.num_accepted < k:
        return verdict
    return Verdict(verdict.tokens[:-1] + sample(target_probs[k - 1 : k], generator).tolist(), k)


@pytest.mark.parametrize("kind", ["close", "far"])
def test_negative_control_a_bonus_from_the_wrong_row_fails_the_check(monkeypatch, kind):
    """At CONTROL_SAMPLES = 500: p ~ 9e-101 with the close draft (full accepts are
    common), 5e-30 with the far one (p = 0 for both at SAMPLES)."""
    monkeypatch.setattr(rounds_module, "verify", bonus_from_the_last_drafts_row)
    sampling = SamplingConfig()
    counts = fixed(model_drafter(kind, sampling), sampling, 2, n=CONTROL_SAMPLES)
    p = assert_does_not_follow(counts, TrigramBackend(TARGET), PROMPT, sampling)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


class OffByALogit(TrigramBackend):
    """The target as a wrong engine scores it: token 0's logit off by `offset` in every
    row (its probability scaled by e^offset, then renormalised)."""

    def __init__(self, table, offset: float):
        super().__init__(table)
        self.offset = offset

    def next_logits(self, context):
        logits = super().next_logits(context).clone()
        logits[0] += self.offset
        return logits


OFFSET = 0.4  # the smallest logit error the check is shown to catch at SAMPLES (module docstring)


def test_negative_control_the_smallest_error_the_check_is_shown_to_detect():
    """A correct sampler on a target whose logits are slightly off: the samples follow
    that target exactly (and pass its check), but not the true one: token 0's
    probability scaled by e^OFFSET in every row, a change of up to 10% of the
    probability mass of a row (at p0 = 0.45)."""
    sampling = SamplingConfig()
    off = OffByALogit(TARGET, OFFSET)
    counts = fixed(model_drafter("far", sampling), sampling, 2, target=off)
    assert_follows(counts, off, PROMPT, sampling)  # it is exact for the target it was given
    assert_does_not_follow(counts, TrigramBackend(TARGET), PROMPT, sampling)


# --- The adaptive policy (control.py) and the hybrid drafter -----------------
#
# A target and draft that agree on easy contexts only (toy.mixed_tables), with costs
# on a fake clock that make drafting pay when the draft is right and not when it is
# wrong: the planner changes the draft length, down to plain steps, within
# sequences and across them. Its state carries over from one sequence to the next,
# so later choices depend on earlier outcomes, as in real use.

MIXED_TARGET, MIXED_DRAFT = mixed_tables(VOCAB, seed=3)
# The target's own greedy text from [1, 4], then [1, 4] again: lookups find earlier
# matches (and are right on easy contexts), and the prompt ends on a hard context.
MIXED_PROMPT = [1, 4, 3, 2, 5, 3, 1, 2, 1, 4]


def adaptive(kind, sampling, wrap=None):
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(MIXED_TARGET), clock, lambda m: 1.0 + 0.1 * (m - 1))
    draft = CostedBackend(TrigramBackend(MIXED_DRAFT), clock, lambda m: 0.3 + 0.02 * (m - 1))
    model = ModelDrafter(draft, sampling)
    model.clock = clock
    drafter = model if kind == "model" else HybridDrafter(model, NgramDrafter(max_ngram=2))
    if wrap is not None:
        drafter = wrap(drafter)
    policy = make_policy("auto", 4, target, draft, context=MIXED_PROMPT, clock=clock)
    stats = []
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, verifier="rejection")
    counts = empirical(N, target, MIXED_PROMPT, config, drafter, policy, clock=clock, stats=stats)
    lengths, switched, sources = {}, 0, {}
    for s in stats:
        histogram = s.draft_length_histogram
        for m, c in enumerate(histogram):
            lengths[m] = lengths.get(m, 0) + c
        switched += bool(histogram and histogram[0] and sum(histogram[1:]))
        for source, (rounds, _, _) in s.sources.items():
            sources[source[:5]] = sources.get(source[:5], 0) + rounds
    return counts, lengths, switched, sources


@pytest.mark.parametrize("kind,temperature,top_k,top_p", [
    ("model", 1.0, 0, 1.0),
    ("hybrid", 1.0, 0, 1.0),
    ("hybrid", 0.8, 4, 0.9),
])
def test_adaptive_policy_preserves_target_distribution(kind, temperature, top_k, top_p):
    sampling = SamplingConfig(temperature, top_k, top_p)
    counts, lengths, switched, sources = adaptive(kind, sampling)
    # The planner really did switch: plain steps, several draft lengths, and
    # sequences that mix both.
    assert lengths.get(0, 0) > N // 20
    assert sum(1 for m, c in lengths.items() if m > 0 and c > N // 1000) >= 2
    assert switched > N // 20
    if kind == "hybrid":  # both sources drafted (the lookup rarely: the prompt's own match would come at the
        # first token, which is a free plain step, Offer.free; in the answer its 5 tokens leave few matches)
        assert sources.get("ngram", 0) > 0 and sources.get("model", 0) > N // 1000
    assert_follows(counts, TrigramBackend(MIXED_TARGET), MIXED_PROMPT, sampling)


class _Truncating(DrafterWrapper):
    """Test-only drafter wrapper that cuts each draft where `cut_at` says."""

    def __init__(self, inner, cut_at):
        super().__init__(inner, f"wrong({inner.name})")
        self.cut_at = cut_at

    def draft(self, context, plan, sampler, grammar=None):
        d = self.inner.draft(context, plan, sampler, grammar)
        keep = self.cut_at(context, d)
        return Draft(d.tokens[:keep], None if d.probs is None else d.probs[:keep], d.sources[:keep],
                     d.confidences[:keep], d.calls)


def drops_unlikely_drawn_tokens(drafter):
    """Wrong: a drawn draft token the draft itself gave < 0.3 is dropped, which makes
    the real proposal q restricted to confident tokens while verification divides by
    the full q."""

    def cut_at(context, d):
        keep = 0
        while keep < len(d) and d.probs is not None and d.probs[keep, d.tokens[keep]] >= 0.3:
            keep += 1
        return keep

    return _Truncating(drafter, cut_at)


def peeks_at_the_verdict(drafter, sampling):
    """Wrong: the draft stops before a token that the target would reject (an
    accept/reject draw made ahead of verification): the draft length depends on the
    current round's verdict."""
    rng = torch.Generator().manual_seed(99)

    def cut_at(context, d):
        ctx = list(context)
        for i in range(len(d)):
            token = int(d.tokens[i])
            target = logits_to_probs(TrigramBackend(MIXED_TARGET).next_logits(ctx)[None], sampling)[0]
            draft = 1.0 if d.probs is None else float(d.probs[i, token])
            if float(torch.rand(1, generator=rng)) * draft >= float(target[token]):
                return i
            ctx.append(token)
        return len(d)

    return _Truncating(drafter, cut_at)


@pytest.mark.parametrize("wrong", ["drop-unlikely", "peek-verdict"])
def test_negative_control_wrong_draft_length_rules_fail_the_check(monkeypatch, wrong):
    # The goodput guard is off: a drafter that throws drafts away realises less and
    # would be barred from drafting, hiding the bias this control must show.
    monkeypatch.setattr(Goodput, "barred", lambda self, size, kind: False)
    monkeypatch.setattr(Goodput, "probe", lambda self, size: False)
    sampling = SamplingConfig(1.0)
    wrap = drops_unlikely_drawn_tokens if wrong == "drop-unlikely" else lambda d: peeks_at_the_verdict(d, sampling)
    counts, _, _, _ = adaptive("hybrid", sampling, wrap=wrap)
    assert_does_not_follow(counts, TrigramBackend(MIXED_TARGET), MIXED_PROMPT, sampling)

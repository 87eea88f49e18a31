"""Structured output under speculation (constraints.py): the grammar state, and
constrained speculative sampling against the exact constrained target.

The toy language is the regex <(a|b)*c=> over the tokens a, b, ab, <, >, =, c (and
an end-of-sequence token): "<" is forced at the start, then the model chooses among
a, b, ab and c, and after c the grammar forces "=" and ">" and is complete. Its
viable prefixes are written out by hand (PREFIX), so the exact distribution is
enumerated without the grammar engine: at each step the target's logits are masked
to the tokens that keep the text a viable prefix, then the sampling controls apply.

The distribution checks follow test_distribution.py, smaller: N = 5,000 outputs of
up to LENGTH = 5 tokens (121 possible outputs), Pearson chi-square against the exact
distribution (cells with expected count < 5 pooled), failing when p < toy.ALPHA = 1e-6.
An output that breaks the grammar (the loop refuses it) is a sample outside the exact
support: p = 0, and the run stops there. The negative controls draw CONTROL_N = 625, an
eighth of N, and still fail with p < 1e-12: two break the grammar at the first output
(p = 0), the third fits at p ~ 3e-51 (p = 0 at N; 1e-15 at 312). A test's power grows
with its sample, so what fails at 625 fails at 5,000.
"""

import re

import pytest
import torch

from specsample.decoding import drafters as drafters_module
from specsample.decoding import rounds as rounds_module
from specsample.decoding.drafters import Draft, HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.plans import FORCED, MODEL
from specsample.decoding.sampling import SamplingConfig, logits_to_probs
from specsample.decoding.verify import Verdict
from specsample.output.constraints import Constraint, ConstraintError, constrained_logits, start
from specsample.policy.make import make_policy
from specsample.policy.control import Planner

from toy import (CostedBackend, DrafterWrapper, FakeClock, PieceTokenizer, TrigramBackend, byte_backend,
                 assert_fits, assert_misfits, empirical, exact_constrained_distribution, random_table)

pytestmark = pytest.mark.pure


PIECES = [b"a", b"b", b"ab", b"<", b">", b"=", b"c", b"<eos>"]
A, B, AB, LT, GT, EQ, C, EOS = range(8)
TOKENIZER = PieceTokenizer(PIECES, EOS)
REGEX = "<(a|b)*c=>"
PREFIX = re.compile("(<((a|b)*(c(=>?)?)?)?)?")  # every prefix of a word of REGEX
CONSTRAINT = Constraint.regex(REGEX)

N, LENGTH = 5_000, 5
CONTROL_N = 625  # each negative control
PROMPT = [A, B]
TARGET = random_table(len(PIECES), seed=10)
DRAFTS = {
    "close": TARGET + 0.3 * random_table(len(PIECES), seed=11, scale=1.0),
    "far": random_table(len(PIECES), seed=12),
}


def text_of(tokens) -> str:
    return b"".join(PIECES[t] for t in tokens).decode()


def allowed_after(tokens) -> set[int]:
    """The oracle: tokens that keep the output a viable prefix; none once complete."""
    text = text_of(tokens)
    if re.fullmatch(REGEX, text):
        return set()
    return {t for t in range(EOS) if PREFIX.fullmatch(text + PIECES[t].decode())}


def backend(table, name="toy"):
    b = TrigramBackend(table, name=name)
    b.tokenizer, b.eos_token_ids = TOKENIZER, frozenset({EOS})
    return b


def state(max_new_tokens=100):
    return start(CONSTRAINT, backend(TARGET), max_new_tokens)


def allowed_set(s) -> set[int]:
    row = s.allowed()
    return {row} if isinstance(row, int) else set(torch.nonzero(row).flatten().tolist())


# ---- the grammar state ---------------------------------------------------------------

def test_masks_and_forced_tokens_follow_the_grammar_on_random_walks():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        s, tokens = state(), []
        while not s.done:
            assert allowed_set(s) == allowed_after(tokens)
            choices = sorted(allowed_after(tokens))
            forced = s.forced()
            assert bool(forced) == (len(choices) == 1)  # this vocabulary has one token per forced byte
            token = choices[int(torch.randint(len(choices), (1,), generator=g))]
            assert s.accepts(token) and not any(s.accepts(t) for t in range(len(PIECES)) if t not in choices)
            assert s.advance(token) == bool(forced)
            tokens.append(token)
        assert re.fullmatch(REGEX, text_of(tokens)) and allowed_after(tokens) == set()


def test_forced_tokens_run_to_the_end_of_the_forced_text_within_the_budget():
    s = state()
    assert s.forced() == (LT,)
    s.advance(LT)
    assert s.forced() == ()
    s.advance(C)
    assert s.forced() == (EQ, GT) and s.allowed() == EQ
    assert state(max_new_tokens=3).forced() == (LT,)
    short = state(max_new_tokens=3)  # budget 2: forced text may fill positions 0 and 1
    short.advance(LT)
    short.advance(C)
    assert short.forced() == ()


def test_rollback_after_a_rejection_restores_masks_and_forced_tokens():
    s = state()
    for t in (LT, A, C, EQ):  # a draft that went on into the forced text
        s.advance(t)
    assert s.forced() == (GT,)
    s.rollback(3)  # rejected at A: back to just after "<"
    assert s.length == 1 and s.forced() == () and allowed_set(s) == allowed_after([LT])
    s.advance(B)  # the recovered token
    assert allowed_set(s) == allowed_after([LT, B])
    s.advance(C)
    assert s.forced() == (EQ, GT)
    s.rollback(1)
    s.advance(C)  # the same token again: its cached position comes back
    assert s.forced() == (EQ, GT)
    with pytest.raises(ConstraintError):
        s.rollback(5)


def test_forbidden_tokens_are_refused_and_lookups_are_cut_where_the_grammar_forbids():
    s = state()
    with pytest.raises(ConstraintError):
        s.advance(A)  # "<" is forced first
    assert s.accepted_prefix([LT, A, AB, GT, B]) == [LT, A, AB]
    assert s.length == 0
    rows = s.rows_allowed([LT, C, EQ])
    assert rows[0] == LT and rows[2] == EQ and rows[3] == GT
    assert set(torch.nonzero(rows[1]).flatten().tolist()) == allowed_after([LT])


@pytest.mark.parametrize("kind,source", [
    ("json_schema", '{"type": "objec"}'),
    ("json_schema", "{not json"),
    ("json_schema", "[1, 2]"),
    ("regex", "(ab"),
    ("grammar", "start: foo"),
    ("grammar", "start: ("),
    ("yaml", "a: b"),
])
def test_a_bad_schema_regex_or_grammar_is_one_line_error(kind, source):
    with pytest.raises(ConstraintError) as e:
        Constraint(kind, source)
    assert "\n" not in str(e.value) and str(e.value)


def test_rows_become_masked_renormalised_probabilities_and_forced_rows_one_hot():
    logits = torch.randn(2, len(PIECES))
    mask = torch.zeros(len(PIECES), dtype=torch.bool)
    mask[[A, C]] = True
    probs = logits_to_probs(constrained_logits(logits, [mask, GT]), SamplingConfig(0.7))
    expected = torch.softmax(logits[0, [A, C]] / 0.7, -1)
    assert torch.allclose(probs[0, [A, C]], expected) and probs[0].sum() == pytest.approx(1.0)
    assert probs[1].tolist() == [1.0 if t == GT else 0.0 for t in range(len(PIECES))]


# ---- constrained generation ------------------------------------------------------------

def config(sampling=SamplingConfig(), max_new_tokens=LENGTH, verifier="rejection"):
    # Modified rejection sampling, whose draft rows the negative controls below corrupt;
    # the coupled verifier has its own positive case.
    return GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, constraint=CONSTRAINT,
                            verifier=verifier)


def TARGET_COST(m):  # seconds of a target call scoring m tokens, on the adaptive policy's fake clock
    return 1.0 + 0.1 * (m - 1)


def constrained(drafter, sampling, policy, clock=None, verifier="rejection", n=N):
    """n constrained outputs of the target (its calls timed on `clock` where given);
    `policy`: a Policy, or K. An output the grammar forbids fails the check."""
    target = backend(TARGET) if clock is None else CostedBackend(backend(TARGET), clock, TARGET_COST)
    return empirical(n, target, PROMPT, config(sampling, verifier=verifier), drafter, policy, clock=clock,
                     refused=(ConstraintError,))


def exact(sampling):
    return exact_constrained_distribution(backend(TARGET), PROMPT, LENGTH, sampling, allowed_after)


def model_drafter(kind, sampling):
    return ModelDrafter(backend(DRAFTS[kind], name=kind), sampling)


@pytest.mark.parametrize("kind,k,temperature,top_p", [
    ("far", 3, 1.0, 1.0),
    ("close", 2, 0.8, 0.9),
])
def test_constrained_speculative_sampling_follows_the_masked_target(kind, k, temperature, top_p):
    sampling = SamplingConfig(temperature, 0, top_p)
    counts = constrained(model_drafter(kind, sampling), sampling, k)
    assert_fits(counts, exact(sampling), N)


def test_constrained_coupled_sampling_follows_the_masked_target():
    """The coupled verifier draws each token by a race over the masked target row, and
    the draft model races over its own masked row with the same noise."""
    sampling = SamplingConfig(0.9)
    counts = constrained(model_drafter("close", sampling), sampling, 3, verifier="coupled")
    assert_fits(counts, exact(sampling), N)


def test_constrained_lookup_and_adaptive_policy_follow_the_masked_target():
    sampling = SamplingConfig(1.0)
    clock = FakeClock()
    draft = CostedBackend(backend(DRAFTS["close"], name="close"), clock, lambda m: 0.3)
    model = ModelDrafter(draft, sampling)
    model.clock = clock
    drafter = HybridDrafter(model, NgramDrafter(max_ngram=2))
    timed_target = CostedBackend(backend(TARGET), clock, TARGET_COST)  # as constrained() times it
    policy = make_policy("auto", 4, timed_target, draft, context=PROMPT, clock=clock)
    counts = constrained(drafter, sampling, policy, clock=clock)
    assert_fits(counts, exact(sampling), N)


def test_constrained_autoregressive_follows_the_masked_target():
    sampling = SamplingConfig(0.9)
    counts = constrained(None, sampling, 1)
    assert_fits(counts, exact(sampling), N)


class Unconstrained(DrafterWrapper):
    """Drafts from the draft model without the grammar (verified against the rows they
    were drawn from)."""

    def __init__(self, inner):
        super().__init__(inner, f"unconstrained({inner.name})")

    def offer(self, context, k, grammar=None):
        return self.inner.offer(context, k)

    def draft(self, context, plan, sampler, grammar=None):
        return self.inner.draft(context, plan, sampler)


def test_the_mask_on_the_target_alone_is_exact_and_the_drafts_mask_is_for_acceptance():
    """Verification compares the constrained target with whatever each draft was drawn
    from: a draft the grammar forbids is always rejected. So masking the target's rows
    alone is exact; the draft's mask only saves rejected drafts."""
    sampling = SamplingConfig(1.0)
    counts = constrained(Unconstrained(model_drafter("far", sampling)), sampling, 3)
    assert_fits(counts, exact(sampling), N)


def mask_target_rows_not(monkeypatch):
    """Wrong: the target's rows are not masked (the mask on the draft only)."""
    monkeypatch.setattr(rounds_module, "constrained_logits", lambda logits, allowed: logits)


def verify_against_unmasked_draft_rows(monkeypatch):
    """Wrong: drafts are drawn from the masked draft row, but verification is given
    the row before the mask (the mask applied to the sampler, not to the stored probs)."""
    original = ModelDrafter.draft

    def draft(self, context, plan, generator, grammar=None):
        d = original(self, context, plan, generator, grammar)
        if not len(d):
            return d
        rows, ctx = [], list(context)
        for i, token in enumerate(d.tokens.tolist()):
            row = logits_to_probs(self.backend.next_logits(ctx)[None], self.sampling)[0]
            rows.append(row if d.sources[i] == MODEL else d.probs[i])
            ctx.append(token)
        return Draft(d.tokens, torch.stack(rows), d.sources, d.confidences, d.calls)

    monkeypatch.setattr(ModelDrafter, "draft", draft)


def forced_tokens_from_the_unmasked_draft(monkeypatch, trusted=True):
    """Wrong: where the grammar forces text, the draft model's own unmasked choice is
    put in the draft as the forced token, and forced drafts are trusted (accepted
    without verification). With `trusted=False` they go through verification like any
    draft, which makes even this wrong source exact (the next test)."""
    original = drafters_module.draft_round
    last_sources = []

    def draft_round(drafter, context, k, generator, plan, grammar=None, free=False):
        d = original(drafter, context, k, generator, plan, grammar, free)
        tokens, ctx = d.tokens.clone(), list(context)
        for i, source in enumerate(d.sources):
            if source == FORCED:
                row = logits_to_probs(drafter.backend.next_logits(ctx)[None], SamplingConfig())[0]
                tokens[i] = int(torch.multinomial(row, 1, generator=generator.generator))
            ctx.append(int(tokens[i]))
        last_sources[:] = d.sources
        probs = None if d.probs is None else d.probs.clone()
        if probs is not None:  # forced rows are one-hot at the token proposed
            for i, source in enumerate(d.sources):
                if source == FORCED:
                    probs[i] = torch.nn.functional.one_hot(tokens[i], probs.shape[-1]).float()
        return Draft(tokens, probs, d.sources, d.confidences, d.calls)

    def verify(draft_tokens, draft_probs, target_probs, generator):
        verdict = rounds_module_verify(draft_tokens, draft_probs, target_probs, generator)
        n = verdict.num_accepted
        if not trusted or n == len(draft_tokens) or last_sources[n] != FORCED:
            return verdict
        # a "forced" draft is taken as it is, and verification resumes after it
        rest = rounds_module_verify(draft_tokens[n + 1 :], None if draft_probs is None else draft_probs[n + 1 :],
                                      target_probs[n + 1 :], generator)
        return Verdict(draft_tokens[: n + 1].tolist() + rest.tokens, n + 1 + rest.num_accepted)

    rounds_module_verify = rounds_module.verify
    monkeypatch.setattr(rounds_module, "draft_round", draft_round)
    monkeypatch.setattr(rounds_module, "verify", verify)


def test_forced_drafts_are_verified_so_a_wrong_forced_source_stays_exact(monkeypatch):
    forced_tokens_from_the_unmasked_draft(monkeypatch, trusted=False)
    sampling = SamplingConfig(1.0)
    counts = constrained(model_drafter("far", sampling), sampling, 3)
    assert_fits(counts, exact(sampling), N)


@pytest.mark.parametrize("wrong", [mask_target_rows_not, verify_against_unmasked_draft_rows,
                                   forced_tokens_from_the_unmasked_draft])
def test_negative_control_wrong_constrained_samplers_fail_the_check(monkeypatch, wrong):
    wrong(monkeypatch)
    sampling = SamplingConfig(1.0)
    counts = constrained(model_drafter("far", sampling), sampling, 3, n=CONTROL_N)
    p = assert_misfits(counts, exact(sampling), CONTROL_N)
    assert p < 1e-12  # the margin this module states, far below ALPHA


# ---- greedy identity, forced tokens for free, the end of the grammar -------------------

GREEDY = SamplingConfig(0.0)


@pytest.mark.parametrize("drafter", ["far", "close", "ngram", "hybrid-auto"])
def test_greedy_constrained_speculative_equals_greedy_constrained_autoregressive(drafter):
    for prompt in ([A, B], [C, A], [B, B, A], [AB, C]):
        reference = generate(backend(TARGET), prompt, config(GREEDY, max_new_tokens=12))
        if drafter == "ngram":
            d, policy = NgramDrafter(max_ngram=2), 3
        elif drafter == "hybrid-auto":
            d, policy = HybridDrafter(model_drafter("close", GREEDY)), Planner(4).seat()
        else:
            d, policy = model_drafter(drafter, GREEDY), 3
        result = generate(backend(TARGET), prompt, config(GREEDY, max_new_tokens=12), d, policy)
        assert result.token_ids == reference.token_ids and result.stop_reason == reference.stop_reason
        assert result.stats.forced_tokens == reference.stats.forced_tokens


def test_forced_tokens_are_drafted_free_accepted_and_end_the_output_with_the_grammar():
    close = model_drafter("close", GREEDY)
    plain = generate(backend(TARGET), PROMPT, config(GREEDY, max_new_tokens=40))
    result = generate(backend(TARGET), PROMPT, config(GREEDY, max_new_tokens=40), close, 3)
    assert result.stop_reason == plain.stop_reason == "grammar"  # complete: no end-of-sequence token needed
    assert re.fullmatch(REGEX, result.text) and EOS not in result.token_ids
    rounds, drafted, accepted = result.stats.sources["forced"]
    assert accepted == result.stats.forced_tokens == 3  # "<", then "=" and ">"
    assert drafted >= accepted  # also forced text after a draft that was then rejected
    # The plain loop spends a target call on each forced token; speculation none.
    assert plain.stats.target_calls == len(plain.token_ids) - 1
    assert result.stats.target_calls < plain.stats.target_calls


def test_an_empty_constrained_answer_needs_no_target_call():
    result = generate(backend(TARGET), PROMPT, GenerationConfig(max_new_tokens=5, constraint=Constraint.regex("")))
    assert result.token_ids == [] and result.stop_reason == "grammar" and result.stats.target_calls == 0


def test_a_draft_with_no_mass_on_allowed_tokens_drafts_nothing_there():
    """A draft that scores part of the vocabulary (FR-Spec) may give every allowed
    token -inf: it ends its round there instead of drawing from a NaN row."""
    table = DRAFTS["close"].clone()
    table[..., [A, B, AB, C]] = float("-inf")  # only "<", ">", "=" and EOS
    reference = generate(backend(TARGET), PROMPT, config(GREEDY, max_new_tokens=12))
    result = generate(backend(TARGET), PROMPT, config(GREEDY, max_new_tokens=12),
                      ModelDrafter(backend(table, "partial"), GREEDY), 3)
    assert result.token_ids == reference.token_ids
    assert "model" not in result.stats.sources and result.stats.sources["forced"][2] == 3


def test_the_planner_counts_forced_tokens_as_a_source_of_their_own():
    policy = Planner(4).seat()
    drafter = HybridDrafter(model_drafter("close", GREEDY))
    generate(backend(TARGET), PROMPT, config(GREEDY, max_new_tokens=20), drafter, policy)
    assert policy.acceptance.sources[FORCED].at(0).value == 1.0 and policy.acceptance.sources[FORCED].at(0).trials > 0


# ---- JSON schema validity on many samples -------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 4},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "maxItems": 2},
    },
    "required": ["id", "tag", "ok", "name"],
    "additionalProperties": False,
}
@pytest.mark.parametrize("mode", ["autoregressive", "speculative"])
def test_every_sampled_output_is_json_that_validates_against_the_schema(mode):
    import json

    import jsonschema

    target = byte_backend(0)
    sampling = SamplingConfig(1.0)
    drafter = ModelDrafter(byte_backend(1, "draft"), sampling) if mode == "speculative" else None
    forced = total = 0
    for seed in range(100):
        cfg = GenerationConfig(max_new_tokens=120, sampling=sampling, seed=seed,
                               constraint=Constraint.json_schema(SCHEMA))
        result = generate(target, target.tokenizer.encode("user: "), cfg, drafter, 4)
        assert result.stop_reason == "grammar", result.text
        jsonschema.validate(json.loads(result.text), SCHEMA)
        forced, total = forced + result.stats.forced_tokens, total + len(result.token_ids)
    assert forced > total // 4  # braces, keys, quotes and separators


def test_greedy_json_speculation_equals_autoregressive_where_forced_text_has_many_tokenizations():
    target = byte_backend(2)
    constraint = Constraint.json_schema(SCHEMA)
    prompt = target.tokenizer.encode("x")
    settings = dict(max_new_tokens=120, sampling=GREEDY, constraint=constraint)
    reference = generate(target, prompt, GenerationConfig(**settings))
    for drafter in (ModelDrafter(byte_backend(2, "same"), GREEDY), ModelDrafter(byte_backend(3, "other"), GREEDY),
                    HybridDrafter(ModelDrafter(byte_backend(3, "other"), GREEDY))):
        result = generate(target, prompt, GenerationConfig(**settings), drafter, 4)
        assert result.token_ids == reference.token_ids and result.stop_reason == "grammar"

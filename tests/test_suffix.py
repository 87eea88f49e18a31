"""The suffix index (decoding/suffix.py): longest match, the most frequent continuation,
the size bound, the salt partition; the planner's suffix source, scored for free while
another source drafts; and the output, exact with suffix drafts on a toy pair."""

import pytest
import torch

from specsample.decoding import suffix
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.plans import MODEL, FixedK, Offer, RoundReport, lookup_source, suffix_source
from specsample.decoding.sampling import SamplingConfig
from specsample.decoding.suffix import SEPARATOR, Corpus, SuffixDrafter, SuffixIndex, propose
from specsample.policy.make import make_policy
from specsample.policy.estimates import Acceptance, ShadowLookup, kind_of

from toy import CostedBackend, FakeClock, TrigramBackend, assert_follows, empirical, mixed_tables

pytestmark = pytest.mark.pure

A = suffix.ANCHOR  # 4: the shortest match the index proposes from


def corpus(*documents) -> Corpus:
    c = Corpus()
    for d in documents:
        c.extend(d)
        c.close()
    return c


# --- The index ---------------------------------------------------------------


def test_the_longest_match_wins_over_a_more_frequent_shorter_one():
    # [1 2 3 4] is followed by 7 twice, but the text ends in [9 1 2 3 4], which only the
    # last document matches (5 tokens), followed by 8.
    c = corpus([1, 2, 3, 4, 7], [0, 1, 2, 3, 4, 7], [9, 1, 2, 3, 4, 8, 6])
    found = propose([c], [5, 9, 1, 2, 3, 4], 3)
    assert (found.tokens, found.match, found.confidences) == ([8, 6], 5, [1.0, 1.0])
    assert propose([c], [5, 0, 1, 2, 3, 4], 3).tokens == [7]  # matched by 5 in the second


def test_the_most_frequent_continuation_with_its_share_and_the_walk_stops_where_no_majority_is_left():
    c = corpus([1, 2, 3, 4, 7, 5, 0], [1, 2, 3, 4, 7, 5, 1], [1, 2, 3, 4, 8], [1, 2, 3, 4, 7, 5, 2])
    found = propose([c], [1, 2, 3, 4], 5)
    # 7 in three of four; then 5 in all three; then 0, 1, 2: a third each, under MIN_SHARE.
    assert found.tokens == [7, 5] and found.confidences == [0.75, 1.0] and found.match == A


def test_no_match_shorter_than_the_anchor_nor_across_a_document_end():
    c = corpus([1, 2, 3, 4], [5, 6])
    assert propose([c], [1, 2, 3, 4], 3).tokens == []  # the first document ends after it
    assert propose([c], [9, 2, 3, 4], 3).tokens == []  # 3 tokens match: under the anchor
    assert propose([c], [3, 4, 5, 6], 3).tokens == []  # [3 4 | 5 6] spans a separator


def test_the_current_text_drafts_from_itself():
    drafter = SuffixDrafter()  # no index: the prompt and answer alone, as `generate` has them
    offer = drafter.offer([1, 2, 3, 4, 5, 6, 1, 2, 3, 4], 8)
    assert offer.available == {suffix_source(4): 6} and offer.lookups == ((suffix_source(4), (5, 6, 1, 2, 3, 4)),)


def test_the_index_stays_within_its_size_the_oldest_text_going_first():
    size = 3000
    index = SuffixIndex(size)
    for i in range(200):  # 200 documents of 101 tokens, each with a phrase of its own
        index.add([1000 + i, 1, 2, 3] + list(range(10, 107)), salt="a" if i % 2 else None)
        assert index.tokens <= size
    for salt in ("a", None):
        c = index.corpus(salt)
        assert len(c) <= size
        assert len(c._tokens) <= 4 * (size + 1024) and len(c._last) <= 2 * len(c) + 1024  # memory given back
    assert propose([index.corpus("a")], [1199, 1, 2, 3], 1).tokens == [10]  # the newest is there
    assert propose([index.corpus("a")], [1001, 1, 2, 3], 1).tokens == []  # the oldest is gone
    assert index.tokens == sum(len(index.corpus(s)) for s in ("a", None))


def test_a_text_longer_than_the_index_keeps_its_end():
    index = SuffixIndex(50)
    index.add(list(range(100)))
    c = index.corpus(None)
    assert len(c) == 50 and c.following(c.start, 60) == list(range(51, 100))


def test_one_salts_text_never_drafts_for_another():
    index = SuffixIndex(1000)
    answer = [11, 12, 13, 14, 15, 16]
    index.add([1, 2, 3, 4] + answer, salt="tenant-a")
    asked = [7, 1, 2, 3, 4]
    assert SuffixDrafter(index, "tenant-a").offer(asked, 8).available == {suffix_source(4): 6}
    assert SuffixDrafter(index, "tenant-b").offer(asked, 8).available == {}
    assert SuffixDrafter(index, None).offer(asked, 8).available == {}  # unsalted requests are a tenant too
    b = SuffixDrafter(index, "tenant-b")
    b.end([1, 2, 3, 4, 99])  # b's own served text drafts for b alone
    assert b.offer(asked, 8).lookups == ((suffix_source(4), (99,)),)
    assert SuffixDrafter(index, "tenant-a").offer(asked, 8).lookups[0][1] == tuple(answer)


def test_a_finished_generation_joins_the_index_and_a_new_one_starts_afresh():
    index = SuffixIndex(1000)
    drafter = SuffixDrafter(index)
    drafter.offer([1, 2, 3, 4, 5], 4)
    drafter.end([1, 2, 3, 4, 5, 6])
    assert index.tokens == 7 and drafter.offer([9, 2, 3, 4, 5], 4).lookups == ((suffix_source(4), (6,)),)


def test_match_classes_and_kinds():
    assert [str(suffix_source(n)) for n in (4, 7, 8, 31, 64)] == ["suffix4", "suffix4", "suffix8", "suffix16",
                                                                  "suffix32"]
    assert kind_of(suffix_source(8)) == "suffix" and kind_of(lookup_source(2)) == "lookup"
    assert SEPARATOR < 0  # never a token


# --- The planner -------------------------------------------------------------


def test_a_suffix_lookup_is_scored_for_free_while_context_lookup_drafts():
    acceptance, shadow = Acceptance(), ShadowLookup()
    ngram, suffixed = lookup_source(2), suffix_source(8)
    before = acceptance[suffixed].at(0).value, acceptance[ngram].at(0).value
    shadow.offered = ((ngram, (3, 1)), (suffixed, (3, 4, 5)))
    rows = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])  # [emitted, vocab]
    # The round proposed the context lookup: its 3 was accepted, its 1 rejected (4 emitted).
    report = RoundReport([ngram, ngram], [None, None], 1, (3, 4), rows)
    acceptance.observe(report)
    shadow.observe(report, acceptance)
    assert acceptance[suffixed].at(0).value > before[0] and acceptance[suffixed].at(1).value > 0.8
    assert shadow.followed == {"suffix": (suffixed, (3, 4, 5), 2)}  # still followed, at its third token
    assert "lookup" not in shadow.followed  # Acceptance.observe scored it, as proposed


def test_the_hybrid_offers_every_source_and_drafts_from_the_one_planned():
    model = ModelDrafter(TrigramBackend(mixed_tables(6)[1], name="draft"), SamplingConfig())
    index = SuffixIndex(100)
    index.add([5, 1, 2, 3, 4, 0, 0, 1])
    hybrid = HybridDrafter(model, NgramDrafter(max_ngram=2), SuffixDrafter(index))
    context = [3, 4, 1, 2, 3, 4]
    offer = hybrid.offer(context, 4)
    assert offer.available.keys() == {lookup_source(2), suffix_source(4), MODEL}
    assert [s.kind for s, _ in offer.lookups] == ["suffix", "lookup"]
    draft = hybrid.draft(context, FixedK(3).plan(Offer({suffix_source(4): 3})), None)
    assert draft.tokens.tolist() == [0, 0, 1] and draft.confidences == [1.0, 1.0, 1.0]
    assert hybrid.name == "hybrid(suffix, ngram(n=1..2), draft)"


# --- Exactness ---------------------------------------------------------------

VOCAB = 6
TARGET, DRAFT = mixed_tables(VOCAB, seed=3)
PROMPT = [1, 4, 3, 2, 5, 3, 1, 2, 1, 4]


def costed_hybrid(sampling, index):
    """The toy pair on a fake clock (as test_distribution's adaptive checks), drafting
    from the model, context lookup and `index`, under -k auto."""
    clock = FakeClock()
    target = CostedBackend(TrigramBackend(TARGET), clock, lambda m: 1.0 + 0.1 * (m - 1))
    draft = CostedBackend(TrigramBackend(DRAFT), clock, lambda m: 0.3 + 0.02 * (m - 1))
    model = ModelDrafter(draft, sampling)
    model.clock = clock
    drafter = HybridDrafter(model, NgramDrafter(max_ngram=2), SuffixDrafter(index))
    return target, drafter, make_policy("auto", 4, target, draft, context=PROMPT, clock=clock), clock


def suffix_accepted(stats) -> int:
    return sum(accepted for source, (_, _, accepted) in stats.sources.items() if source.startswith("suffix"))


@pytest.mark.parametrize("policy", [4, "auto"])
def test_greedy_output_with_suffix_drafts_is_the_targets_and_the_second_request_drafts_from_the_first(policy):
    config = GenerationConfig(max_new_tokens=40, sampling=SamplingConfig(0.0), verifier="rejection")
    expected = generate(TrigramBackend(TARGET), PROMPT, config).token_ids
    index = SuffixIndex(10_000)
    target, drafter, auto, clock = costed_hybrid(config.sampling, index)
    first = generate(target, PROMPT, config, drafter, auto if policy == "auto" else policy, clock)
    second = generate(target, PROMPT, config, drafter, auto if policy == "auto" else policy, clock)
    assert first.token_ids == second.token_ids == expected
    assert suffix_accepted(second.stats) > suffix_accepted(first.stats)


def test_sampled_output_with_suffix_drafts_follows_the_target_token_by_token():
    # Each output joins the index, so later samples draft from earlier ones, as a
    # server's requests do; -k auto chooses among the model, lookup and suffix drafts.
    sampling = SamplingConfig(1.0)
    index = SuffixIndex(4_000)
    target, drafter, policy, clock = costed_hybrid(sampling, index)
    stats = []
    config = GenerationConfig(max_new_tokens=6, sampling=sampling, verifier="rejection")
    counts = empirical(1_500, target, PROMPT, config, drafter, policy, clock=clock, stats=stats)
    assert sum(suffix_accepted(s) for s in stats) > 100  # the suffix source was played, and paid
    assert_follows(counts, TrigramBackend(TARGET), PROMPT, sampling)

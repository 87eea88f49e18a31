import pytest
import torch

from specsample.decoding.drafters import ModelDrafter, NgramDrafter, draft_round
from specsample.decoding.generate import GenerationConfig, generate, stream
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import SamplingConfig, logits_to_probs

from tiny_hf import tiny_backend, tiny_model
from specsample.backends.base import BackendError
from specsample.backends.hf import HFBackend
from toy import ByteTokenizer, PoisonedBackend, ScriptedBackend, TrigramBackend, random_table

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0)
PROMPT = [5, 17, 3, 60, 42, 8, 11, 5, 17]


def greedy(max_new_tokens=40, **kw):
    return GenerationConfig(max_new_tokens=max_new_tokens, sampling=GREEDY, **kw)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("draft_seed", [0, 7], ids=["same-weights", "other-model"])
def test_greedy_speculative_equals_greedy_autoregressive_hf(k, draft_seed):
    target = tiny_backend(0)
    reference = generate(target, PROMPT, greedy()).token_ids
    drafter = ModelDrafter(tiny_backend(draft_seed), GREEDY)
    result = generate(target, PROMPT, greedy(), drafter, k)
    assert result.token_ids == reference
    if draft_seed == 0:  # identical draft: every draft accepted, bonus every round
        assert result.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_ngram_equals_greedy_autoregressive(k):
    target = tiny_backend(3)
    reference = generate(target, PROMPT, greedy(max_new_tokens=60)).token_ids
    result = generate(target, PROMPT, greedy(max_new_tokens=60), NgramDrafter(max_ngram=3), k)
    assert result.token_ids == reference
    assert result.stats.draft_calls == 0


def test_draft_probabilities_are_the_ones_each_draft_was_drawn_from():
    """Guards the drafter's cache sync, including the off-by-one after a full accept:
    every draft row must equal the draft model's distribution given the true context."""
    table = random_table(6, seed=0)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9)
    reference = TrigramBackend(table)
    drafter = ModelDrafter(TrigramBackend(table + 0.01), sampling)  # near-copy: long accepts
    seen = []

    class Spy:
        name, calls, model_backend = "spy", 0, None

        def offer(self, context, k, grammar=None):
            return drafter.offer(context, k)

        def accept(self, num_accepted):
            drafter.accept(num_accepted)

        def draft(self, context, plan, generator, grammar=None):
            draft = drafter.draft(context, plan, generator)
            tokens, probs = draft.tokens, draft.probs
            self.calls = drafter.calls
            for i in range(len(tokens)):
                expected = logits_to_probs(drafter.backend.next_logits(context + tokens[:i].tolist())[None], sampling)
                assert torch.allclose(probs[i], expected[0])
            seen.append(len(tokens))
            return draft

    for seed in range(30):
        generate(reference, [1, 2], GenerationConfig(max_new_tokens=12, sampling=sampling, seed=seed), Spy(), 3)
    assert sum(seen) > 0


def test_drafter_cache_holds_the_true_context_after_full_accepts():
    target = tiny_backend(0)
    drafter = ModelDrafter(tiny_backend(0), GREEDY)
    result = generate(target, PROMPT, greedy(max_new_tokens=20), drafter, 4)
    assert result.stats.acceptance_rate == 1.0
    # The drafter never fed its last draft of the final round, nor the bonus token.
    context = PROMPT + result.token_ids
    cached = drafter._cached
    assert cached == context[: len(cached)]
    fresh = tiny_backend(0)
    expected = fresh.score(context, 1)
    drafter.backend.rollback(len(cached))
    got = drafter.backend.score(context[len(cached):], 1)
    assert torch.allclose(got, expected, atol=1e-4)


def test_interleaved_streams_on_one_backend_are_refused():
    target = TrigramBackend(random_table(6, seed=0))
    first, second = (stream(target, prompt, greedy(max_new_tokens=10), NgramDrafter(), 2) for prompt in ([1, 2], [3, 4]))
    a, b = iter(first), iter(second)
    next(a)
    next(b)  # takes the backend over: its cache now holds the second prompt
    with pytest.raises(BackendError, match="trigram: the cache no longer holds this generation's text"):
        next(a)


def test_a_stream_resuming_after_direct_use_of_its_backend_is_refused():
    target = TrigramBackend(random_table(6, seed=0))
    rounds = iter(stream(target, [1, 2], greedy(max_new_tokens=10)))
    next(rounds)
    target.score([5], num_logits=1)
    with pytest.raises(BackendError, match="no longer holds"):
        next(rounds)


def test_sequential_streams_on_one_backend_take_it_over():
    """As the server runs them: one after another, an abandoned one included."""
    target = TrigramBackend(random_table(6, seed=0))
    solo = [generate(TrigramBackend(random_table(6, seed=0)), p, greedy(max_new_tokens=10)).token_ids
            for p in ([1, 2], [3, 4])]
    abandoned = iter(stream(target, [3, 4], greedy(max_new_tokens=10), NgramDrafter(), 2))
    next(abandoned)  # a cancelled request: never resumed
    assert generate(target, [1, 2], greedy(max_new_tokens=10), NgramDrafter(), 2).token_ids == solo[0]
    assert generate(target, [3, 4], greedy(max_new_tokens=10), NgramDrafter(), 2).token_ids == solo[1]


def test_a_drafter_on_the_targets_own_backend_is_refused():
    target = TrigramBackend(random_table(6, seed=0))
    with pytest.raises(ValueError, match="drafter runs on the target's own backend object"):
        stream(target, [1, 2], greedy(), ModelDrafter(target, GREEDY), 4)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_that_cannot_roll_back_is_refused_before_any_text(role):
    target, draft = TrigramBackend(random_table(6, seed=0)), TrigramBackend(random_table(6, seed=1))
    stuck = target if role == "target" else draft
    stuck.supports_rollback = False  # as the hf backend says of recurrent models
    with pytest.raises(ValueError, match="cannot be rolled back"):
        stream(target, [1, 2], greedy(), ModelDrafter(draft, GREEDY), 4)
    assert generate(target, [1, 2], greedy()).token_ids  # alone, it still decodes


def test_drafters_sharing_a_draft_backend_resync_after_each_other():
    """Two streams in lockstep leave the shared draft cache at the length each drafter
    expects, but holding the other's text: only the claim tells them apart."""
    draft = tiny_backend(0)
    streams = [stream(tiny_backend(0), prompt, greedy(max_new_tokens=16), ModelDrafter(draft, GREEDY), 3)
               for prompt in (PROMPT, PROMPT[::-1])]
    rounds = [iter(s) for s in streams]
    for _ in range(4):
        for r in rounds:
            next(r)
    for s, r in zip(streams, rounds):
        list(r)
        assert s.result.stats.acceptance_rate == 1.0  # identical draft: every draft was drawn on the right text


def test_max_new_tokens_is_never_exceeded():
    target = tiny_backend(0)
    for n in [1, 2, 3, 7, 10]:
        result = generate(target, PROMPT, greedy(max_new_tokens=n), ModelDrafter(tiny_backend(0), GREEDY), 4)
        assert len(result.token_ids) == n
        assert result.stop_reason == "length"


def test_stops_at_any_eos_token_and_includes_it():
    target = tiny_backend(0)
    free = generate(target, PROMPT, greedy(max_new_tokens=30)).token_ids
    eos = free[12]
    first = free.index(eos)
    result = generate(target, PROMPT, greedy(max_new_tokens=30, eos_token_ids=frozenset({999, eos})),
                      ModelDrafter(tiny_backend(0), GREEDY), 3)
    assert result.token_ids == free[: first + 1]
    assert result.stop_reason == "eos"


class CharTokenizer:
    """Token i is the character chr(ord('a') + i % 26)."""

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def chat_prompt(self, text):
        return self.encode(text)


def test_stop_string_truncates_text_and_tokens_stop_there():
    target = tiny_backend(0)
    target.tokenizer = CharTokenizer()
    free = generate(target, PROMPT, greedy(max_new_tokens=30))
    stop = free.text[10:12]
    at = free.text.index(stop)
    result = generate(target, PROMPT, greedy(max_new_tokens=30, stop_strings=(stop,)),
                      ModelDrafter(tiny_backend(0), GREEDY), 4)
    assert result.text == free.text[:at]
    assert result.stop_reason == "stop_string"
    assert len(result.token_ids) <= at + len(stop)


def test_stream_yields_chunks_that_add_up_to_the_result():
    target = tiny_backend(0)
    target.tokenizer = CharTokenizer()
    s = stream(target, PROMPT, greedy(max_new_tokens=25, stop_strings=("zzz",)), ModelDrafter(tiny_backend(7), GREEDY), 3)
    chunks = list(s)
    assert "".join(c.text for c in chunks) == s.result.text
    assert sum((c.token_ids for c in chunks), []) == s.result.token_ids
    assert len(chunks) >= s.result.stats.target_calls


def byte_stream(text, max_new_tokens=None, drafter=None, stop_strings=()):
    """A stream whose greedy output spells `text` one UTF-8 byte per token."""
    script = list(text.encode())
    target = ScriptedBackend(script, 256, prompt_length=2, tokenizer=ByteTokenizer())
    config = greedy(max_new_tokens=max_new_tokens or len(script), stop_strings=stop_strings)
    return target.tokenizer, stream(target, [1, 2], config, drafter, 3)


@pytest.mark.parametrize("drafter", [None, NgramDrafter()], ids=["a-token-a-round", "drafted-rounds"])
def test_streamed_text_joins_characters_split_across_tokens(drafter):
    text = "héllo wörld € 😀 héllo wörld € 😀"
    tokenizer, s = byte_stream(text, drafter=drafter)
    chunks = [c.text for c in s]
    assert "".join(chunks) == s.result.text == tokenizer.decode(s.result.token_ids) == text
    assert not any("\ufffd" in c for c in chunks)
    tokenizer, s = byte_stream(text, max_new_tokens=len("héllo wörld €".encode()) - 1, drafter=drafter)
    chunks = [c.text for c in s]  # the last character is cut: its bytes decode to "\ufffd"
    assert "".join(chunks) == s.result.text == tokenizer.decode(s.result.token_ids) == "héllo wörld \ufffd"


@pytest.mark.parametrize("drafter", [None, NgramDrafter()], ids=["a-token-a-round", "drafted-rounds"])
def test_stop_string_found_across_chunks_and_split_characters(drafter):
    tokenizer, s = byte_stream("abc€def€ghi€d", drafter=drafter, stop_strings=("€g", "zz"))
    chunks = [c.text for c in s]
    assert s.result.stop_reason == "stop_string"
    assert "".join(chunks) == s.result.text == "abc€def"
    assert tokenizer.decode(s.result.token_ids) == "abc€def€g"  # tokens end with the one completing it


@pytest.mark.parametrize("stop_strings", [(), ("zzz",)], ids=["no-stop", "stop-strings"])
def test_streaming_decodes_each_token_a_bounded_number_of_times(stop_strings):
    """Decoding the whole output every round, or every token, is quadratic."""
    tokenizer, s = byte_stream("hé € " * 100, stop_strings=stop_strings)
    chunks = [c.text for c in s]
    assert "".join(chunks) == "hé € " * 100
    assert tokenizer.decoded < 10 * len(s.result.token_ids)


def test_stats_are_consistent():
    target = tiny_backend(0)
    result = generate(target, PROMPT, greedy(max_new_tokens=30), ModelDrafter(tiny_backend(7), GREEDY), 3)
    st = result.stats
    assert st.new_tokens == 30
    # every round drafts except a last one with a single token left to emit
    assert st.target_calls - 1 <= sum(st.accepted_histogram) <= st.target_calls
    assert st.accepted == sum(i * c for i, c in enumerate(st.accepted_histogram))
    assert st.drafted >= st.accepted
    assert st.draft_calls == st.drafted  # one draft-model call per draft token
    assert st.mean_tokens_per_target_call == pytest.approx(30 / st.target_calls)
    assert st.total_seconds >= st.draft_seconds + st.target_seconds
    ar = generate(target, PROMPT, greedy(max_new_tokens=30)).stats
    # The first token comes from the prompt's prefill, every other from one call.
    assert ar.target_calls == 29 and ar.acceptance_rate is None
    assert ar.mean_tokens_per_target_call == pytest.approx(30 / 29)


def test_the_first_token_is_timed_from_the_call_to_its_emission():
    ticks = iter(range(1000))
    clock = lambda: float(next(ticks))  # noqa: E731 - every reading one second later
    target = tiny_backend(0)
    s = stream(target, PROMPT, greedy(max_new_tokens=5), clock=clock)
    chunks = iter(s)
    next(chunks)
    when = s._rounds.gi_frame.f_locals["out"].stats.first_token_seconds  # set as the first chunk is emitted
    for _ in chunks:
        pass
    st = s.result.stats
    assert st.first_token_seconds == when and 0 < st.first_token_seconds < st.total_seconds
    assert st.first_token_seconds >= st.prefill_seconds  # the prefill comes first; then the first round emits
    assert st.as_dict()["first_token_seconds"] == st.first_token_seconds


def test_same_seed_repeats_exactly_and_other_seeds_differ():
    target = tiny_backend(0)
    sampling = SamplingConfig(temperature=1.0)

    def run(seed):
        cfg = GenerationConfig(max_new_tokens=30, sampling=sampling, seed=seed)
        return generate(target, PROMPT, cfg, ModelDrafter(tiny_backend(7), sampling), 3).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_tiny_temperature_generates_the_greedy_text():
    target = tiny_backend(0)
    sampling = SamplingConfig(temperature=1e-40)
    config = GenerationConfig(max_new_tokens=20, sampling=sampling)
    result = generate(target, PROMPT, config, ModelDrafter(tiny_backend(7), sampling), 3)
    assert result.token_ids == generate(target, PROMPT, greedy(max_new_tokens=20)).token_ids


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_non_finite_target_logits_stop_with_the_model_named(value, temperature):
    target = PoisonedBackend(random_table(6, seed=0), value, after=5, name="broken-target")
    config = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(temperature))
    with pytest.raises(BackendError, match="broken-target returned NaN or infinite logits"):
        generate(target, [1, 2], config, NgramDrafter(), 2)


def test_non_finite_draft_logits_stop_with_the_draft_named():
    sampling = SamplingConfig(1.0)
    drafter = ModelDrafter(PoisonedBackend(random_table(6, seed=1), float("nan"), after=4, name="broken-draft"), sampling)
    with pytest.raises(BackendError, match="broken-draft returned NaN"):
        generate(TrigramBackend(random_table(6, seed=0)), [1, 2], GenerationConfig(8, sampling=sampling), drafter, 3)


def test_minus_inf_logits_are_ruled_out_tokens_not_an_error():
    table = random_table(6, seed=0)
    table[..., 3:] = float("-inf")  # as a truncated draft vocabulary scores them
    sampling = SamplingConfig(1.0)
    config = GenerationConfig(12, sampling=sampling)
    result = generate(TrigramBackend(table), [1, 2], config, ModelDrafter(TrigramBackend(table), sampling), 3)
    assert len(result.token_ids) == 12 and max(result.token_ids) < 3


def test_prompt_longer_than_context_is_refused():
    target = tiny_backend(0)
    with pytest.raises(ValueError, match="context"):
        generate(target, [1] * 500, greedy(max_new_tokens=20))


@pytest.mark.parametrize("role", ["target", "draft"])
def test_every_model_context_is_checked_and_named(role):
    small = TrigramBackend(random_table(6, seed=0), name="small-context")
    small.context_length = 40
    big = TrigramBackend(random_table(6, seed=1), name="long-context")
    target, draft = (small, big) if role == "target" else (big, small)
    config = GenerationConfig(max_new_tokens=30, sampling=GREEDY)
    with pytest.raises(ValueError, match=f"context of the {role} model small-context: 40 tokens"):
        stream(target, [1, 2, 3, 4, 5, 6], config, ModelDrafter(draft, GREEDY), 4)  # 6 + 30 + 4 + 1 > 40
    stream(target, [1, 2, 3, 4, 5], config, ModelDrafter(draft, GREEDY), 4)


def test_empty_prompt_and_bad_k_are_refused():
    with pytest.raises(ValueError):
        generate(tiny_backend(0), [], greedy())
    drafter = NgramDrafter()
    for bad in (0, -1, True, "fast"):
        with pytest.raises(ValueError, match="k must be 'auto' or an integer >= 1"):
            generate(tiny_backend(0), PROMPT, greedy(), drafter, bad)


def test_the_loop_takes_a_ready_policy_and_makes_no_planner():
    """stream() never times the models: -k auto is a planner made where the models are
    known (policy/make.py), so "auto" or no policy beside a drafter is refused before
    any call, and without a drafter no policy is needed."""
    target = tiny_backend(0)
    calls = []
    target.score = lambda *a, **kw: calls.append(a)
    for missing in ("auto", None):
        with pytest.raises(ValueError, match="make_policy"):
            stream(target, PROMPT, greedy(), NgramDrafter(), missing)
    assert calls == []
    plain = generate(tiny_backend(0), PROMPT, greedy())
    assert plain.token_ids == generate(tiny_backend(0), PROMPT, greedy(), NgramDrafter(), FixedK(2)).token_ids


def test_the_draft_length_lives_in_the_policy_alone():
    """A k in the config would be a second source of truth, silently overridden by
    the policy: it is refused outright."""
    with pytest.raises(TypeError, match="k"):
        GenerationConfig(k=3)
    with pytest.raises(TypeError, match="k_max"):
        GenerationConfig(k_max=4)
    for policy in (3, FixedK(3)):  # the shorthand and the policy it stands for
        result = generate(tiny_backend(0), PROMPT, greedy(max_new_tokens=12), ModelDrafter(tiny_backend(7), GREEDY),
                          policy)
        assert len(result.stats.draft_length_histogram) == 4  # rounds of up to 3 drafts


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="stop strings must not be empty"):
        GenerationConfig(stop_strings=("end", ""))


def test_ngram_drafter_proposes_continuation_of_latest_match():
    d = NgramDrafter(max_ngram=2)
    draft = draft_round(d, [1, 2, 3, 4, 2, 3], 3, None, FixedK(3).plan)
    tokens, probs = draft.tokens, draft.probs
    assert tokens.tolist() == [4, 2, 3] and probs is None
    # falls back to a shorter n-gram, prefers the most recent occurrence
    assert draft_round(d, [7, 1, 8, 5, 1, 9, 6, 1], 2, None, FixedK(2).plan).tokens.tolist() == [9, 6]
    assert draft_round(d, [1, 2, 3], 4, None, FixedK(4).plan).tokens.tolist() == []


def test_ngram_index_agrees_with_a_plain_scan():
    """The incremental index must find what scanning the context finds, including
    after the context is replaced by another sequence."""
    import random

    def scan(context, k, max_ngram, min_ngram):
        for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == context[-n:]:
                    return context[start + n : start + n + k], n
        return [], 0

    rng = random.Random(0)
    for _ in range(200):
        d = NgramDrafter(max_ngram=rng.randint(1, 4), min_ngram=1)
        context = [rng.randint(0, 4) for _ in range(rng.randint(1, 5))]
        for _ in range(30):
            k = rng.randint(1, 5)
            assert d.lookup(context, k) == scan(context, k, d.max_ngram, d.min_ngram)
            context = context + [rng.randint(0, 4) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.05:
                context = context[: rng.randint(1, len(context))]


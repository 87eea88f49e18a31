"""llama.cpp backend on the real default pair (quantised GGUF, no dequantisation)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.policy.control import Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Prices
from specsample.policy.make import K_MAX, make_policy


pytestmark = pytest.mark.real
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specsample[llamacpp]')")

GREEDY = SamplingConfig(temperature=0)
PROMPT = "Write a Python function `fizzbuzz(n)` returning the list of FizzBuzz strings."


@pytest.fixture(scope="module")
def pair(real_pair):
    return real_pair.shared("target"), real_pair.shared("draft")


def test_vocabulary_and_eos(pair):
    target, draft = pair
    assert target.vocab_size == draft.vocab_size == 151_665  # 151,936 rows less padding
    im_end = target.tokenizer.encode("<|im_end|>", special=True)
    assert len(im_end) == 1 and im_end[0] in target.eos_token_ids


def test_the_chat_prompt_is_unchanged_for_qwen_and_other_templates_get_bos_and_raise_exception(pair):
    """Qwen's template writes no BOS and its vocabulary adds none; a Mistral-style
    template writes {{ bos_token }} and refuses with raise_exception, which the
    renderer must supply (it rendered an empty BOS and crashed on the call before)."""
    from specsample.backends.base import ChatTemplateError

    tok = pair[1].tokenizer
    ids = tok.chat_prompt("hi")
    assert ids[0] == tok.encode("<|im_start|>", special=True)[0] and tok._bos not in ids
    qwen = tok.chat_template
    try:
        tok.chat_template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] != 'user' %}"
                         "{{ raise_exception('only user turns here') }}{% endif %}[INST] {{ m['content'] }} [/INST]"
                         "{% endfor %}")
        ids = tok.chat_prompt("hi")
        assert ids[0] == tok._bos == 151643 and ids.count(tok._bos) == 1  # Qwen's BOS: <|endoftext|>
        with pytest.raises(ChatTemplateError, match="only user turns here"):
            tok.chat_messages([{"role": "system", "content": "hi"}])
    finally:
        tok.chat_template = qwen


def test_score_returns_only_requested_rows(pair):
    _, draft = pair
    draft.rollback(0)
    logits = draft.score(draft.tokenizer.encode("def f(x):"), num_logits=2)
    assert logits.shape == (2, 151_665) and torch.isfinite(logits).all()


def test_rollback_then_rescore_equals_fresh_prefill(pair):
    _, draft = pair
    ids = draft.tokenizer.chat_prompt(PROMPT)
    continuation = draft.tokenizer.encode(" def fizzbuzz(n):")
    draft.rollback(0)
    draft.score(ids, 1)
    fresh = draft.score(continuation, len(continuation))
    draft.score([11, 22, 33, 44], 4)  # rejected drafts
    draft.rollback(len(ids))
    again = draft.score(continuation, len(continuation))
    assert torch.allclose(fresh, again, atol=1e-3)


@pytest.fixture(scope="module")
def greedy_reference(pair):
    target, _ = pair
    ids = target.tokenizer.chat_prompt(PROMPT)
    return ids, generate(target, ids, GenerationConfig(max_new_tokens=32, sampling=GREEDY)).token_ids


def assert_same_or_flipped_at_a_near_tie(target, ids, got, reference, tolerance=0.5):
    """llama.cpp's logits depend on how many tokens a call scores (a 1-token decoding
    step and the same position inside a 4-token verify call differ by up to ~0.4 in
    a logit), so greedy outputs may part where the target's top two tokens are that
    close. Equal, or parted only at such a near-tie: anything else is a bug."""
    if got == reference:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, reference)) if a != b)
    target.rollback(0)
    logits = target.score(ids + reference[:i], num_logits=1)[0]
    gap = abs(float(logits[reference[i]] - logits[got[i]]))
    assert gap < tolerance, f"greedy outputs part at token {i}, where the target's logits differ by {gap:.3f}"


def forced_speculation():
    """A planner told that verification is nearly free, so that it drafts on this
    machine too (where it otherwise, rightly, takes plain steps)."""
    prices = Prices(Curve({1: 1.0, 7: 1.12}), Curve({1: 0.05, 16: 0.2}))
    prices.target.observe = prices.draft.observe = lambda *call: None  # keep these costs whatever is measured
    return Planner(6, prices).seat()


@pytest.mark.parametrize("k", [1, 3, 5, "auto"])
def test_greedy_speculative_equals_autoregressive(pair, greedy_reference, k):
    target, draft = pair
    ids, reference = greedy_reference
    config = GenerationConfig(max_new_tokens=32, sampling=GREEDY)
    policy = forced_speculation() if k == "auto" else k
    drafter = ModelDrafter(draft, GREEDY)
    if k == "auto":
        drafter = HybridDrafter(drafter, NgramDrafter())
    result = generate(target, ids, config, drafter, policy)
    assert_same_or_flipped_at_a_near_tie(target, ids, result.token_ids, reference)
    assert result.stats.acceptance_rate > 0.5
    if k == "auto":
        assert sum(result.stats.draft_length_histogram[2:]) > 0


def test_greedy_ngram_equals_autoregressive(pair, greedy_reference):
    target, _ = pair
    ids, reference = greedy_reference
    config = GenerationConfig(max_new_tokens=32, sampling=GREEDY)
    assert_same_or_flipped_at_a_near_tie(target, ids, generate(target, ids, config, NgramDrafter(), 3).token_ids, reference)


def test_default_auto_on_this_machine_equals_autoregressive(pair, greedy_reference):
    target, draft = pair
    ids, reference = greedy_reference
    config = GenerationConfig(max_new_tokens=32, sampling=GREEDY)
    policy = make_policy("auto", K_MAX, target, draft, context=ids)  # -k auto, calibrated here on this prompt
    result = generate(target, ids, config, HybridDrafter(ModelDrafter(draft, GREEDY), NgramDrafter()), policy)
    assert_same_or_flipped_at_a_near_tie(target, ids, result.token_ids, reference)


@pytest.fixture(scope="module")
def bf16_target(real_pair):
    """A re-encoded target small enough for the suite: the 0.5B as bf16 (made once,
    cached), the encoding `--target-quant bf16` gives the default 1.5B."""
    return real_pair.shared("draft", quant="bf16")


def test_a_reencoded_file_says_its_type(pair, bf16_target):
    from specsample.backends.reencode import file_type

    assert file_type(pair[0].path) == "q4_k_m" and file_type(bf16_target.path) == "bf16"


def test_greedy_speculative_equals_autoregressive_on_a_reencoded_target(pair, bf16_target):
    _, draft = pair
    ids = bf16_target.tokenizer.chat_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=32, sampling=GREEDY)
    plain = generate(bf16_target, ids, config).token_ids
    spec = generate(bf16_target, ids, config, ModelDrafter(draft, GREEDY), 4)
    assert_same_or_flipped_at_a_near_tie(bf16_target, ids, spec.token_ids, plain)
    assert spec.stats.acceptance_rate > 0.5


def test_tokenizer_keeps_its_model_alive_after_the_backend_is_gone(real_pair):
    """The tokenizer holds llama.cpp's vocab pointer, which the model owns; freeing the
    model with the backend left it reading freed memory (a crash or garbage). In a child
    process, so that a crash fails this test instead of ending the run."""
    import specsample

    script = f"""if True:
        import gc
        from specsample.backends import load_backend
        backend = load_backend({real_pair.draft!r}, "llamacpp")
        tokenizer = backend.tokenizer
        ids = tokenizer.encode({PROMPT!r})
        del backend
        gc.collect()
        assert tokenizer.encode({PROMPT!r}) == ids and tokenizer.decode(ids) == {PROMPT!r}
        print("ok")
    """
    env = {**os.environ, "PYTHONPATH": str(Path(specsample.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]


@pytest.fixture(scope="module")
def invariant_target(real_pair):
    return real_pair.shared("target", batch_invariant=True)


def test_batch_invariant_logits_do_not_depend_on_the_call_size(pair, invariant_target):
    """The default kernels give a position different logits in a 1-token call and in a
    4-token call; --batch-invariant gives the same bits."""
    default, _ = pair
    ids = default.tokenizer.chat_prompt(PROMPT)
    tail = default.tokenizer.encode(" def fizzbuzz(n):\n    out = []")
    gaps = {}
    for target in (default, invariant_target):
        target.rollback(0)
        target.score(ids, 1)
        single = [target.score([t], 1)[0] for t in tail]
        target.rollback(len(ids))
        batched = target.score(tail, len(tail))
        gaps[target] = max(float((a - b).abs().max()) for a, b in zip(single, batched))
    assert gaps[invariant_target] == 0.0
    assert gaps[default] > 0.0  # else this engine needs no switch and the test proves nothing


def test_batch_invariant_greedy_speculative_equals_autoregressive_exactly(pair, invariant_target):
    _, draft = pair
    ids = invariant_target.tokenizer.chat_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=48, sampling=GREEDY)
    plain = generate(invariant_target, ids, config).token_ids
    spec = generate(invariant_target, ids, config, ModelDrafter(draft, GREEDY), 3)
    assert spec.token_ids == plain  # no near-tie allowance: the same logits, the same argmax
    assert spec.stats.drafted > 0


def test_a_cached_prompt_gives_a_fresh_prefills_answer_exactly_with_batch_invariant_kernels(pair, invariant_target):
    """A chat's next turn scored on top of what the last one left (cache_prompt): the
    backend counts its cache's tokens, and with --batch-invariant kernels the rows
    computed in the earlier turn's calls are the ones a fresh prefill computes."""
    _, draft = pair
    tokenizer = invariant_target.tokenizer
    ids = tokenizer.chat_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=24, sampling=GREEDY, cache_prompt=True)
    invariant_target.rollback(0)
    first = generate(invariant_target, ids, config, ModelDrafter(draft, GREEDY), 3)
    held = invariant_target.cached_tokens()
    assert held == (ids + first.token_ids)[: len(held)] and len(held) >= len(ids)
    follow_up = ids + first.token_ids + tokenizer.encode("\n# now in one line:\n")
    cached = generate(invariant_target, follow_up, config, ModelDrafter(draft, GREEDY), 3)
    assert cached.stats.cached_prompt_tokens == len(held)
    invariant_target.rollback(0)
    fresh = generate(invariant_target, follow_up, GenerationConfig(max_new_tokens=24, sampling=GREEDY),
                     ModelDrafter(draft, GREEDY), 3)
    assert fresh.stats.cached_prompt_tokens == 0
    assert cached.token_ids == fresh.token_ids

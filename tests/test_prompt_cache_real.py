"""The host prompt cache on the real default pair (llama.cpp): a sequence's cache saved
to host memory and restored into another sequence, cut to a prompt's shared start,
gives the rest of the prompt a fresh prefill's logits bitwise (batch-invariant
kernels); and through the server, a side request between two turns of a chat does not
cost the chat its prefix."""

import re

import httpx
import pytest
import torch

from serve_helpers import running

pytestmark = pytest.mark.real
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specsample[llamacpp]')")

QUESTION = "Write a Python function `fizzbuzz(n)` returning the list of FizzBuzz strings."


def test_a_restored_prefix_then_the_rest_gives_a_fresh_prefills_logits_bitwise(real_pair):
    target = real_pair.shared("target", batch_invariant=True, sequences=2)
    tokenizer = target.tokenizer
    prompt = tokenizer.chat_prompt(QUESTION)
    rest = tokenizer.encode("def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):")
    target.rollback_sequence(0, 0)
    fresh = target.score_many([(0, prompt + rest, len(rest))])[0]  # [len(rest), vocab]

    target.rollback_sequence(0, 0)
    target.score_many([(0, prompt + tokenizer.encode(" and a different ending"), 1)])
    saved = target.save_sequence(0)
    assert list(saved.tokens) == target.sequence_tokens(0) and saved.nbytes > 0
    target.rollback_sequence(0, 0)
    target.score_many([(0, tokenizer.chat_prompt("What is a cat?"), 1)])  # a side request takes sequence 0
    target.rollback_sequence(1, 0)
    target.score_many([(1, tokenizer.chat_prompt("Something else again"), 1)])  # sequence 1 holds a text too
    target.restore_sequence(1, saved, len(prompt))
    assert target.sequence_tokens(1) == prompt and target.sequence_length(1) == len(prompt)
    restored = target.score_many([(1, rest, len(rest))])[0]
    assert torch.equal(restored, fresh)


def test_a_side_request_between_turns_does_not_cost_the_chat_its_prefix(real_pair):
    from specsample.app.assemble import Models
    from specsample.backends import load_backend
    from specsample.serve.app import create_app
    from specsample.serve.settings import Settings

    target = load_backend(real_pair.target, "llamacpp", batch_invariant=True, n_ctx=1024)
    draft = load_backend(real_pair.draft, "llamacpp", n_ctx=1024)
    models = Models(target, draft)
    app = create_app(target, models.drafter, models.drafter_name,
                     Settings(model_name="qwen", policy=3, prompt_cache_mib=64), models.draft)

    def chat(url, messages, max_tokens=8):
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "qwen", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()

    # A turn long enough that the draft reading it again would show (about 200 tokens).
    turn_1 = [{"role": "user", "content": QUESTION + " Start from this:\n" + "\n".join(
        f"# case {i}: {i} -> {'Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0) or i}" for i in range(1, 16))}]
    with running(app) as url:
        first = chat(url, turn_1)
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        chat(url, [{"role": "user", "content": "Summarize: the user asked for fizzbuzz."}], max_tokens=2)
        turn_2 = turn_1 + [first["choices"][0]["message"], {"role": "user", "content": "Now in one line."}]
        before = draft_tokens(httpx.get(url + "/metrics", timeout=30).text)
        second = chat(url, turn_2)
        metrics = httpx.get(url + "/metrics", timeout=30).text
    cached, prompt = second["usage"]["prompt_tokens_details"]["cached_tokens"], second["usage"]["prompt_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]
    assert "specsample_prompt_cache_hits_total 1.0" in metrics
    # The draft model's copy came back with the target's: it read only the new part of
    # the prompt, then at most 2k tokens a round (the accepted ones and its drafts) in
    # at most 8 rounds; without its copy it would have read the first turn again.
    assert second["usage"]["speculative"]["drafted"] > 0
    assert draft_tokens(metrics) - before <= prompt - cached + 8 * 2 * 3 < first["usage"]["prompt_tokens"]
    # Batch-invariant kernels: the restored turn answers as the library does on a fresh prefill.
    from specsample.decoding.drafters import ModelDrafter
    from specsample.decoding.generate import GenerationConfig, generate
    from specsample.decoding.sampling import SamplingConfig

    greedy = SamplingConfig(temperature=0)
    target.rollback(0)
    fresh = generate(target, target.tokenizer.chat_messages(turn_2), GenerationConfig(max_new_tokens=8, sampling=greedy),
                     ModelDrafter(draft, greedy), 3)
    assert second["choices"][0]["message"]["content"] == fresh.text


def draft_tokens(metrics: str) -> float:
    """Tokens fed to the draft model so far, every phase and batch size (/metrics)."""
    return sum(float(v) for v in re.findall(r'^specsample_model_call_tokens_total\{model="draft"[^}]*\} (\S+)$',
                                            metrics, re.M))

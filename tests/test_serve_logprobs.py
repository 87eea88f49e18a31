"""What real clients send, through the official `openai` client: log-probabilities
(completions and chat, whole and streamed), echo and prompt scoring, the sampling
controls, n > 1 with its index, usage; each equal to the library's own answer."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.logprobs import score_prompt

from serve_helpers import WordTokenizer, running, toy_app, toy_pair
from test_serve import client, url  # noqa: F401 (fixtures: one toy server for the module)

pytestmark = pytest.mark.system

PROMPT = "the cat sat on a mat and the dog ran"
FIXTURES = Path(__file__).parent / "fixtures"


def direct(ids, max_tokens, seed, sampling=SamplingConfig(), logprobs=None, stop=()):
    target, draft = toy_pair()
    config = GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, seed=seed, stop_strings=tuple(stop),
                              logprobs=logprobs)
    return generate(target, ids, config, ModelDrafter(draft, sampling), 3)


def words(ids):
    return [WordTokenizer().decode([t]) for t in ids]


def test_completion_logprobs_whole_and_streamed(client):
    ids = WordTokenizer().encode(PROMPT)
    expected = direct(ids, 16, seed=4, sampling=SamplingConfig(0.9), logprobs=3)
    whole = client.completions.create(model="toy", prompt=PROMPT, max_tokens=16, seed=4, temperature=0.9, logprobs=3)
    lp = whole.choices[0].logprobs
    assert lp.tokens == words(expected.token_ids)
    assert lp.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs], abs=1e-6)
    for top, e in zip(lp.top_logprobs, expected.logprobs):
        assert top == pytest.approx({**{WordTokenizer().decode([t]): v for t, v in e.top},
                                     WordTokenizer().decode([e.token]): e.logprob}, abs=1e-6)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert "".join(lp.tokens) == whole.choices[0].text == expected.text
    chunks = list(client.completions.create(model="toy", prompt=PROMPT, max_tokens=16, seed=4, temperature=0.9,
                                            logprobs=3, stream=True))
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        if c.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(c.choices[0].logprobs, key)
    assert streamed == lp.model_dump()


def test_chat_logprobs_whole_and_streamed(client):
    messages = [{"role": "user", "content": "where is the cat"}]
    ids = WordTokenizer().chat_messages(messages)
    expected = direct(ids, 12, seed=2, logprobs=2)
    whole = client.chat.completions.create(model="toy", messages=messages, max_tokens=12, seed=2, logprobs=True,
                                           top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert [c.token for c in content] == words(expected.token_ids)
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in expected.logprobs], abs=1e-6)
    assert [[t.token for t in c.top_logprobs] for c in content] == [words([t for t, _ in e.top]) for e in expected.logprobs]
    assert content[0].bytes == list(content[0].token.encode())
    chunks = list(client.chat.completions.create(model="toy", messages=messages, max_tokens=12, seed=2,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    assert [c.model_dump() for c in streamed] == [c.model_dump() for c in content]
    plain = client.chat.completions.create(model="toy", messages=messages, max_tokens=12, seed=2)
    assert plain.choices[0].logprobs is None


def test_echo_with_max_tokens_zero_scores_the_prompt(client):
    ids = WordTokenizer().encode(PROMPT)
    target, _ = toy_pair()
    expected = score_prompt(target, ids, top=2)
    r = client.completions.create(model="toy", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs.tokens == words(ids)
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx([e.logprob for e in expected[1:]], abs=1e-6)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    streamed = list(client.completions.create(model="toy", prompt=ids, max_tokens=0, echo=True, logprobs=2,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == WordTokenizer().decode(ids)
    assert streamed[-1].usage.prompt_tokens == len(ids)


def test_echo_and_generation_together(client):
    r = client.completions.create(model="toy", prompt=PROMPT, max_tokens=4, echo=True, logprobs=0, seed=1)
    expected = direct(WordTokenizer().encode(PROMPT), 4, seed=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == PROMPT + expected.text
    assert len(lp.tokens) == len(PROMPT.split()) + len(expected.token_ids)
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])  # logprobs 0: the chosen token alone


def loglikelihood(response, ctxlens):
    """What lm-evaluation-harness's local-completions reads from an answer
    (LocalCompletionsAPI.parse_logprobs, 0.4.x): the continuation's log-likelihood and
    whether greedy decoding would have produced it."""
    out = []
    for choice, ctxlen in zip(sorted(response["choices"], key=lambda c: c["index"]), ctxlens):
        logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        out.append((sum(logprobs), all(lp == max(top.values()) for lp, top in zip(logprobs, tops))))
    return out


def test_captured_harness_loglikelihood_request(url):
    """A request lm-evaluation-harness 0.4.13 sent for the multiple-choice task
    (local-completions, batch_size 2: two token-id prompts, echo, max_tokens 1,
    logprobs 1), with the context lengths it parsed the answer with: the
    log-likelihoods must equal the library's prompt scoring."""
    captured = json.loads((FIXTURES / "lm_eval_loglikelihood_request.json").read_text())
    body, ctxlens = captured["request"], captured["ctxlens"]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    response = client.completions.create(**body).model_dump()
    assert [c["index"] for c in response["choices"]] == [0, 1]
    for (total, greedy), prompt, ctxlen in zip(loglikelihood(response, ctxlens), body["prompt"], ctxlens):
        target, _ = toy_pair()
        scored = score_prompt(target, prompt)
        assert total == pytest.approx(sum(e.logprob for e in scored[ctxlen:]), abs=1e-5)
        greedy_tokens = [e.top and e.top[0][0] for e in score_prompt(toy_pair()[0], prompt, top=1)[ctxlen:]]
        assert greedy == (greedy_tokens == prompt[ctxlen:])


def test_captured_harness_generate_until_request(url):
    body = json.loads((FIXTURES / "lm_eval_generate_request.json").read_text())["request"]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    response = client.completions.create(**body)
    sampling = SamplingConfig(0.0)
    for choice, prompt in zip(response.choices, body["prompt"]):
        target, draft = toy_pair()
        config = GenerationConfig(max_new_tokens=body["max_tokens"], sampling=sampling, seed=body["seed"],
                                  stop_strings=tuple(body["stop"]))
        assert choice.text == generate(target, prompt, config, ModelDrafter(draft, sampling), 3).text


def test_n_choices_whole_and_streamed_with_their_index(client):
    ids = WordTokenizer().encode(PROMPT)
    expected = [direct(ids, 10, seed=7 + i).text for i in range(3)]
    whole = client.completions.create(model="toy", prompt=PROMPT, max_tokens=10, seed=7, n=3)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.text for c in whole.choices] == expected
    assert whole.usage.completion_tokens == sum(len(direct(ids, 10, seed=7 + i).token_ids) for i in range(3))
    assert len(whole.usage.model_dump()["speculative"]) == 3
    texts, finished = ["", "", ""], set()
    for chunk in client.chat.completions.create(model="toy", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=10, seed=7, n=3, stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    chat_ids = WordTokenizer().chat_messages([{"role": "user", "content": PROMPT}])
    assert texts == [direct(chat_ids, 10, seed=7 + i).text for i in range(3)] and finished == {0, 1, 2}
    assert chunk.usage is not None and chunk.choices == []


@pytest.mark.parametrize("controls", [
    dict(presence_penalty=1.5, frequency_penalty=0.5), dict(repetition_penalty=1.7, min_p=0.1),
    dict(logit_bias={"6": 5.0, "7": -100.0}), dict(temperature=0.0, frequency_penalty=2.0)])
def test_sampling_controls_equal_the_library(client, controls):
    bias = {int(k): v for k, v in controls.get("logit_bias", {}).items()}
    sampling = SamplingConfig(**{**controls, "logit_bias": bias})
    expected = direct(WordTokenizer().encode(PROMPT), 20, seed=3, sampling=sampling)
    extra = {k: controls[k] for k in ("repetition_penalty", "min_p") if k in controls}
    standard = {k: v for k, v in controls.items() if k not in extra}
    r = client.completions.create(model="toy", prompt=PROMPT, max_tokens=20, seed=3, **standard, extra_body=extra)
    assert r.choices[0].text == expected.text
    if "logit_bias" in controls:  # "sat" (7) is ruled out
        assert 7 not in expected.token_ids and "sat" not in r.choices[0].text.split()


def test_tokenizer_endpoints(url):
    r = httpx.post(url + "/tokenize", json={"prompt": "the cat", "add_special_tokens": False}).json()
    assert r["tokens"] == WordTokenizer().encode("the cat") and r["count"] == 2
    assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == " the cat"
    info = httpx.get(url + "/tokenizer_info").json()
    assert "eos_token" in info and info["model_max_length"] == 256
    assert httpx.post(url + "/detokenize", json={"tokens": [999]}).status_code == 400


SEEDED = dict(max_tokens=24, temperature=0.8, top_p=0.95, seed=11)


def test_a_seed_gives_the_same_text_autoregressive_or_speculative_streamed_or_not():
    """Coupled sampling: the answer depends on the target, the seed and the position only."""
    answers = {}
    for drafter, k in (("none", 3), ("model", 3), ("model", 1), ("ngram", 4)):
        app, _ = toy_app(drafter=drafter, policy=k, max_queue=64)
        with running(app) as base:
            client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)

            def ask(i):
                if i % 2:
                    chunks = client.completions.create(model="toy", prompt=PROMPT, stream=True, **SEEDED)
                    return "".join(c.choices[0].text for c in chunks)
                return client.completions.create(model="toy", prompt=PROMPT, **SEEDED).choices[0].text

            with ThreadPoolExecutor(6) as pool:
                answers[(drafter, k)] = list(pool.map(ask, range(6)))
    texts = {t for a in answers.values() for t in a}
    assert len(texts) == 1, answers

"""The server through the official `openai` client: the text equals a direct library
call with the same seed and settings, alone and under concurrent load."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from serve_helpers import WordTokenizer, running, toy_app, toy_pair

pytestmark = pytest.mark.system

PROMPT = "the cat sat on a mat and the dog ran"


@pytest.fixture(scope="module")
def url():
    app, _ = toy_app(max_queue=64)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def direct(ids, max_tokens, seed, temperature=1.0, top_p=1.0, top_k=0, stop=()):
    """What the library gives for the same request, on a fresh copy of the pair."""
    target, draft = toy_pair()
    sampling = SamplingConfig(temperature, top_k, top_p)
    config = GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, seed=seed, stop_strings=tuple(stop))
    return generate(target, ids, config, ModelDrafter(draft, sampling), 3)


def chat_ids(text):
    return WordTokenizer().chat_messages([{"role": "system", "content": "a big red dog"},
                                          {"role": "user", "content": text}])


@pytest.mark.parametrize("settings", [
    dict(seed=3), dict(seed=5, temperature=0.7, top_p=0.9), dict(seed=1, temperature=0.0),
    dict(seed=2, temperature=1.2, top_k=5, stop=[" over"]),
])
def test_completion_equals_library_streamed_or_not(client, settings):
    top_k = settings.pop("top_k", 0)
    expected = direct(WordTokenizer().encode(PROMPT), 24, top_k=top_k, **settings)
    extra = {"extra_body": {"top_k": top_k}} if top_k else {}
    whole = client.completions.create(model="toy", prompt=PROMPT, max_tokens=24, **settings, **extra)
    assert whole.choices[0].text == expected.text
    assert whole.choices[0].finish_reason == {"length": "length"}.get(expected.stop_reason, "stop")
    usage = whole.usage.model_dump()
    assert usage["prompt_tokens"] == len(PROMPT.split())
    assert usage["completion_tokens"] == len(expected.token_ids)
    assert usage["speculative"]["drafted"] == expected.stats.drafted
    assert usage["speculative"]["acceptance_rate"] == expected.stats.acceptance_rate
    chunks = list(client.completions.create(model="toy", prompt=PROMPT, max_tokens=24, stream=True,
                                            **settings, **extra))
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_equals_library_streamed_or_not(client):
    expected = direct(chat_ids("where is the cat"), 20, seed=9, temperature=0.9)
    messages = [{"role": "system", "content": "a big red dog"}, {"role": "user", "content": "where is the cat"}]
    whole = client.chat.completions.create(model="toy", messages=messages, max_completion_tokens=20, seed=9,
                                           temperature=0.9)
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected.text
    assert whole.usage.completion_tokens == len(expected.token_ids)
    chunks = list(client.chat.completions.create(model="toy", messages=messages, max_tokens=20, seed=9,
                                                 temperature=0.9, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].usage.model_dump()["speculative"]["target_calls"] == expected.stats.target_calls


def test_raw_stream_ends_with_done(url):
    body = {"model": "toy", "prompt": PROMPT, "max_tokens": 5, "seed": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"


def test_models_and_health(client, url):
    assert [m.id for m in client.models.list().data] == ["toy"]
    assert client.models.list().data[0].max_model_len == 256  # the toy's context, as vLLM reports it
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_concurrent_clients_each_get_their_own_answer(client):
    """16 clients x 4 requests at once, streaming and not, chat and completion: each
    answer equals the solo answer for its seed (none lost, none mixed up)."""
    jobs = [(c, r) for c in range(16) for r in range(4)]
    ids = WordTokenizer().encode(PROMPT)
    expected = {seed: direct(ids, 12, seed).text for seed in range(len(jobs))}

    def one(job):
        c, r = job
        seed = c * 4 + r
        if r % 2:
            chunks = client.completions.create(model="toy", prompt=PROMPT, max_tokens=12, seed=seed, stream=True)
            return seed, "".join(ch.choices[0].text for ch in chunks)
        return seed, client.completions.create(model="toy", prompt=PROMPT, max_tokens=12, seed=seed).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        answers = dict(pool.map(one, jobs))
    assert answers == expected


def test_metrics_count_requests_tokens_and_acceptance(client, url):
    def value(text, name):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    before = httpx.get(f"{url}/metrics").text
    result = client.completions.create(model="toy", prompt=PROMPT, max_tokens=10, seed=4)
    after = httpx.get(f"{url}/metrics").text
    ok = 'specsample_requests_total{endpoint="/v1/completions",status="200"}'
    assert value(after, ok) == value(before, ok) + 1
    assert value(after, "specsample_completion_tokens_total") - value(before, "specsample_completion_tokens_total") \
        == result.usage.completion_tokens
    speculative = result.usage.model_dump()["speculative"]
    assert value(after, "specsample_draft_tokens_total") - value(before, "specsample_draft_tokens_total") \
        == speculative["drafted"]
    for name in ("specsample_queue_depth", "specsample_time_to_first_token_seconds_bucket",
                 "specsample_request_seconds_bucket", "specsample_acceptance_rate_bucket"):
        assert name in after


def test_prompt_tokens_count_each_prompt_of_a_batch(url):
    """Two prompts of different lengths, two samples each: every choice counts its own prompt."""
    def prompt_tokens():
        text = httpx.get(f"{url}/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("specsample_prompt_tokens_total"))

    prompts = ["the cat", "the dog ran far away and then it was over"]
    before = prompt_tokens()
    r = httpx.post(f"{url}/v1/completions", json={"model": "toy", "prompt": prompts, "n": 2, "max_tokens": 3,
                                                   "seed": 1}, timeout=30)
    assert r.status_code == 200, r.text
    assert prompt_tokens() - before == 2 * sum(len(p.split()) for p in prompts)


def test_the_default_auto_mode_with_the_hybrid_drafter():
    """The server as `specsample serve` starts it: -k auto, one planner for
    every request, the draft model with lookup beside it. Greedy answers equal plain
    greedy decoding; the planner drafts (target calls are made the costly part)
    and keeps its measurements from one request to the next."""
    from specsample.app.assemble import Models
    from specsample.decoding.plans import MODEL
    from specsample.serve.app import create_app
    from specsample.serve.settings import Settings

    from serve_helpers import ToyBackend

    target, draft = ToyBackend(0, eos=False), ToyBackend(0, eos=False, name="toy-draft")  # a draft that agrees
    target.delay = 0.004  # a target call costs about the same for 1 or 9 tokens: drafting pays
    models = Models(target, draft, lookup=True)
    policy = models.policy("auto", k_max=8)  # as `specsample serve` makes it: timed at start
    app = create_app(target, models.drafter, models.drafter_name,
                     Settings(model_name="toy", policy=policy))
    prompts = [PROMPT, "the dog ran far away", "a big red cat sat on the mat and then"]
    with running(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        for i, prompt in enumerate(prompts):
            plain = generate(ToyBackend(0, eos=False), WordTokenizer().encode(prompt),
                             GenerationConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0)))
            stream = i % 2 == 1
            answer = client.completions.create(model="toy", prompt=prompt, max_tokens=30, temperature=0,
                                               stream=stream, **({"stream_options": {"include_usage": True}}
                                                                 if stream else {}))
            chunks = list(answer) if stream else [answer]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.text
            usage = chunks[-1].usage.model_dump()["speculative"]
            assert usage["drafter"].startswith("hybrid(")
            assert sum(usage["draft_length_histogram"][1:]) > 0  # it drafted
        sampled = client.completions.create(model="toy", prompt=PROMPT, max_tokens=30, temperature=0.8, seed=4)
        assert sampled.usage.completion_tokens == 30
    # One planner across requests: calibrated once, the draft model's evidence kept;
    # every answer here was cut by max_tokens, which says nothing of how long answers run.
    assert policy.planner.prices.target(1) > 0 and MODEL in policy.acceptance.sources and policy.length.typical.value is None

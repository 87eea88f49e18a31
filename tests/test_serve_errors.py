"""Bad input of every kind gets OpenAI's error shape with the right status, the caps
hold, the API key is required where it should be, and the server keeps serving."""

import json

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from specsample.decoding.drafters import ModelDrafter

from specsample.serve.schemas import MAX_MESSAGES

from serve_helpers import ToyBackend, running, toy_app

pytestmark = pytest.mark.system

GOOD = {"model": "toy", "prompt": "the cat", "max_tokens": 4, "seed": 0}
MESSAGES = [{"role": "user", "content": "the cat"}]


@pytest.fixture(scope="module")
def url():
    app, _ = toy_app(max_tokens=50, max_body_bytes=4096)
    with running(app) as base:
        yield base


def completion(**changes):
    body = {**GOOD, **changes}
    return {k: v for k, v in body.items() if v is not DROP}


def chat(**changes):
    return completion(**{"prompt": DROP, "messages": MESSAGES, **changes})


DROP = object()

@pytest.mark.parametrize("path, body", [("/v1/completions", completion(model=DROP)),
                                        ("/v1/completions", completion(model="")),
                                        ("/v1/chat/completions", chat(model=""))])
def test_an_absent_or_empty_model_is_the_one_served(url, path, body):
    """As llama-server takes it: llama.vim's default config sends "model": ""."""
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text


CASES = [  # (path, body, status, param, words in the message)
    ("/v1/completions", b"{not json", 400, None, "not valid JSON"),
    ("/v1/completions", b'{"model": "toy", "prompt": "a", "temperature": NaN}', 400, None, "NaN"),
    ("/v1/completions", b"[1, 2]", 400, None, "JSON object"),
    ("/v1/completions", completion(prompt=DROP), 400, "prompt", "missing"),
    ("/v1/completions", completion(model="gpt-4"), 404, "model", "not found"),
    ("/v1/completions", completion(temperature="hot"), 400, "temperature", "number"),
    ("/v1/completions", completion(temperature=5), 400, "temperature", "[0, 2]"),
    ("/v1/completions", completion(top_p=0), 400, "top_p", "(0, 1]"),
    ("/v1/completions", completion(top_k=-1), 400, "top_k", "top_k"),
    ("/v1/completions", completion(max_tokens=-3), 400, "max_tokens", "[1, 50]"),
    ("/v1/completions", completion(max_tokens=0), 400, "max_tokens", "[1, 50]"),
    ("/v1/completions", completion(max_tokens=10_000), 400, "max_tokens", "[1, 50]"),
    ("/v1/completions", completion(max_tokens="ten"), 400, "max_tokens", "integer"),
    ("/v1/completions", completion(seed=1.5), 400, "seed", "integer"),
    ("/v1/completions", completion(seed=2**70), 400, "seed", "seed"),
    ("/v1/completions", completion(stop=[str(i) for i in range(17)]), 400, "stop", "at most 16"),
    ("/v1/completions", completion(stop=[""]), 400, "stop", "non-empty"),
    ("/v1/completions", completion(stop=[1]), 400, "stop", "string"),
    ("/v1/completions", completion(stream="yes"), 400, "stream", "boolean"),
    ("/v1/completions", completion(n=0), 400, "n", "n must be in [1, 32]"),
    ("/v1/completions", completion(prompt=["the", "cat"], n=17), 400, "n", "more than 32 choices"),
    ("/v1/completions", completion(n=True), 400, "n", "n"),
    ("/v1/completions", completion(logprobs=21), 400, "logprobs", "logprobs must be in [0, 20]"),
    ("/v1/completions", completion(logprobs=True), 400, "logprobs", "integer"),
    ("/v1/completions", completion(logprobs_mode="softmax"), 400, "logprobs_mode", "raw"),
    ("/v1/completions", completion(best_of=3), 400, "best_of", "best_of"),
    ("/v1/completions", completion(frequency_penalty=3), 400, "frequency_penalty", "[-2, 2]"),
    ("/v1/completions", completion(presence_penalty=-2.5), 400, "presence_penalty", "[-2, 2]"),
    ("/v1/completions", completion(repetition_penalty=0), 400, "repetition_penalty", "(0, 10]"),
    ("/v1/completions", completion(min_p=1.5), 400, "min_p", "[0, 1]"),
    ("/v1/completions", completion(logit_bias={"cat": 1}), 400, "logit_bias", "token ids in [0, 25)"),
    ("/v1/completions", completion(logit_bias={"25": 1}), 400, "logit_bias", "token ids in [0, 25)"),
    ("/v1/completions", completion(logit_bias={"3": 101}), 400, "logit_bias", "[-100, 100]"),
    ("/v1/completions", completion(logit_bias={"3": "up"}), 400, "logit_bias", "number"),
    # str.isdigit takes these: an Arabic-Indic 3 (int() reads it as 3) and a superscript 2 (int() refuses it)
    ("/v1/completions", completion(logit_bias={"\u0663": 1}), 400, "logit_bias", "token ids in [0, 25)"),
    ("/v1/completions", completion(logit_bias={"\u00b2": 1}), 400, "logit_bias", "token ids in [0, 25)"),
    ("/v1/completions", completion(top_k=2**31), 400, "top_k", "top_k must be in [0, 2147483648)"),
    ("/v1/completions", completion(echo="yes"), 400, "echo", "boolean"),
    ("/v1/completions", completion(colour="red"), 400, "colour", "colour"),
    ("/v1/completions", completion(prompt=""), 400, "prompt", "empty"),
    ("/v1/completions", completion(prompt=[]), 400, "prompt", "empty"),
    ("/v1/completions", completion(prompt=" \n\t"), 400, "prompt", "empty"),  # the library's rule, as on the CLI
    ("/v1/completions", completion(prompt=["the"] * 33), 400, "prompt", "at most 32 prompts"),
    ("/v1/completions", completion(prompt=[[3, 4], []]), 400, "prompt", "at least one"),
    ("/v1/completions", completion(prompt=[3, 999]), 400, "prompt", "token ids"),
    ("/v1/completions", completion(prompt=12), 400, "prompt", "prompt"),
    ("/v1/completions", completion(prompt="the " * 300), 400, "prompt", "context of 256 tokens"),
    ("/v1/completions", completion(prompt="the " * 220, max_tokens=50), 400, "max_tokens", "context of 256"),
    ("/v1/chat/completions", chat(messages=[]), 400, "messages", "at least 1"),
    ("/v1/chat/completions", chat(messages=DROP), 400, "messages", "missing"),
    ("/v1/chat/completions", chat(messages="hi"), 400, "messages", "list"),
    ("/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role", "user"),
    ("/v1/chat/completions", chat(messages=[{"role": "user"}]), 400, "messages.0.content", "missing"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content", ""),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "messages.0.content", ""),
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", "tools"),
    ("/v1/chat/completions", chat(echo=True), 400, "echo", "echo"),
    ("/v1/chat/completions", chat(logprobs=3), 400, "logprobs", "boolean"),
    ("/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs", "needs logprobs: true"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=30), 400, "top_logprobs", "[0, 20]"),
    ("/v1/chat/completions", chat(max_completion_tokens=51), 400, "max_tokens", "[1, 50]"),
]


@pytest.mark.parametrize("path,body,status,param,words", CASES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CASES)])
def test_bad_input_gets_an_openai_error(url, path, body, status, param, words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(url + path, headers={"content-type": "application/json"}, timeout=10, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"]
    assert error["type"] == "invalid_request_error"


LONE = "a\ud800b"  # a lone UTF-16 surrogate: JSON's escapes spell it, no UTF-8 text holds it


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", completion(prompt=LONE), "prompt"),
    ("/v1/completions", completion(prompt=["the", LONE]), "prompt.1"),
    ("/v1/completions", completion(suffix=LONE), "suffix"),
    ("/v1/completions", {**completion(), LONE: 1}, "a\\ud800b"),  # a key: named escaped
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": LONE}]), "messages.0.content"),
    ("/infill", {"input_prefix": LONE, "input_suffix": ""}, "input_prefix"),
    ("/infill", {"input_extra": [{"filename": LONE, "text": "x"}]}, "input_extra.0.filename"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
])
@pytest.mark.parametrize("raw", [False, True])
def test_a_lone_surrogate_in_any_text_field_is_a_400_naming_it(url, path, body, param, raw):
    """They were a 500 (UnicodeEncodeError in the tokenizer) everywhere but in chat content;
    `raw`: the surrogate as UTF-8 bytes, which json.loads lets through too."""
    content = json.dumps(body).encode()  # ensure_ascii: "\ud800", as a client's JSON library writes it
    if raw:
        content = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]
    pair = json.dumps(completion(prompt="the cat \U0001F600")).encode()  # "\ud83d\ude00": a pair is one character
    assert httpx.post(url + "/v1/completions", content=pair, headers={"content-type": "application/json"},
                      timeout=10).status_code == 200


def test_a_chat_of_more_messages_than_openai_takes_is_a_400_before_any_tokenizing():
    """20,000 one-letter messages (680 KB) held the shared tokenizer thread for 42 s."""
    app, target = toy_app()
    asked = []
    target.tokenizer.chat_messages = lambda *a, **k: asked.append(1)  # never reached
    with running(app) as base:
        r = httpx.post(base + "/v1/chat/completions", json=chat(messages=MESSAGES * (MAX_MESSAGES + 1)), timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        assert str(MAX_MESSAGES) in r.json()["error"]["message"] and not asked
        r = httpx.post(base + "/tokenize", json={"messages": MESSAGES * (MAX_MESSAGES + 1)}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_a_chat_prompt_being_built_for_a_client_that_left_stops_between_messages():
    from specsample.serve.errors import ClientGone
    from specsample.serve.request_config import chat_prompt
    from specsample.serve.schemas import ChatRequest

    _, target = toy_app()
    request = ChatRequest.model_validate(chat(messages=MESSAGES * 3))
    assert chat_prompt(request, target, lambda: False)
    with pytest.raises(ClientGone):
        chat_prompt(request, target, lambda: True)


def test_neutral_values_of_unsupported_parameters_are_accepted(url):
    r = httpx.post(url + "/v1/completions", json=completion(n=1, logprobs=None, echo=False, presence_penalty=0.0,
                                                            best_of=1, suffix=""), timeout=10)
    assert r.status_code == 200, r.text


def test_wrong_method_and_unknown_path(url):
    assert httpx.get(url + "/v1/completions").status_code == 405
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("chunked", [False, True])
def test_body_size_is_capped(url, chunked):
    big = b'{"model": "toy", "prompt": "' + b"the " * 2000 + b'"}'
    content = iter([big[:3000], big[3000:]]) if chunked else big  # an iterator is sent chunked, without a length
    r = httpx.post(url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_still_serving_after_all_that(url):
    r = httpx.post(url + "/v1/completions", json=GOOD, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_api_key_is_required_except_for_health():
    app, _ = toy_app(api_key="s3cret")
    with running(app) as url:
        assert httpx.get(url + "/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")):
                r = httpx.request(method, url + path, headers=headers, json=GOOD)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="toy", prompt="the cat", max_tokens=3).choices[0].text


@pytest.mark.parametrize("failure", [ValueError("rollback failed"), RuntimeError("llama_decode failed")])
def test_an_engine_failure_mid_generation_is_a_server_error(failure):
    """Once generation runs, a failure is the engine's, whatever its class: a 500 for a
    whole answer, an error event then [DONE] in a stream (after the text so far)."""
    app, target = toy_app(eos=False)
    target.fail_at, target.failure = 3, failure  # prefill, one round, then the engine fails
    body = {**GOOD, "max_tokens": 40}
    with running(app) as url:
        r = httpx.post(url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 500, r.text
        assert r.json()["error"]["type"] == "server_error"
        assert r.json()["error"]["message"] == f"generation failed: {type(failure).__name__}"
        target.calls = 0
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=10) as r:
            events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200  # the headers went out with the first text
        assert json.loads(events[0])["choices"][0]["text"]  # the first round's text
        assert json.loads(events[-2])["error"]["type"] == "server_error" and events[-1] == "[DONE]"
        target.fail_at = None
        assert httpx.post(url + "/v1/completions", json=GOOD, timeout=10).status_code == 200  # still serving


def test_a_request_the_engine_refuses_before_generating_is_still_a_400():
    """stream()'s own checks run in the worker before any round (here the draft's
    context, which the route does not know): a ValueError there is the request's."""
    app, _ = toy_app()
    short = ToyBackend(1, context_length=16, name="short-draft")
    app.state.server.make_drafter = lambda sampling, slot, salt: ModelDrafter(short, sampling)
    with running(app) as url:
        r = httpx.post(url + "/v1/completions", json={**GOOD, "max_tokens": 40}, timeout=10)
        assert r.status_code == 400 and "does not fit the context of the draft model" in r.json()["error"]["message"]
        # A later choice refused once the first one ran is still the request's fault: a
        # 400 for a whole answer, and the 400's body as the error event of a stream.
        body = {**GOOD, "prompt": ["the cat", "the " * 10]}  # the second leaves the short draft no room
        r = httpx.post(url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 400 and "does not fit the context of the draft model" in r.json()["error"]["message"]
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=10) as r:
            events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and json.loads(events[0])["choices"][0]["index"] == 0
        assert json.loads(events[-2])["error"]["type"] == "invalid_request_error" and events[-1] == "[DONE]"


def test_ctx_size_is_the_limit_models_reports_and_a_longer_prompt_gets_a_400(tmp_path):
    """Assembled as `serve --ctx-size 128` assembles (a tiny GGUF trained for 256):
    /v1/models says max_model_len 128, and a prompt over it gets the 400 with the numbers."""
    pytest.importorskip("llama_cpp")
    from specsample.app.assemble import ModelOptions, assemble
    from specsample.serve.app import create_app
    from specsample.serve.settings import Settings

    from tiny_gguf import write_tiny_gguf

    gguf = str(write_tiny_gguf(tmp_path / "tiny.gguf"))
    models = assemble(ModelOptions(target=gguf, draft="ngram", threads=1, ctx_size=128))
    app = create_app(models.target, models.drafter, models.drafter_name, Settings(model_name="tiny", policy=3))
    with running(app) as url:
        assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == 128
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "a" * 150, "max_tokens": 4},
                       timeout=10)
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "context_length_exceeded"
        assert "the prompt has 150 tokens, but this model's context of 128 tokens takes prompts of at most" \
               in error["message"]
        fits = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "a" * 100, "max_tokens": 4},
                          timeout=10)
        assert fits.status_code == 200  # 150 would fit the 256 it was trained for: the limit is --ctx-size


def test_llama_vims_instruction_requests_are_served(url):
    """llama.vim's chat requests (its default config: "model": "", llama-server's fields):
    a warm-up with n_predict 0 and response_fields, then the instruction, streamed with
    its samplers. They were 400s (unsupported id_slot, samplers, n_predict)."""
    warm = {"id_slot": 0, "messages": MESSAGES, "samplers": [], "n_predict": 0, "stream": False,
            "cache_prompt": True, "response_fields": [""], "model": ""}
    r = httpx.post(url + "/v1/chat/completions", json=warm, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "", r.text
    ask = {"id_slot": 0, "messages": MESSAGES, "min_p": 0.1, "temperature": 0.1, "samplers": ["min_p", "temperature"],
           "stream": True, "cache_prompt": True, "model": "", "n_predict": 4}
    r = httpx.post(url + "/v1/chat/completions", json=ask, timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text

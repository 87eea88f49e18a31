"""Fill-in-the-middle over HTTP: `suffix` on /v1/completions and llama-server's /infill
give the same greedy answer, token for token, as the library on the FIM prompt; /infill
answers in llama-server's shape, whole and streamed; a model without FIM tokens and
every bad field get a 400 naming the field."""

import json

import httpx
import pytest

from specsample.app.assemble import Models
from specsample.backends.hf import HFBackend, HFTokenizer
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.fim import ExtraFile, fim_prompt
from specsample.serve.app import create_app
from specsample.serve.settings import Settings

from serve_helpers import running, toy_app
from tiny_hf import tiny_fim_tokenizer, tiny_model

pytestmark = pytest.mark.system

PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nx = add(1, 2)\nprint(x)\n"
GREEDY = {"temperature": 0, "max_tokens": 12}


def fim_pair():
    tokenizer = HFTokenizer(tiny_fim_tokenizer())
    target, draft = (HFBackend(tiny_model(seed, vocab=len(tokenizer)), tokenizer, name=name)
                     for seed, name in ((0, "tiny-fim"), (3, "tiny-fim-draft")))
    for backend in (target, draft):
        backend.eos_token_ids = frozenset()  # answers of max_tokens: a longer comparison
    return target, draft


@pytest.fixture(scope="module")
def served():
    target, draft = fim_pair()
    models = Models(target, draft)
    # Answers are compared with the library's token for token: fresh prefills, since
    # default kernels score a reused prompt's rows in other calls (docs/serve.md).
    settings = Settings(model_name="tiny-fim", policy=3, max_tokens=40, cache_prompt=False)
    app = create_app(target, models.drafter, models.drafter_name, settings)
    with running(app) as url:
        yield url, target


def library_answer(ids):
    """The library's own greedy answer on these prompt ids, on a fresh pair."""
    target, draft = fim_pair()
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=0.0))
    return generate(target, ids, config, ModelDrafter(draft, config.sampling), 3).token_ids


def test_suffix_and_infill_give_the_library_answer_token_for_token(served):
    url, target = served
    expected = library_answer(fim_prompt(target.fim, target.tokenizer.text_ids, PREFIX, SUFFIX))
    completion = httpx.post(url + "/v1/completions", json={"model": "tiny-fim", "prompt": PREFIX, "suffix": SUFFIX,
                                                           "logprobs": 0, **GREEDY}, timeout=60).json()
    infill = httpx.post(url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12,
                                               "temperature": 0}, timeout=60).json()
    assert infill["tokens"] == expected and len(expected) == 12
    assert completion["choices"][0]["logprobs"]["tokens"] == [target.tokenizer.decode([t]) for t in expected]
    assert infill["content"] == completion["choices"][0]["text"] == target.tokenizer.decode(expected)
    assert infill["stop"] is True and infill["stop_type"] == "limit" and infill["tokens_predicted"] == 12
    assert completion["choices"][0]["finish_reason"] == "length"
    assert infill["tokens_evaluated"] == completion["usage"]["prompt_tokens"]


def test_infill_reads_its_extra_files_and_prompt(served):
    url, target = served
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    ids = fim_prompt(target.fim, target.tokenizer.text_ids, PREFIX, SUFFIX, [ExtraFile(**extra[0])], "a")
    r = httpx.post(url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra,
                                          "prompt": "a", "max_tokens": 12, "temperature": 0}, timeout=60).json()
    assert r["tokens_evaluated"] == len(ids) and r["tokens"] == library_answer(ids)


def test_infill_streams_in_llama_servers_shape(served):
    url, _ = served
    body = {"model": "tiny-fim", "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "temperature": 0,
            "cache_prompt": True}
    whole = httpx.post(url + "/infill", json=body, timeout=60).json()
    with httpx.stream("POST", url + "/infill", json={**body, "stream": True}, timeout=60) as r:
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and "[DONE]" not in events  # llama-server ends its own streams without one
    parts = [json.loads(e) for e in events]
    assert all(p["stop"] is False for p in parts[:-1]) and parts[-1]["stop"] is True
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert [t for p in parts for t in p["tokens"]] == whole["tokens"]
    assert parts[-1]["tokens_predicted"] == 12 and parts[-1]["stop_type"] == "limit"


@pytest.fixture(scope="module")
def plain_url():
    app, _ = toy_app(max_tokens=50)  # a word-level toy: no FIM tokens
    with running(app) as url:
        yield url


INFILL = {"input_prefix": "the cat", "input_suffix": "the mat"}
COMPLETION = {"model": "toy", "prompt": "the cat", "max_tokens": 4}

CASES = [  # (fim server?, path, body, status, param, words in the message)
    (False, "/infill", INFILL, 400, "input_suffix", "no fill-in-the-middle tokens"),
    (False, "/v1/completions", {**COMPLETION, "suffix": "the mat"}, 400, "suffix", "no fill-in-the-middle tokens"),
    (True, "/v1/completions", {**COMPLETION, "model": "tiny-fim", "suffix": "x", "echo": True}, 400, "echo",
     "echo and suffix"),
    (True, "/v1/completions", {**COMPLETION, "model": "tiny-fim", "prompt": [1, 2], "suffix": "x"}, 400, "prompt",
     "must be text"),
    (True, "/v1/completions", {**COMPLETION, "model": "tiny-fim", "suffix": 3}, 400, "suffix", "string"),
    (True, "/infill", {**INFILL, "samplers": "kz"}, 400, "samplers", "letter 'z' names no sampler"),
    (True, "/infill", {**INFILL, "samplers": ["top_k", "mirostat"]}, 400, "samplers", "'mirostat' not supported"),
    (True, "/infill", {**INFILL, "samplers": ["infill"]}, 400, "samplers", "after a top_k of 1 to 1000"),
    (True, "/infill", {**INFILL, "samplers": ["top_k", "penalties"], "presence_penalty": 1}, 400, "samplers",
     "penalties come first"),
    (True, "/infill", {**INFILL, "n_indent": -1}, 400, "n_indent", ">= 0"),
    (True, "/infill", {**INFILL, "id_slot": -2}, 400, "id_slot", "-1 (any)"),
    (True, "/infill", {**INFILL, "response_fields": "content"}, 400, "response_fields", "list"),
    (True, "/infill", {**INFILL, "cache_prompt": "yes"}, 400, "cache_prompt", "boolean"),
    (True, "/infill", {**INFILL, "input_prefix": 5}, 400, "input_prefix", "string"),
    (True, "/infill", {**INFILL, "input_extra": [{"filename": "a.py", "text": 1}]}, 400, "input_extra.0.text",
     "string"),
    (True, "/infill", {**INFILL, "input_extra": [{"name": "a.py"}]}, 400, "input_extra.0.name", "Extra"),
    (True, "/infill", {**INFILL, "input_extra": "a.py"}, 400, "input_extra", "list"),
    (True, "/infill", {**INFILL, "n_predict": 41}, 400, "n_predict", "[0, 40]"),
    (True, "/infill", {**INFILL, "n_predict": 5, "max_tokens": 6}, 400, "n_predict", "give one"),
    (True, "/infill", {**INFILL, "n": 2}, 400, "n", "one answer"),
    (True, "/infill", {**INFILL, "logprobs": 2}, 400, "logprobs", "unsupported"),
    (True, "/infill", {**INFILL, "stream": True, "stream_options": {"include_usage": True}}, 400, "stream_options",
     "no stream_options"),
    (True, "/infill", {**INFILL, "temperature": 3}, 400, "temperature", "[0, 2]"),
    (True, "/infill", {**INFILL, "model": "gpt-4"}, 404, "model", "not found"),
    (True, "/infill", {**INFILL, "input_prefix": "the " * 600}, 400, "input_prefix", "context"),
]


@pytest.mark.parametrize("fim,path,body,status,param,words", CASES, ids=[f"{i}-{c[4]}" for i, c in enumerate(CASES)])
def test_bad_fields_get_a_400_naming_them(served, plain_url, fim, path, body, status, param, words):
    url = served[0] if fim else plain_url
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_neutral_values_are_accepted(served, plain_url):
    url, _ = served
    assert httpx.post(url + "/infill", json={**INFILL, "n": 1, "n_predict": -1, "max_tokens": 3}, timeout=60) \
        .json()["tokens_predicted"] == 3  # n_predict -1: max_tokens (or as many as fit)
    r = httpx.post(plain_url + "/v1/completions", json={**COMPLETION, "suffix": ""}, timeout=30)
    assert r.status_code == 200  # an empty suffix is a plain completion, on any model

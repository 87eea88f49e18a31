"""llama.vim's requests to /infill, as its code sends them (autoload/llama.vim: the
completion, and the warm-up that loads extra context with n_predict 0), are answered
with the fields it asks for; its samplers list is applied as llama-server applies it
(the named samplers in that order, the others off, llama.cpp's infill sampler among
them), with the same seeded answer as the library gives for that config; n_indent
cuts the answer where the rule says."""

import httpx
import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.fim import ExtraFile, fim_prompt
from specsample.output.infill_sampler import InfillStep, infill_vocab
from specsample.output.text_stops import IndentStop
from specsample.serve.errors import APIError, ClientGone
from specsample.serve.request_config import Pieces
from specsample.serve.schemas import MAX_EXTRA_CHUNKS

from test_serve_fim import PREFIX, SUFFIX, fim_pair, served  # noqa: F401 (served: the fixture)

pytestmark = pytest.mark.system

TIMINGS = ["timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms", "timings/prompt_per_second",
           "timings/predicted_n", "timings/predicted_ms", "timings/predicted_per_token_ms",
           "timings/predicted_per_second"]
# llama.vim's completion request, field for field (its ring of extra chunks carries a time).
# Its default config (model_fim "") sends "model": "", which llama-server serves.
LLAMA_VIM = {"model": "", "id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX,
             "input_extra": [{"text": "def sub(a, b):\n    return a - b\n", "time": [1733, 52000], "filename": "m.py"}],
             "prompt": "", "n_predict": 12, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
             "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
             "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
             "response_fields": ["content", *TIMINGS, "truncated", "tokens_cached"]}
WARM_UP = {"model": "", "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": LLAMA_VIM["input_extra"],
           "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
           "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}


def infill(url, body):
    r = httpx.post(url + "/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_llama_vims_completion_gets_the_fields_it_asks_for(served):
    url, _ = served
    answer = infill(url, LLAMA_VIM)
    assert set(answer) == set(LLAMA_VIM["response_fields"])
    assert isinstance(answer["content"], str) and answer["timings/predicted_n"] <= 12
    assert answer["truncated"] is False and answer["tokens_cached"] >= answer["timings/prompt_n"]


def test_llama_vims_warm_up_generates_nothing_and_gets_an_empty_object(served):
    url, _ = served
    assert infill(url, WARM_UP) == {}
    whole = infill(url, {**WARM_UP, "response_fields": None})
    assert whole["tokens_predicted"] == 0 and whole["content"] == "" and whole["stop_type"] == "limit"


def test_the_infill_sampler_gives_the_librarys_seeded_answer(served):
    url, target = served
    body = {**LLAMA_VIM, "seed": 7, "t_max_predict_ms": 0, "response_fields": None}
    answer = infill(url, body)
    lib_target, draft = fim_pair()
    sampling = SamplingConfig(top_k=40, top_p=0.9, order=("top_k", "top_p", "infill"), extra_step=InfillStep(infill_vocab(lib_target)))
    config = GenerationConfig(max_new_tokens=12, sampling=sampling, seed=7)
    extra = [(c["filename"], c["text"]) for c in LLAMA_VIM["input_extra"]]
    ids = fim_prompt(lib_target.fim, lib_target.tokenizer.text_ids, PREFIX, SUFFIX, [ExtraFile(*e) for e in extra])
    expected = generate(lib_target, ids, config, ModelDrafter(draft, sampling), 3)
    assert answer["tokens"] == expected.token_ids
    # Named or not, a sampler left out of the list is off: temperature 0.3 here is not applied.
    plain = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "seed": 3, "top_k": 5}
    assert infill(url, {**plain, "temperature": 0.3, "samplers": ["top_k"]})["tokens"] == \
        infill(url, {**plain, "temperature": 1.0})["tokens"]


def test_a_top_k_sampler_named_without_a_top_k_is_llama_servers_40(served):
    """A request written for llama-server's defaults was a 400: our top_k is off, and the
    infill sampler needs one before it."""
    url, _ = served
    body = {**LLAMA_VIM, "seed": 7, "t_max_predict_ms": 0, "response_fields": None}
    without = {k: v for k, v in body.items() if k != "top_k"}
    assert infill(url, without)["tokens"] == infill(url, body)["tokens"]  # LLAMA_VIM's top_k is 40
    r = httpx.post(url + "/infill", json={**without, "top_k": 0}, timeout=60)  # given as off: off
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers", r.text


def test_n_indent_ends_the_answer_at_the_first_line_indented_less(served):
    url, target = served
    newline = target.tokenizer.text_ids("\n")[-1]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 30, "seed": 1, "temperature": 1.0,
            "logit_bias": {str(newline): 12.0}}  # the tiny model's logits are large
    whole = infill(url, body)["content"]
    at = IndentStop(4)(whole, 0)
    assert at is not None  # the biased newlines make lines the rule can cut
    cut = infill(url, {**body, "n_indent": 4})
    assert cut["content"] == whole[:at] and cut["stop_type"] == "limit"


def test_samplers_as_llama_cpps_letter_codes_are_the_same_list_and_an_unknown_letter_is_a_400(served):
    url, _ = served
    body = {**LLAMA_VIM, "seed": 5, "t_max_predict_ms": 0, "response_fields": None}
    assert infill(url, {**body, "samplers": "kpi"})["tokens"] == infill(url, body)["tokens"]
    r = httpx.post(url + "/infill", json={**body, "samplers": "kqi"}, timeout=60)
    assert r.status_code == 400
    assert "'q'" in r.json()["error"]["message"] and r.json()["error"]["param"] == "samplers"


def test_llama_vims_warm_up_readies_the_cache_that_its_next_completion_reuses(served):
    """The warm-up (n_predict 0, cache_prompt) scores its extra chunks into a slot; the
    completion that follows finds them there: llama-server's timings say how many
    prompt tokens were scored (prompt_n) and how many the cache held (cache_n)."""
    url, _ = served
    infill(url, WARM_UP)
    answer = infill(url, {**LLAMA_VIM, "response_fields": None})
    timings = answer["timings"]
    assert timings["cache_n"] > 0 and timings["prompt_n"] + timings["cache_n"] == answer["tokens_evaluated"]
    cold = infill(url, {**LLAMA_VIM, "cache_prompt": False, "response_fields": None})["timings"]
    assert cold["cache_n"] == 0 and cold["prompt_n"] == answer["tokens_evaluated"]


def test_more_extra_chunks_than_the_bound_are_a_400_before_any_tokenizing(served):
    """340,000 empty chunks (1 MB) held the tokenizer thread for minutes, and with it
    every /tokenize and prompt behind them."""
    url, _ = served
    r = httpx.post(url + "/infill", json={**LLAMA_VIM, "input_extra": [{}] * (MAX_EXTRA_CHUNKS + 1)}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra", r.text
    assert httpx.post(url + "/tokenize", json={"prompt": "hello"}, timeout=10).status_code == 200


def test_extra_files_stop_being_tokenized_once_they_overflow_the_context(served):
    url, target = served
    calls = []
    pieces = Pieces(lambda text: calls.append(text) or [1] * len(text), 100, lambda: False, "input_extra")
    with pytest.raises(APIError) as refused:
        fim_prompt(target.fim, pieces, "a", "b", [ExtraFile("f.py", "x" * 30)] * 200)
    assert refused.value.param == "input_extra" and refused.value.code == "context_length_exceeded"
    assert len(calls) < 12  # not the 400 pieces of 200 files
    r = httpx.post(url + "/infill", json={**LLAMA_VIM, "input_extra": [{"text": "x = 1\n" * 300}] * 200}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_prompt_being_built_for_a_client_that_left_stops_between_pieces():
    gone = Pieces(lambda text: [1], 100, lambda: True, "input_extra")
    with pytest.raises(ClientGone):
        gone("x")

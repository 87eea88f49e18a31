"""One table maps our sampling settings onto every peer's request: a new SamplingConfig
field without a row fails here, and each peer's request holds what it held before
the table (the figures in docs/ were measured with those requests)."""

import dataclasses

import pytest
import torch

from benchmarks.peers import HFGenerateMode
from specsample.bench.modes import SETTINGS
from benchmarks.native import completion_request
from benchmarks.peer_sampling import FIELDS, INFILL_ONLY, PEERS, peer_sampling
from benchmarks.serving import ServedMode
from specsample.decoding.sampling import SamplingConfig

from tiny_hf import tiny_backend

pytestmark = pytest.mark.pure


def test_every_sampling_field_has_a_row_for_every_peer():
    assert set(FIELDS) == {f.name for f in dataclasses.fields(SamplingConfig)}
    assert all(len(names) == len(PEERS) for names in FIELDS.values())
    assert all(FIELDS[f].openai for f in FIELDS if f not in INFILL_ONLY)  # our own server takes every control


LLAMA_SERVER_OFF = {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0,
                    "repeat_last_n": -1, "logit_bias": [],
                    "samplers": ["penalties", "temperature", "min_p", "top_k", "top_p"]}


OPENAI_OFF = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
              "logit_bias": {}}


@pytest.mark.parametrize("setting,peer,expected", [
    ("sample", "llama_server", {"temperature": 0.8, "top_k": 0, "top_p": 0.95, **LLAMA_SERVER_OFF}),
    ("greedy", "llama_server", {"temperature": 0.0, "top_k": 1, "top_p": 1.0, **LLAMA_SERVER_OFF}),
    ("sample", "llama_cpp_python", {"temp": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "repeat_penalty": 1.0}),
    ("greedy", "llama_cpp_python", {"temp": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}),
    ("sample", "hf_generate", {"do_sample": True, "temperature": 0.8, "top_k": 0, "top_p": 0.95,
                               "repetition_penalty": 1.0}),
    ("greedy", "hf_generate", {"do_sample": False, "temperature": None, "top_k": None, "top_p": None,
                               "repetition_penalty": 1.0}),
    ("sample", "openai", {"temperature": 0.8, "top_k": 0, "top_p": 0.95, **OPENAI_OFF}),
    ("greedy", "openai", {"temperature": 0.0, "top_k": 0, "top_p": 1.0, **OPENAI_OFF}),
])
def test_each_peer_reads_our_settings_in_its_own_terms(setting, peer, expected):
    assert peer_sampling(peer, SETTINGS[setting]) == expected


def test_the_requests_carry_the_table():
    sampling = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    body = completion_request([1], 4, sampling, 0, (), None)
    assert {k: body[k] for k in peer_sampling("llama_server", sampling)} == peer_sampling("llama_server", sampling)
    ours = ServedMode("ar", "ar", None).request_body("m", [1], 4, sampling, 0, ())
    assert (ours["temperature"], ours["top_k"], ours["top_p"]) == (0.7, 5, 0.9)
    native = ServedMode("llamacpp-server", "llamacpp-server", None).request_body("m", [1], 4, sampling, 0, ())
    assert native["min_p"] == 0.0 and native["top_k"] == 5


@pytest.mark.parametrize("setting", ["greedy", "sample"])
def test_transformers_generate_gets_the_table(monkeypatch, setting):
    target = tiny_backend(0)
    target.eos_token_ids = frozenset({1})
    seen = {}

    def generate(input_ids, **kwargs):
        seen.update(kwargs)
        return torch.cat([input_ids, torch.tensor([[5, 1]])], dim=-1)  # [1, prompt + 2]

    monkeypatch.setattr(target.model, "generate", generate)
    outcome = HFGenerateMode("hf-generate", target).run([3, 4], 8, SETTINGS[setting], seed=0)
    assert outcome.token_ids == [5, 1] and outcome.stop_reason == "eos"
    assert {k: seen[k] for k in peer_sampling("hf_generate", SETTINGS[setting])} == \
        peer_sampling("hf_generate", SETTINGS[setting])


def test_the_new_controls_reach_the_peers_that_mean_the_same():
    sampling = SamplingConfig(temperature=0.7, min_p=0.05, repetition_penalty=1.2, logit_bias={7: 2.5})
    server = peer_sampling("llama_server", sampling)
    assert (server["min_p"], server["repeat_penalty"], server["logit_bias"]) == (0.05, 1.2, [[7, 2.5]])
    hf = peer_sampling("hf_generate", sampling)
    assert (hf["min_p"], hf["repetition_penalty"], hf["sequence_bias"]) == (0.05, 1.2, {(7,): 2.5})
    assert peer_sampling("openai", sampling)["logit_bias"] == {"7": 2.5}


@pytest.mark.parametrize("peer,control", [("llama_server", "presence_penalty"), ("hf_generate", "frequency_penalty"),
                                          ("llama_cpp_python", "repetition_penalty"), ("llama_cpp_python", "logit_bias")])
def test_a_peer_without_our_control_refuses_it_on(peer, control):
    value = {"logit_bias": {3: 1.0}, "repetition_penalty": 1.3}.get(control, 0.5)
    with pytest.raises(ValueError, match="only run with it off"):
        peer_sampling(peer, SamplingConfig(**{control: value}))


def test_a_named_order_reaches_llama_server_as_its_samplers_list_and_no_other_peer():
    from specsample.output.infill_sampler import InfillStep, InfillVocab

    infill = SamplingConfig(top_k=40, top_p=0.9, order=("top_k", "top_p", "infill"),
                            extra_step=InfillStep(InfillVocab(lambda t: b"", frozenset(), None)))
    assert peer_sampling("llama_server", infill)["samplers"] == ["penalties", "top_k", "top_p", "infill"]
    with pytest.raises(ValueError, match="no order"):
        peer_sampling("hf_generate", infill)

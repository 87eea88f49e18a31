"""Our sampling settings in each peer's own request: one row per SamplingConfig field,
one column per peer. A new sampling control gets a row here (a test fails until it
does), and every peer then decodes with it.

Peers:
  llama_server      llama-server's /completion body (native.py; also the native
                    fields its OpenAI route takes, serving.py)
  llama_cpp_python  llama-cpp-python's Llama.generate keyword arguments
  hf_generate       transformers' generate keyword arguments
  openai            an OpenAI /v1/completions body, as `specsample serve` reads it
"""

from __future__ import annotations

from typing import NamedTuple

from ..sampling import SamplingConfig

PEERS = ("llama_server", "llama_cpp_python", "hf_generate", "openai")


class Names(NamedTuple):
    llama_server: str
    llama_cpp_python: str
    hf_generate: str
    openai: str


# SamplingConfig field -> its name in each peer's request. Every peer takes top_k 0
# as off and top_p 1 as off, as we do.
FIELDS = {
    "temperature": Names("temperature", "temp", "temperature", "temperature"),
    "top_k": Names("top_k", "top_k", "top_k", "top_k"),
    "top_p": Names("top_p", "top_p", "top_p", "top_p"),
}

# Greedy (a temperature below MIN_TEMPERATURE) is the argmax in our loop; how each
# peer is told so. llama-server samples at temperature 0 unless top_k is 1;
# transformers wants sampling off and its warpers unset. The others take temperature
# 0 as greedy already.
GREEDY = {
    "llama_server": {"temperature": 0.0, "top_k": 1},
    "hf_generate": {"do_sample": False, "temperature": None, "top_p": None, "top_k": None},
}
SAMPLED = {"hf_generate": {"do_sample": True}}

# The peer's own samplers and penalties that we do not have, turned off, so that it
# draws from the same distribution as our loop.
OFF = {
    "llama_server": {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                     "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0},
    "llama_cpp_python": {"min_p": 0.0, "repeat_penalty": 1.0},
    "hf_generate": {"repetition_penalty": 1.0},
    "openai": {},
}


def peer_sampling(peer: str, sampling: SamplingConfig) -> dict:
    """`sampling` as `peer`'s request fields, the peer's extra samplers off."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    fields = {getattr(names, peer): getattr(sampling, field) for field, names in FIELDS.items()}
    fields.update((GREEDY if sampling.greedy else SAMPLED).get(peer, {}))
    return {**OFF[peer], **fields}

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

from specsample.decoding.sampling import SamplingConfig

PEERS = ("llama_server", "llama_cpp_python", "hf_generate", "openai")


class Names(NamedTuple):
    """A field's name in each peer's request; None where the peer has no control with
    our meaning (then only the field's off value may be asked of it)."""

    llama_server: str | None
    llama_cpp_python: str | None
    hf_generate: str | None
    openai: str | None


# SamplingConfig field -> its name in each peer's request. Every peer takes top_k 0
# as off and top_p 1 as off, as we do. Where a peer's control means something else
# it has no name here: llama.cpp's presence and frequency penalties count the prompt
# too (ours, as OpenAI's and vLLM's, only the generated tokens), llama-cpp-python's
# repetition penalty sees only the last 64 tokens (llama-server's is told to see them
# all, below), and transformers has no presence or frequency penalty.
FIELDS = {
    "temperature": Names("temperature", "temp", "temperature", "temperature"),
    "top_k": Names("top_k", "top_k", "top_k", "top_k"),
    "top_p": Names("top_p", "top_p", "top_p", "top_p"),
    "min_p": Names("min_p", "min_p", "min_p", "min_p"),
    "presence_penalty": Names(None, None, None, "presence_penalty"),
    "frequency_penalty": Names(None, None, None, "frequency_penalty"),
    "repetition_penalty": Names("repeat_penalty", None, "repetition_penalty", "repetition_penalty"),
    "logit_bias": Names("logit_bias", None, "sequence_bias", "logit_bias"),
    # A named order of steps is llama.cpp's samplers list; our server takes it on /infill only.
    "order": Names("samplers", None, None, None),
    "extra_step": Names(None, None, None, None),  # the order's infill step: it goes with the order
}
CARRIED = {"extra_step": "order"}  # fields told to a peer through another field's value
INFILL_ONLY = ("order", "extra_step")  # what our server takes on /infill, not on /v1/completions

# How a field's value is written where the peer wants another shape.
VALUES = {
    ("logit_bias", "llama_server"): lambda bias: [[token, value] for token, value in bias],
    ("logit_bias", "hf_generate"): lambda bias: {(token,): value for token, value in bias} or None,
    ("min_p", "hf_generate"): lambda min_p: min_p or None,  # transformers warns of a 0.0 it would not use
    ("logit_bias", "openai"): lambda bias: {str(token): value for token, value in bias},
    ("order", "llama_server"): lambda order: None if order is None else ["penalties", *order],
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
# draws from the same distribution as our loop. llama-server also gets our order:
# penalties, temperature, min-p, top-k, top-p (its default applies top-p to the
# logits before temperature, another distribution whenever T is not 1), with the
# repetition penalty over the whole context as ours.
OFF = {
    "llama_server": {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                     "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0,
                     "repeat_last_n": -1, "samplers": ["penalties", "temperature", "min_p", "top_k", "top_p"]},
    "llama_cpp_python": {"min_p": 0.0, "repeat_penalty": 1.0},
    "hf_generate": {"repetition_penalty": 1.0},
    "openai": {},
}
DEFAULT = SamplingConfig()


def peer_sampling(peer: str, sampling: SamplingConfig) -> dict:
    """`sampling` as `peer`'s request fields, the peer's extra samplers off. A control
    the peer has no equal of may only be off; asked on, it is refused in one line."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    fields = {}
    for field, names in FIELDS.items():
        if field in CARRIED:
            continue
        value, name = getattr(sampling, field), getattr(names, peer)
        if name is None:
            if value != getattr(DEFAULT, field):
                raise ValueError(f"{peer} has no {field.replace('_', ' ')} that means what ours does; "
                                 f"it can only run with it off")
            continue
        convert = VALUES.get((field, peer))
        fields[name] = convert(value) if convert else value
    fields = {k: v for k, v in fields.items() if v is not None}
    fields.update((GREEDY if sampling.greedy else SAMPLED).get(peer, {}))
    return {**OFF[peer], **fields}

"""What llama.vim (and llama.vscode) send to /infill besides the prompt, as llama-server
reads it: `samplers` (llama.cpp's sampler names, in order, `infill` among them),
`n_indent` and `t_max_predict_ms` (rules that end a suggestion by its text), `n_predict:
0` (the prompt alone, to warm the cache), `response_fields` (the answer's fields to
send), and two it takes without acting on: `id_slot` (a slot to run on: the worker
takes a free one, the answer is the same) and `t_max_prompt_ms` (llama-server sets no
limit for it either)."""

from __future__ import annotations

import dataclasses
import functools

from ..decoding.generate import GenerationConfig
from ..decoding.sampling import STEP_OFF, InvalidSetting, SamplingConfig
from ..output.infill_sampler import InfillStep, infill_vocab
from ..output.text_stops import IndentStop, TimeStop
from .errors import APIError
from .schemas import EditorFields

# llama.cpp's samplers we apply, and those that do nothing at llama-server's defaults
# for their own fields, which this server does not take (dry_multiplier, typ_p, ...):
# naming them asks for nothing.
OURS = ("penalties", "temperature", "min_p", "top_k", "top_p", "infill")
NO_OPS = ("dry", "top_n_sigma", "typ_p", "xtc")
# llama-server's top_k when a request names the top_k sampler without giving one: its
# clients count on it (the infill sampler needs a top_k before it), where ours is off.
LLAMA_SERVER_TOP_K = 40


def editor_config(request: EditorFields, config: GenerationConfig | None, target) -> GenerationConfig | None:
    """The plan's config with the request's samplers and text rules."""
    if request.id_slot is not None and request.id_slot < -1:
        raise APIError(400, f"id_slot must be -1 (any) or a slot number, got {request.id_slot}", param="id_slot",
                       code="invalid_value")
    if request.n_indent is not None and request.n_indent < 0:
        raise APIError(400, f"n_indent must be >= 0, got {request.n_indent}", param="n_indent", code="invalid_value")
    if config is None:
        return None
    sampling = config.sampling
    if request.samplers is not None:
        sampling = ordered_sampling(request.samplers, sampling, target, top_k_given=request.top_k is not None)
    stops = list(config.text_stops)
    if request.n_indent:
        stops.append(IndentStop(request.n_indent))
    if request.t_max_predict_ms is not None and request.t_max_predict_ms > 0:
        stops.append(TimeStop(request.t_max_predict_ms / 1000))
    return dataclasses.replace(config, sampling=sampling, text_stops=tuple(stops))


# llama.cpp's one-letter codes for its samplers (common_sampler_type_to_chr), which
# llama-server takes as a string in place of the list of names.
LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
           "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties"}


def sampler_names(samplers: list[str] | str) -> list[str]:
    """The list of names; a string is llama.cpp's letter codes, one per sampler. llama.cpp
    skips a letter it does not know with a warning in its log; a client never sees that,
    so here it is a 400 that names it."""
    if not isinstance(samplers, str):
        return samplers
    unknown = sorted({c for c in samplers if c not in LETTERS})
    if unknown:
        raise APIError(400, f"samplers: the letter{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} "
                       f"name{'s' * (len(unknown) == 1)} no sampler; llama.cpp's letters are "
                       + ", ".join(f"{c} ({n})" for c, n in LETTERS.items()),
                       param="samplers", code="invalid_value")
    return [LETTERS[c] for c in samplers]


def ordered_sampling(samplers: list[str] | str, sampling: SamplingConfig, target, top_k_given: bool = True
                     ) -> SamplingConfig:
    """llama-server's rule: the samplers named run in that order, the others not at all
    (their fields are then ignored); ours come after logit_bias and the penalties. A
    top_k named but not given (`top_k_given`) is llama-server's default."""
    names = sampler_names(samplers)
    unknown = [n for n in names if n not in OURS + NO_OPS]
    if unknown:
        raise APIError(400, f"samplers: {', '.join(map(repr, unknown))} not supported; this server applies "
                       f"{', '.join(OURS)} (and takes {', '.join(NO_OPS)} at their defaults, which do nothing)",
                       param="samplers", code="unsupported_parameter")
    steps = [n for n in names if n in OURS]
    if sampling.penalised and "penalties" in steps and steps.index("penalties") > 0:
        raise APIError(400, "samplers: the penalties come first on this server (before any other sampler)",
                       param="samplers", code="invalid_value")
    named = set(steps)
    changes = {field: off for step, (field, off) in STEP_OFF.items() if step not in named}
    if "top_k" in named and not top_k_given:
        changes["top_k"] = LLAMA_SERVER_TOP_K
    if "penalties" not in named:
        changes.update(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0)
    order = tuple(s for s in steps if s != "penalties")
    try:
        return dataclasses.replace(sampling, **changes, order=order,
                                   extra_step=infill_step(target) if "infill" in named else None)
    except InvalidSetting as e:
        raise APIError(400, e.message("samplers"), param="samplers", code="invalid_value") from None


@functools.cache
def infill_step(target) -> InfillStep:
    """One per target: its vocabulary keeps the token texts it has looked up."""
    return InfillStep(infill_vocab(target))


def pick_fields(body: dict, paths: list[str] | None) -> dict:
    """llama-server's response_fields: only the named fields, a "/" path reaching into an
    object and coming back under that path as its key; a path that names nothing is left
    out (so [""] gives {}, as llama.vim asks of its warm-up requests)."""
    if paths is None:
        return body
    out = {}
    for path in paths:
        value, found = body, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out

"""Command-line arguments the subcommands share, and their parsing into the library's
own options. Every subcommand module imports this one, never cli.py, so that cli.py
alone knows them all."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from ..decoding.sampling import SamplingConfig
from ..policy.make import K_MAX
from .assemble import ModelOptions, option_flag


class UsageError(Exception):
    pass


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """A flag for every ModelOptions field, made from the field's own metadata."""
    for f in fields(ModelOptions):
        meta = f.metadata
        if meta["type"] is bool:
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            p.add_argument(option_flag(f.name), action=action, default=f.default, help=meta["help"])
        else:
            p.add_argument(option_flag(f.name), type=meta["type"], choices=meta["choices"], default=f.default,
                           help=meta["help"])


def model_options(args) -> ModelOptions:
    return ModelOptions(**{f.name: getattr(args, f.name) for f in fields(ModelOptions)})


def draft_length(value: str) -> int | str:
    """-k: "auto" or an integer; policy/make.check_draft_length says what is wrong with anything else,
    so that a bad value gets the same one-line error as every other bad input."""
    try:
        return int(value)
    except ValueError:
        return value


def add_draft_length_arguments(p: argparse.ArgumentParser, default: int | str = "auto") -> None:
    p.add_argument("-k", type=draft_length, default=default,
                   help=f"draft tokens per round, or 'auto': chosen each round from measured costs and acceptance, "
                        f"0 (a plain step) when drafting does not pay (default {default})")
    p.add_argument("--k-max", type=int, default=K_MAX,
                   help=f"the most drafts -k auto proposes in a round (default {K_MAX})")


def add_trace_argument(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help=f"write -k auto's decisions to FILE, one JSON line per round{what}: the offers, prices and "
                        f"options priced, the choice, the realised time and tokens (`specsample trace FILE` sums "
                        f"them up)")


def check_trace(args) -> None:
    """--trace needs a planner: -k auto, and something to draft."""
    if getattr(args, "trace", None) is not None and (args.k != "auto" or getattr(args, "autoregressive", False)):
        raise UsageError("--trace follows -k auto's decisions: give -k auto and a draft model or lookup")


def add_sampling_controls(p: argparse.ArgumentParser, temperature: float = 0.0) -> None:
    """The SamplingConfig fields, parsed by sampling_config."""
    p.add_argument("--temperature", type=float, default=temperature,
                   help="0 = greedy (default)" if temperature == 0 else f"0 = greedy (default {temperature:g})")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below MIN_P x the top one's probability")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="per generated token seen, in [-2, 2]")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="per occurrence in generated text, in [-2, 2]")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divides the logits of prompt and generated tokens (1 = off)")
    p.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN=BIAS",
                   help="add BIAS in [-100, 100] to token id TOKEN's logit (repeatable)")


def add_verifier_argument(p: argparse.ArgumentParser) -> None:
    from ..decoding.generate import VERIFIERS

    p.add_argument("--verifier", choices=VERIFIERS, default="auto",
                   help="block: block verification, which keeps on average at least as many drafts as rejection, "
                        "token-by-token modified rejection sampling; coupled: Gumbel-max coupling keyed by seed and "
                        "position, so a seed gives the same text whatever drafts it; auto (default): coupled when "
                        "seeded, block otherwise (docs/verification.md)")


def sampling_config(args) -> SamplingConfig:
    bias = dict(_bias_item(item) for item in getattr(args, "logit_bias", None) or [])
    return SamplingConfig(args.temperature, args.top_k, args.top_p, min_p=getattr(args, "min_p", 0.0),
                          presence_penalty=getattr(args, "presence_penalty", 0.0),
                          frequency_penalty=getattr(args, "frequency_penalty", 0.0),
                          repetition_penalty=getattr(args, "repetition_penalty", 1.0), logit_bias=bias)


def _bias_item(item: str) -> tuple[int, float]:
    """TOKEN=BIAS; SamplingConfig checks the ranges (and the loop the vocabulary)."""
    token, _, value = item.partition("=")
    if token.isascii() and token.isdigit():  # as the server reads ids: int() also takes other scripts' digits
        try:
            return int(token), float(value)
        except ValueError:
            pass
    raise UsageError(f"--logit-bias takes TOKEN=BIAS, got {item!r}")

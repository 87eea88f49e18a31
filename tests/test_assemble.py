"""Assembly: options in, target, drafter and policy out, for every caller alike."""

import argparse
import json
from dataclasses import fields, make_dataclass, replace

import pytest

from specsample.app import arguments
from specsample.app import assemble as assemble_module
from specsample.app.arguments import add_model_arguments, model_options
from specsample.app.assemble import ModelOptions, Models, OptionError, assemble, make_drafter, option, option_flag
from specsample.cli import build_parser
from specsample.decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.decoding.plans import FixedK
from specsample.decoding.sampling import SamplingConfig
from specsample.policy.control import Seat

from test_cli import WORDS, save_tiny
from toy import TrigramBackend, random_table

pytestmark = pytest.mark.pure

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    words = ["[UNK]", "[EOS]"] + WORDS + [f"w{i}" for i in range(90 - 2 - len(WORDS))]
    return save_tiny(tmp_path_factory.mktemp("assemble") / "target", 0, words)


def test_make_drafter_builds_each_kind_with_the_given_sampling():
    draft = TrigramBackend(random_table(4, 0), name="d")
    model = make_drafter(draft, SAMPLING, lookup=False)
    assert type(model) is ModelDrafter and model.sampling == SAMPLING and model.backend is draft
    hybrid = make_drafter(draft, SAMPLING, lookup=True, ngram_max=2)
    assert type(hybrid) is HybridDrafter and hybrid.model.sampling == SAMPLING and hybrid.ngram.max_ngram == 2
    assert type(make_drafter(None, SAMPLING, lookup=True)) is NgramDrafter
    assert make_drafter(None, SAMPLING, lookup=False) is None


def test_each_call_gets_a_fresh_drafter_for_its_own_sampling():
    """A server builds one per request: a ModelDrafter must draw from that request's
    distribution, and two requests must not share a drafter's cache bookkeeping."""
    models = Models(TrigramBackend(random_table(4, 0)), TrigramBackend(random_table(4, 1), name="d"), lookup=True)
    a, b = models.drafter(SAMPLING), models.drafter(SamplingConfig(temperature=0))
    assert a is not b and a.model.sampling == SAMPLING and b.model.sampling.greedy
    assert models.drafter_name == a.name


def test_the_adaptive_policy_only_for_auto_with_a_drafter(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path))
    target, draft = TrigramBackend(random_table(4, 0)), TrigramBackend(random_table(4, 1))
    target.cost_key, draft.cost_key = "t", "d"
    policy = Models(target, draft).policy("auto", k_max=5)
    assert isinstance(policy, Seat) and policy.k_max == 5
    assert policy.planner.prices.target(1) > 0  # timed where the models are put together, not by the first request
    [cache] = (tmp_path / "costs").iterdir()
    assert cache.name.endswith("__t__d.json") and len(json.loads(cache.read_text())["target"]) == 6
    assert target.length == draft.length == 0  # the timing left the caches as they were
    fixed = Models(target, draft).policy(3)
    assert isinstance(fixed, FixedK) and fixed.k_max == 3
    nothing_drafts = Models(target).policy("auto")
    assert isinstance(nothing_drafts, FixedK) and len(list((tmp_path / "costs").iterdir())) == 1  # nothing timed


def test_assemble_ngram_autoregressive_and_refusals(tiny_target):
    models = assemble(ModelOptions(target=tiny_target, draft="ngram", lookup=False, ngram_max=2))
    assert models.draft is None and models.lookup  # "ngram" means lookup alone, whatever --lookup says
    assert isinstance(models.drafter(SAMPLING), NgramDrafter)
    assert not assemble(ModelOptions(target=tiny_target), drafting=False).drafts
    with pytest.raises(OptionError, match="--threads must be >= 1"):
        assemble(ModelOptions(target=tiny_target, threads=0))
    with pytest.raises(OptionError, match="needs the hf backend"):
        assemble(ModelOptions(target=tiny_target, draft=tiny_target, draft_backend="llamacpp", draft_vocab=10))


def other_value(f):
    """A value for ModelOptions field `f` other than its default, from its metadata alone."""
    meta = f.metadata
    if meta["choices"]:
        return next(c for c in meta["choices"] if c != f.default)
    if meta["type"] is bool:
        return not f.default
    if meta["type"] in (int, float):
        return meta["type"]((f.default or 0) + 2)
    return "other" if f.default is None else f"{f.default}-other"


def round_trip(options):
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return model_options(parser.parse_args(options.argv()))


@pytest.mark.pure
@pytest.mark.parametrize("name", [f.name for f in fields(ModelOptions)])
def test_every_model_option_round_trips_through_its_flag(name):
    """options -> argv -> argparse -> options, one field changed at a time: the flags,
    their parsing and the child-process argv all come from the one field list."""
    f = next(f for f in fields(ModelOptions) if f.name == name)
    options = replace(ModelOptions(), **{name: other_value(f)})
    assert options != ModelOptions() and round_trip(options) == options
    assert option_flag(name) in options.argv() or f"--no-{name.replace('_', '-')}" in options.argv()


@pytest.mark.pure
def test_all_model_options_at_once_and_the_defaults_round_trip():
    changed = ModelOptions(**{f.name: other_value(f) for f in fields(ModelOptions)})
    assert all(getattr(changed, f.name) != f.default for f in fields(ModelOptions))
    assert round_trip(changed) == changed and round_trip(ModelOptions()) == ModelOptions()


@pytest.mark.pure
def test_a_new_field_needs_no_other_edit(monkeypatch):
    """A field added to ModelOptions gets its flag, its parsing and its place in the
    children's argv with nothing else written."""
    extended = make_dataclass("Extended", [("new_knob", int, option(5, "a knob")),
                                           ("new_switch", bool, option(False, "a switch"))],
                              bases=(ModelOptions,), frozen=True)
    monkeypatch.setattr(arguments, "ModelOptions", extended)
    options = extended(new_knob=7, new_switch=True, threads=2)
    assert options.argv()[-3:] == ["--new-knob", "7", "--new-switch"]
    assert round_trip(options) == options
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert "a knob" in parser.format_help()


@pytest.mark.pure
def test_argv_spells_out_values_a_child_parser_defaults_otherwise():
    """check turns --lookup off by default; a child given ModelOptions() still gets it on."""
    assert "--lookup" in ModelOptions().argv() and "--no-lookup" in ModelOptions(lookup=False).argv()
    assert "--threads" not in ModelOptions().argv() and "--batch-invariant" not in ModelOptions().argv()


def test_every_option_is_checked_before_a_model_loads(monkeypatch, tiny_target):
    """A bad draft option fails before the target's slow load, not after it."""
    monkeypatch.setattr(assemble_module, "load_backend", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(OptionError, match="needs the hf backend"):
        assemble(ModelOptions(target=tiny_target, draft=tiny_target, draft_backend="llamacpp", draft_vocab=10))
    with pytest.raises(OptionError, match="--target-quant"):
        assemble(ModelOptions(target=tiny_target, target_backend="hf", target_quant="q8_0"))
    with pytest.raises(OptionError, match="--threads"):
        assemble(ModelOptions(target=tiny_target, threads=0))


@pytest.mark.pure
@pytest.mark.parametrize("command,required", [("generate", ["--prompt", "x"]), ("serve", []), ("bench", []),
                                              ("check", [])])
def test_every_subcommand_takes_every_model_option(capsys, command, required):
    """The flags come from ModelOptions' fields, so each subcommand parses them all back."""
    changed = ModelOptions(**{f.name: other_value(f) for f in fields(ModelOptions)})
    parser = build_parser()
    for options in (changed, ModelOptions()):
        assert model_options(parser.parse_args([command, *required, *options.argv()])) == options
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert all(option_flag(f.name) in text for f in fields(ModelOptions))

"""`specsample generate --suffix / --suffix-file`: the prompt becomes the prefix of a
fill-in-the-middle prompt made of the model's own FIM tokens; the inputs are checked
before any model loads; a model without FIM tokens is one line of error."""

import json

import pytest

from specsample.app import assemble
from specsample.backends import load_backend
from specsample.cli import main
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.fim import fim_prompt

from test_cli import assert_one_line_error, run
from tiny_hf import tiny_fim_tokenizer, tiny_model

pytestmark = pytest.mark.pure

PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nx = add(1, 2)\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fim-models")
    out = {}
    for name, tokens in (("fim", None), ("plain", ())):
        tokenizer = tiny_fim_tokenizer() if tokens is None else tiny_fim_tokenizer(fim_tokens=tokens)
        tokenizer.save_pretrained(root / name)
        tiny_model(0, vocab=len(tokenizer)).save_pretrained(root / name)
        out[name] = str(root / name)
    return out


def generate_json(capsys, *args):
    code, out, err = run(capsys, "generate", "--backend", "hf", "--max-new-tokens", "8", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_suffix_generates_the_middle_of_the_fim_prompt(capsys, models, tmp_path):
    target = load_backend(models["fim"], "hf")
    ids = fim_prompt(target.fim, target.tokenizer.text_ids, PREFIX, SUFFIX)
    expected = generate(target, ids, GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(0.0))).token_ids
    spec = generate_json(capsys, "--target", models["fim"], "--draft", "ngram", "--prompt", PREFIX, "--suffix", SUFFIX)
    assert spec["token_ids"] == expected and expected
    plain = generate_json(capsys, "--target", models["fim"], "--autoregressive", "--prompt", PREFIX)
    assert generate(target, target.tokenizer.encode(PREFIX), GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(
        0.0))).token_ids == plain["token_ids"]  # without a suffix: the plain prompt, as before
    (tmp_path / "after.py").write_text(SUFFIX)
    from_file = generate_json(capsys, "--target", models["fim"], "--autoregressive", "--prompt", PREFIX,
                              "--suffix-file", str(tmp_path / "after.py"))
    assert from_file["token_ids"] == expected


def test_a_model_without_fim_tokens_is_one_line(capsys, models):
    code, _, err = run(capsys, "generate", "--backend", "hf", "--target", models["plain"], "--draft", "ngram",
                       "--prompt", PREFIX, "--suffix", SUFFIX)
    assert_one_line_error(code, err, "--suffix: ")
    assert "no fill-in-the-middle tokens" in err


@pytest.mark.parametrize("args,message", [
    (["--suffix-file", "/nonexistent/after.py"], "suffix file not found"),
    (["--suffix-file", "LATIN1"], "not UTF-8 text"),
    (["--suffix", "x", "--chat"], "does not go with --chat"),
    (["--prompt", "  ", "--suffix", ""], "the prompt is empty"),  # an empty suffix: a plain prompt, its rules
])
def test_suffix_inputs_are_checked_before_any_model_loads(capsys, monkeypatch, tmp_path, args, message):
    monkeypatch.setattr(assemble, "load_backend", lambda *a, **kw: pytest.fail("loaded a model"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    args = [str(tmp_path / "latin1.txt") if a == "LATIN1" else a for a in args]
    prompt = [] if "--prompt" in args else ["--prompt", "x"]
    code, _, err = run(capsys, "generate", "--target", str(tmp_path), "--draft", "ngram", "--backend", "hf",
                       *prompt, *args)
    assert_one_line_error(code, err, message)


def test_an_empty_prefix_before_a_suffix_is_a_cursor_at_the_start(capsys, models):
    spec = generate_json(capsys, "--target", models["fim"], "--autoregressive", "--prompt", "", "--suffix", SUFFIX)
    assert spec["token_ids"]


def test_suffix_and_suffix_file_are_one_choice(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "x", "--suffix", "a", "--suffix-file", "b"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err

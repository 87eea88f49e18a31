"""specsample generate --json-schema / --regex / --grammar, end to end on tiny
transformers models with a byte-level BPE tokenizer (the kind the grammar engine reads
from a model directory, as it reads Qwen's)."""

import json
import re

import jsonschema
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specsample import cli
from specsample.cli import main

from tiny_hf import tiny_model

pytestmark = pytest.mark.pure

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "w": {"enum": ["yes", "no"]}},
          "required": ["n", "w"], "additionalProperties": False}


def save_tiny(path, seed):
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"eos_token": "<eos>"})
    fast.save_pretrained(path)
    tiny_model(seed, vocab=len(fast) + 8).save_pretrained(path)  # the reloaded tokenizer may add a token
    return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"target": save_tiny(root / "target", 0), "draft": save_tiny(root / "draft", 7)}


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, dirs, *extra):
    return run(capsys, "generate", "--target", dirs["target"], "--draft", dirs["draft"], "--prompt", "answer: ",
               "--max-new-tokens", "40", "--json", *extra)


@pytest.mark.parametrize("sampling", [[], ["--temperature", "1", "--seed", "3"]])
def test_json_schema_regex_and_grammar_outputs_match(capsys, dirs, tmp_path, sampling):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "x=" NUM ";"\nNUM: /[0-9]{1,3}/\n')
    valid = lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None  # noqa: E731 (raises when not)
    for option, check in ((["--json-schema", str(schema)], valid),
                          (["--regex", "id-[a-c]{2,4}!"], lambda t: re.fullmatch("id-[a-c]{2,4}!", t) is not None),
                          (["--grammar", str(grammar)], lambda t: re.fullmatch("x=[0-9]{1,3};", t) is not None)):
        code, out, err = generate(capsys, dirs, *option, *sampling)
        assert code == 0, err
        result = json.loads(out)
        assert result["stop_reason"] == "grammar" and check(result["text"]), result["text"]
        assert result["stats"]["forced_tokens"] > 0  # each starts with forced text: '{"n": ', "id-", "x="


def test_greedy_constrained_speculative_output_equals_the_autoregressive_one(capsys, dirs, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    outputs = [json.loads(generate(capsys, dirs, "--json-schema", str(schema), *extra)[1])["token_ids"]
               for extra in ([], ["-k", "3"], ["--autoregressive"])]
    assert outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("option,content,message", [
    ("--json-schema", '{"type": "objec"}', "invalid JSON schema"),
    ("--json-schema", "{oops", "not JSON"),
    ("--grammar", "start: foo", "invalid grammar"),
    ("--regex", "(ab", "invalid regex"),
    ("--json-schema", None, "file not found"),
])
def test_a_bad_schema_grammar_or_regex_is_one_line_and_exit_2_before_any_model_loads(
        capsys, monkeypatch, tmp_path, option, content, message):
    monkeypatch.setattr(cli, "assemble", lambda *a, **k: pytest.fail("loaded models for a bad constraint"))
    value = content
    if option != "--regex":
        value = str(tmp_path / "missing")
        if content is not None:
            (tmp_path / "f").write_text(content)
            value = str(tmp_path / "f")
    code, out, err = run(capsys, "generate", "--prompt", "hi", option, value)
    assert code == 2 and message in err and err.count("\n") == 1


def test_one_constraint_at_a_time(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "hi", "--regex", "a", "--grammar", "g.lark"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err

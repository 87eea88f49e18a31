import errno
import json
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specsample import cli
from specsample.app import assemble
from specsample.backends.context_size import ModelContext
from specsample.cli import main

from tiny_hf import tiny_model

pytestmark = pytest.mark.pure

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def save_tiny(path, seed, vocab_words, chat_template=None):
    vocab = {w: i for i, w in enumerate(vocab_words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
    fast.chat_template = chat_template
    fast.save_pretrained(path)
    tiny_model(seed).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    words = ["[UNK]", "[EOS]"] + WORDS + [f"w{i}" for i in range(90 - 2 - len(WORDS))]
    return {
        "target": save_tiny(root / "target", 0, words),
        "draft": save_tiny(root / "draft", 7, words),
        "small": save_tiny(root / "small", 7, words[:80]),  # a different vocabulary
        # A template that refuses a lone user turn, as some refuse a system turn.
        "strict": save_tiny(root / "strict", 0, words, chat_template=STRICT_TEMPLATE),
    }


STRICT_TEMPLATE = ("{% if messages|length < 2 %}{{ raise_exception('Conversations must start with a system turn') }}"
                   "{% endif %}{% for m in messages %}{{ m.content }} {% endfor %}")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_has_text_ids_and_stats(capsys, tiny_dirs):
    base = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "the cat sat on",
            "--max-new-tokens", "12", "-k", "3", "--json"]
    code, out, err = run(capsys, *base)
    assert code == 0
    spec = json.loads(out)
    assert set(spec) >= {"text", "token_ids", "stats"}
    assert set(spec["stats"]) >= {"new_tokens", "target_calls", "draft_calls", "acceptance_rate",
                                  "mean_tokens_per_target_call", "tokens_per_second"}
    assert spec["stats"]["new_tokens"] == len(spec["token_ids"]) == 12
    code, out, _ = run(capsys, *base, "--autoregressive")
    ar = json.loads(out)
    assert ar["token_ids"] == spec["token_ids"]  # greedy by default
    assert ar["stats"]["target_calls"] == 11  # the first token comes from the prompt prefill


def test_generate_takes_the_sampling_controls_and_prints_logprobs(capsys, tiny_dirs):
    base = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "the cat sat on",
            "--max-new-tokens", "10", "-k", "3", "--json", "--logprobs", "2"]
    code, out, _ = run(capsys, *base)
    plain = json.loads(out)
    assert [lp["token"] for lp in plain["logprobs"]] == plain["token_ids"]
    assert all(len(lp["top"]) == 2 and lp["logprob"] <= 0 for lp in plain["logprobs"])
    banned = plain["token_ids"][0]
    code, out, _ = run(capsys, *base, "--logit-bias", f"{banned}=-100", "--frequency-penalty", "2")
    controlled = json.loads(out)
    assert code == 0 and banned not in controlled["token_ids"]
    # greedy with a frequency penalty of 2 repeats less than plain greedy
    assert len(set(controlled["token_ids"])) >= len(set(plain["token_ids"]))


def test_generate_streams_text_and_prints_stats_to_stderr(capsys, tiny_dirs):
    code, out, err = run(capsys, "generate", "--target", tiny_dirs["target"], "--draft", "ngram", "--prompt",
                         "the cat sat on the mat the cat", "--max-new-tokens", "8", "--temperature", "0.8", "--seed", "3")
    assert code == 0
    assert out.strip() and "tokens/s" in err and "acceptance" in err


def test_generate_traces_its_rounds_and_the_trace_command_sums_them(capsys, tiny_dirs, tmp_path):
    path = tmp_path / "trace.jsonl"
    base = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt",
            "the cat sat on the mat the cat", "--max-new-tokens", "12", "--json"]
    code, out, _ = run(capsys, *base, "--trace", str(path))
    assert code == 0
    traced = json.loads(out)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == sum(traced["stats"]["draft_length_histogram"])  # a line per round
    assert sum(s["emitted"] for line in lines for s in line["seqs"]) == traced["stats"]["new_tokens"]
    assert json.loads(run(capsys, *base)[1])["token_ids"] == traced["token_ids"]  # greedy: the same text
    code, out, _ = run(capsys, "trace", str(path))
    assert code == 0 and out.startswith(f"{len(lines)} rounds") and "| round kind |" in out


@pytest.mark.parametrize("args,message", [
    (["-k", "3", "--trace", "unused.jsonl"], "--trace follows -k auto"),
    (["--target", "no-such-model"], "unknown model"),
    (["--target", "/nonexistent/model.gguf"], "not found"),
    (["-k", "0"], "k must be"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-3"], "top-k"),
    (["--prompt", "   "], "empty"),
    (["--draft", "SMALL"], "vocabularies differ"),
    (["--prompt", "cat " * 600], "context"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "not found"),
    (["--stop", "x", "--stop", ""], "stop strings must not be empty"),
    (["--target", "STRICT", "--chat"], "must start with a system turn"),
    (["--min-p", "2"], "min-p"),
    (["--presence-penalty", "3"], "presence-penalty"),
    (["--repetition-penalty", "0"], "repetition-penalty"),
    (["--logit-bias", "cat=2"], "TOKEN=BIAS"),
    (["--logit-bias", "3=500"], "logit-bias"),
    (["--logit-bias", "3=nan"], "logit-bias"),
    (["--logit-bias", "\u0663=1"], "TOKEN=BIAS"),  # an Arabic-Indic 3: int() reads it, the server does not
    (["--logit-bias", "5000=1"], "logit-bias maps token ids in [0, "),  # past the vocabulary: refused, not dropped
    (["--temperature", "inf"], "temperature"),
    (["--top-p", "nan"], "top-p"),
    (["--presence-penalty", "nan"], "presence-penalty"),
    (["--logprobs", "21"], "logprobs"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tiny_dirs, args, message):
    args = [tiny_dirs[a.lower()] if a in ("SMALL", "STRICT") else a for a in args]
    defaults = {"--target": tiny_dirs["target"], "--draft": tiny_dirs["draft"]}
    if "--prompt-file" not in args and "--prompt" not in args:
        defaults["--prompt"] = "the cat"
    for flag, value in defaults.items():
        if flag not in args:
            args = [flag, value, *args]
    code, out, err = run(capsys, "generate", *args)
    assert code == 2
    assert message in err
    assert len(error_lines(err)) == 1 and "Traceback" not in err


def error_lines(err: str) -> list[str]:
    """stderr's lines but the note of the context chosen (assemble.context_size)."""
    return [line for line in err.strip().splitlines() if not line.startswith("specsample: context ")]


def assert_one_line_error(code, err, message):
    assert code == 2
    lines = error_lines(err)
    assert lines[0].startswith("specsample: error:") and message in err
    assert len(lines) == 1 and "Traceback" not in err


@pytest.mark.parametrize("args,cuda_devices,message", [
    (["--device", "nonsense"], 0, "not a torch device"),
    (["--device", "cuda"], 0, "no cuda device is available"),  # torch asserted, after the load
    (["--device", "cuda:1"], 1, "numbered 0 to 0"),
    (["--threads", "-1"], 0, "--threads must be >= 1"),
])
def test_bad_device_or_threads_fail_before_any_model_loads(capsys, monkeypatch, args, cuda_devices, message):
    monkeypatch.setattr(assemble, "load_backend", lambda *a, **kw: pytest.fail("loaded a model"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    code, _, err = run(capsys, "generate", "--prompt", "the cat", *args)
    assert_one_line_error(code, err, message)


@pytest.mark.parametrize("args,message", [
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt-file", "/dev/null"], "the prompt is empty"),  # a character device: read, and empty
    (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file not found"),
    (["--prompt-file", "DIR"], "cannot be read"),
    (["--prompt-file", "LATIN1"], "not UTF-8 text"),
    (["--json-schema", "/nonexistent/schema.json"], "--json-schema file not found"),
    (["--draft-backend", "llamacpp", "--draft-vocab", "10"], "needs the hf backend"),
    (["--target-backend", "hf", "--target-quant", "q8_0"], "--target-quant"),
])
def test_every_input_is_checked_before_any_model_loads(capsys, monkeypatch, tmp_path, args, message):
    monkeypatch.setattr(assemble, "load_backend", lambda *a, **kw: pytest.fail("loaded a model"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    files = {"DIR": str(tmp_path), "LATIN1": str(tmp_path / "latin1.txt")}
    args = [files.get(a, a) for a in args]
    prompt = [] if "--prompt" in args or "--prompt-file" in args else ["--prompt", "the cat"]
    code, _, err = run(capsys, "generate", "--target", str(tmp_path), "--draft", str(tmp_path), "--backend", "hf",
                       *prompt, *args)
    assert_one_line_error(code, err, message)


def test_a_prompt_from_a_pipe_is_read(capsys, tmp_path, tiny_dirs):
    """--prompt-file <(echo ...): a process substitution is a FIFO, not a regular file."""
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("the cat sat on",), daemon=True)
    writer.start()
    base = ["generate", "--target", tiny_dirs["target"], "--draft", "ngram", "--max-new-tokens", "6", "--json"]
    code, piped, err = run(capsys, *base, "--prompt-file", str(fifo))
    writer.join(timeout=10)
    assert code == 0, err
    code, given, _ = run(capsys, *base, "--prompt", "the cat sat on")
    assert json.loads(piped)["token_ids"] == json.loads(given)["token_ids"]


def failing(error):
    def fail(*args, **kwargs):
        raise error
    return fail


HUB_MISS = OSError("Qwen/Qwen2.5-0.5Bx is not a local folder and is not a valid model identifier listed on "
                   "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token")
DISK_FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("command,module,patched,error,message", [
    (["generate", "--prompt", "x", "--target", "Qwen/Qwen2.5-0.5Bx"], assemble, "load_backend", HUB_MISS,
     "not a valid model identifier"),
    (["generate", "--prompt", "x"], assemble, "load_backend", DISK_FULL, "No space left on device"),
    (["fetch"], cli, "fetch_default", DISK_FULL, "No space left on device"),
])
def test_load_and_fetch_failures_are_one_line_and_exit_2(capsys, monkeypatch, command, module, patched, error, message):
    monkeypatch.setattr(module, patched, failing(error))
    # The context is chosen from the files before the load (which fails here), and a hub id is not read.
    monkeypatch.setattr(assemble, "model_context", lambda name, *a, **k: ModelContext(name, 4096, 0))
    code, _, err = run(capsys, *command)
    assert_one_line_error(code, err, message)


def test_an_engine_failure_mid_stream_is_one_line_and_exit_2(capsys, monkeypatch, tiny_dirs):
    def stream(*args, **kwargs):
        yield SimpleNamespace(text="the")
        raise RuntimeError("llama_decode failed at position 4096 (draft)")

    monkeypatch.setattr(cli, "stream", stream)
    code, out, err = run(capsys, "generate", "--target", tiny_dirs["target"], "--draft", "ngram", "--prompt", "the cat")
    assert out == "the"
    assert_one_line_error(code, err, "llama_decode failed")


@pytest.mark.parametrize("backend,module,package", [("llamacpp", "llama_cpp", "llama-cpp-python"),
                                                    ("hf", "transformers", "transformers")])
def test_a_backend_whose_package_is_missing_is_one_line(capsys, monkeypatch, tmp_path, backend, module, package):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")  # never read: the missing package is found first
    monkeypatch.setitem(sys.modules, module, None)  # `import llama_cpp` fails as if not installed
    code, _, err = run(capsys, "generate", "--target", str(model), "--draft", "ngram", "--backend", backend,
                       "--prompt", "x")
    assert_one_line_error(code, err, f"needs {package}")
    assert f"specsample[{backend}]" in err

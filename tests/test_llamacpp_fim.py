"""A GGUF's FIM tokens as llama.cpp reads them, on tiny GGUF files llama.cpp loads:
recognised by their text (Qwen2.5-Coder's spellings), named by the file's
tokenizer.ggml.fim_*_token_id keys, or absent; and user text that spells one stays text."""

import pytest

from specsample.backends.fim_tokens import FimFormat
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.fim import fim_prompt

from tiny_gguf import write_tiny_gguf

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.pure



def load(path):
    from specsample.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend(path, threads=1, share_cores=False)


def test_qwen_spelled_tokens_are_recognised_by_their_text(tmp_path):
    backend = load(write_tiny_gguf(tmp_path / "qwen.gguf"))  # <|endoftext|>, prefix, middle, suffix, pad, repo, sep
    assert backend.fim == FimFormat(prefix=258, suffix=260, middle=259, pad=261, repo=262, file_sep=263)
    assert backend.eos_token_ids == {257, 261, 262, 263}  # llama.cpp ends at pad, repo and file-separator too


def test_the_files_own_keys_name_the_tokens(tmp_path):
    keys = {"tokenizer.ggml.fim_pre_token_id": 259, "tokenizer.ggml.fim_suf_token_id": 258,
            "tokenizer.ggml.fim_mid_token_id": 260}
    path = write_tiny_gguf(tmp_path / "keys.gguf", specials=("<|endoftext|>", "<a>", "<b>", "<c>"), metadata=keys)
    assert load(path).fim == FimFormat(prefix=259, suffix=258, middle=260)


def test_a_gguf_without_fim_tokens_has_none(tmp_path):
    assert load(write_tiny_gguf(tmp_path / "chat.gguf", specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))).fim \
        is None


def test_a_fim_prompt_on_llama_cpp_keeps_user_text_as_text(tmp_path):
    backend = load(write_tiny_gguf(tmp_path / "qwen.gguf"))
    fim, tokenizer = backend.fim, backend.tokenizer
    assert tokenizer.text_ids("<|fim_middle|>") == list(b"<|fim_middle|>")  # byte tokens, not the control token
    ids = fim_prompt(fim, tokenizer.text_ids, "x = <|fim_middle|>", "\ny")
    assert ids.count(fim.middle) == 1 and ids[-1] == fim.middle
    result = generate(backend, ids, GenerationConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=0.0)))
    assert 1 <= len(result.token_ids) <= 4  # the engine takes the prompt and answers


def test_the_infill_sampler_reads_llama_cpps_own_token_texts(tmp_path):
    from specsample.output.infill_sampler import infill_vocab

    backend = load(write_tiny_gguf(tmp_path / "qwen.gguf"))
    vocab = infill_vocab(backend)
    ids = backend.tokenizer.text_ids("ab")
    assert b"".join(vocab.text(t) for t in ids) == b"ab"
    assert vocab.text(258) == b"" and vocab.eog == backend.eos_token_ids  # a special token writes nothing
    assert vocab.eot in backend.eos_token_ids

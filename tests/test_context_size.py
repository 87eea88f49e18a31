"""--ctx-size: the one choice of context for target and draft (the trained one, lowered
to fit in memory, or the size asked for), the sizes it reads from GGUF headers and
transformers configs, and assemble loading both models with it."""

import pytest

from specsample.app import assemble as assemble_module
from specsample.app.assemble import ModelOptions, OptionError, assemble
from specsample.backends import model_context
from specsample.backends.context_size import ModelContext, choose_context, config_context, gguf_context
from specsample.backends.gguf_header import GGUFHeaderError, gguf_metadata

from test_assemble import tiny_target  # noqa: F401 (a fixture: a tiny hf model directory)
from tiny_gguf import write_tiny_gguf
from tiny_hf import tiny_model

pytestmark = pytest.mark.pure

GB = 10**9
# The default pair's bytes a token (context_size.py's docstring works them out).
TARGET = ModelContext("target", 32768, 28672)
DRAFT = ModelContext("draft", 32768, 12288)


@pytest.mark.parametrize("requested,models,sequences,available,size,note", [
    # auto: the trained context where its caches take at most half the memory
    (0, [TARGET, DRAFT], 1, 22 * GB, 32768, "trained context (1.34 GB of KV cache for 1 sequence, 22.00 GB"),
    # auto, lowered: the docstring's worked example, 2 slots sharing 32768 in 2 GB
    (0, [TARGET, DRAFT], 2, 2 * GB, 12032, "lowered from the trained 32768"),
    # auto on many slots: the trained context shared among them, never below 4096 each
    (0, [TARGET, DRAFT], 4, 22 * GB, 8192, "trained 32768 shared among 4 sequences"),
    (0, [TARGET, DRAFT], 8, 22 * GB, 4096, "shared among 8 sequences"),
    (0, [TARGET, DRAFT], 16, 22 * GB, 4096, "shared among 16 sequences"),
    (0, [ModelContext("small", 2048, 100)], 8, 22 * GB, 2048, "small's trained context"),
    # the shortest trained context of the pair rules
    (0, [TARGET, ModelContext("draft", 2048, 12288)], 1, 22 * GB, 2048, "draft's trained context"),
    # a model whose cache size is unknown gets its trained context
    (0, [ModelContext("rnn", 4096, 0)], 1, 1, 4096, "KV cache size unknown"),
    # an explicit size is kept, silently where it fits, with a warning where it does not
    (1000, [TARGET, DRAFT], 8, 22 * GB, 1000, None),
    (32768, [TARGET, DRAFT], 8, 5 * GB, 32768, "--ctx-size 32768: 10.74 GB of KV cache for 8 sequences"),
])
def test_the_context_chosen_and_its_note(requested, models, sequences, available, size, note):
    got, said = choose_context(requested, models, sequences, {"memory": available})
    assert got == size
    assert said is None if note is None else note in said


def test_refusals_name_the_model_and_the_numbers():
    with pytest.raises(ValueError, match="--ctx-size 40000 is over draft's trained context of 32000"):
        choose_context(40000, [TARGET, ModelContext("draft", 32000, 12288)], 1, {"memory": 22 * GB})
    with pytest.raises(ValueError, match="0 \\(auto\\) or a number"):
        choose_context(-1, [TARGET], 1, {"memory": 22 * GB})
    with pytest.raises(ValueError, match="not even 256 tokens of context fit"):
        choose_context(0, [TARGET], 8, {"memory": 10**6})


def test_the_tightest_memory_pool_decides():
    """A transformers target on a GPU and a llama.cpp draft in host memory: the GPU's
    few free bytes lower the context, whatever the host has."""
    gpu_target = ModelContext("target", 32768, 57344, pool="cuda:0")
    size, note = choose_context(0, [gpu_target, DRAFT], 1, {"memory": 100 * GB, "cuda:0": GB})
    assert size == GB // 2 // 57344 // 256 * 256 == 8704 and "cuda:0 available" in note


def test_a_gguf_header_gives_the_sizes_llama_cpp_reads(tmp_path):
    """One layer of 2 KV heads of 32 / 4 = 8 wide: (8 + 8) x 2 heads x 2 bytes = 64 a token."""
    import gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", context_length=640)
    metadata = gguf_metadata(path)
    reader = gguf.GGUFReader(path)  # the reference reader, which also parses every array
    scalars = {k: f.contents() for k, f in reader.fields.items() if k.startswith("llama.")}
    assert scalars and all(metadata[k] == pytest.approx(v) for k, v in scalars.items())
    assert "tokenizer.ggml.tokens" not in metadata  # the vocabulary is stepped over
    assert gguf_context("tiny", metadata) == ModelContext("tiny", 640, 64)
    per_layer = {**metadata, "llama.block_count": 3, "llama.attention.head_count_kv": [2, 0, 1],
                 "llama.attention.key_length": 16}
    assert gguf_context("swa", per_layer).bytes_per_token == (2 + 0 + 1) * (16 + 8) * 2
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(GGUFHeaderError, match="cut short"):  # a one-line error, not a struct.error
        gguf_metadata(cut)


def test_a_transformers_config_gives_its_sizes():
    """2 layers of 2 KV heads of 32 / 4 = 8, keys and values, float32: 256 bytes a token."""
    assert config_context("tiny", tiny_model(0).config, 4) == ModelContext("tiny", 512, 256)


def test_assemble_loads_target_and_draft_with_the_context_chosen(tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    target = str(write_tiny_gguf(tmp_path / "target.gguf", context_length=512))
    draft = str(write_tiny_gguf(tmp_path / "draft.gguf", seed=1, context_length=384))
    assert model_context(target) == ModelContext("target.gguf", 512, 64)
    options = ModelOptions(target=target, draft=draft, draft_quant="none", threads=1)
    models = assemble(options, sequences=2)
    assert models.target.context_length == models.draft.context_length == 384  # the draft's shorter training rules
    assert "context 384 tokens, draft.gguf's trained context" in capsys.readouterr().err
    lib, target_ctx = models.target._lib, models.target._ctx
    assert lib.llama_n_ctx(target_ctx) >= 2 * 384  # each of the 2 sequences gets its whole context
    models = assemble(ModelOptions(**{**options.__dict__, "ctx_size": 100}))
    assert models.target.context_length == models.draft.context_length == 100
    assert capsys.readouterr().err == ""  # a size asked for that fits needs no note


def test_a_size_over_the_trained_context_is_refused_before_any_load(monkeypatch, tmp_path, tiny_target):  # noqa: F811
    monkeypatch.setattr(assemble_module, "load_backend", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(OptionError, match="--ctx-size 600 is over target's trained context of 512"):
        assemble(ModelOptions(target=tiny_target, draft="ngram", ctx_size=600))


def test_the_hf_backend_is_capped_too(tiny_target):  # noqa: F811
    """max_position_embeddings is 512; --ctx-size lowers what a generation may fill, on
    every sequence."""
    models = assemble(ModelOptions(target=tiny_target, draft=tiny_target, ctx_size=100, lookup=False), sequences=2)
    assert models.target.context_length == models.draft.context_length == 100
    assert {s.context_length for s in models.target.backends} == {100}  # each sequence a sibling

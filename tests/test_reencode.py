"""Re-encoded GGUF files (draft requantization, target encodings): made once, reused
only while they are the copy of this very source, remade when damaged, a bad type
refused in one line. llama.cpp's quantizer is replaced by a copy of small GGUF files
that the gguf package writes; everything else is the real code."""

import ctypes
import hashlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specsample import files
from specsample.backends import llamacpp, reencode
from specsample.backends.llamacpp import LoadError
from specsample.backends.models import ModelError

pytestmark = pytest.mark.pure


def tiny_gguf(path: Path, value: float) -> Path:
    """A valid GGUF file of one 4x8 float32 tensor filled with `value`: files made
    with different values have the same name-independent size."""
    import gguf

    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("tiny")
    writer.add_tensor("weight", np.full((4, 8), value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def weights(path: Path) -> float:
    import gguf

    (tensor,) = gguf.GGUFReader(path).tensors
    return float(tensor.data.flat[0])


class Params(ctypes.Structure):
    _fields_ = [("ftype", ctypes.c_int), ("allow_requantize", ctypes.c_bool), ("nthread", ctypes.c_int)]


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path / "cache"))
    made = []

    def quantize(source, out, params):
        made.append(params._obj.ftype)
        shutil.copyfile(source.decode(), out.decode())  # the weight values survive, as they do in llama.cpp's
        return 0

    lib = SimpleNamespace(llama_model_quantize_default_params=Params, llama_model_quantize=quantize,
                          **{name: code for code, name in enumerate(sorted(reencode.FTYPES.values()))})
    monkeypatch.setattr(llamacpp, "_llama", lambda: lib)
    source = tiny_gguf(tmp_path / "model.gguf", 1.0)
    return source, made, lib


def source_key(path: Path) -> str:
    import gguf

    return gguf.GGUFReader(path).get_field(reencode.SOURCE_KEY).contents()


@pytest.mark.parametrize("quant", ["bf16", "f16", "q8_0", "q4_0"])
def test_a_file_is_re_encoded_once_then_reused(fake_llama, quant):
    source, made, lib = fake_llama
    path = reencode.reencoded(source, quant)
    assert weights(path) == 1.0 and made == [getattr(lib, reencode.FTYPES[quant])]
    assert source_key(path) == hashlib.sha256(source.read_bytes()).hexdigest()  # the key travels in the file
    assert reencode.reencoded(source, quant) == path and len(made) == 1
    assert reencode.reencoded(source, "q4_1") != path  # each type its own file


def test_the_cached_copy_is_found_but_never_made(fake_llama):
    source, made, _ = fake_llama
    assert reencode.cached_reencoding(source, "bf16") is None and made == []
    path = reencode.reencoded(source, "bf16")
    assert reencode.cached_reencoding(source, "bf16") == path and len(made) == 1
    assert reencode.cached_reencoding(source, "f16") is None  # another type is another copy
    path.write_bytes(path.read_bytes()[:-8])  # damaged: not a copy to use
    assert reencode.cached_reencoding(source, "bf16") is None and len(made) == 1


def test_another_file_of_the_same_name_and_size_gets_its_own_copy(fake_llama, tmp_path):
    source, made, _ = fake_llama
    (tmp_path / "B").mkdir()
    other = tiny_gguf(tmp_path / "B" / "model.gguf", 2.0)
    assert other.stat().st_size == source.stat().st_size and other.name == source.name
    assert weights(reencode.reencoded(source, "q8_0")) == 1.0
    assert weights(reencode.reencoded(other, "q8_0")) == 2.0 and len(made) == 2
    # The same file rewritten in place is another model too.
    tiny_gguf(source, 3.0)
    assert weights(reencode.reencoded(source, "q8_0")) == 3.0 and len(made) == 3


def test_the_source_is_hashed_once_per_change(fake_llama, monkeypatch):
    source, made, _ = fake_llama
    hashed = []
    real = files.sha256_of
    monkeypatch.setattr(files, "sha256_of", lambda path: hashed.append(path.name) or real(path))
    path = reencode.reencoded(source, "q4_0")
    assert hashed == ["model.gguf"]
    assert reencode.reencoded(source, "q4_0") == path and hashed == ["model.gguf"]  # the stamp answers
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert reencode.reencoded(source, "q4_0") == path and hashed == ["model.gguf"] * 2 and len(made) == 1
    assert not list(source.parent.glob("*.json")) and not list(source.parent.glob("*.sha256"))  # nothing beside it


def test_a_damaged_copy_is_made_again(fake_llama):
    source, made, _ = fake_llama
    path = reencode.reencoded(source, "q4_0")
    size = path.stat().st_size
    with open(path, "r+b") as f:  # random bytes over the weights, the size unchanged
        f.seek(size - 64)
        f.write(os.urandom(64))
    assert reencode.reencoded(source, "q4_0") == path and len(made) == 2
    assert weights(path) == 1.0 and path.stat().st_size == size


def test_a_copy_without_this_source_s_key_is_not_reused(fake_llama):
    source, made, _ = fake_llama
    path = reencode.reencoded(source, "q4_0")
    tiny_gguf(path, 1.0)  # a GGUF put there by hand: no key, though its stamp is brought up to date
    files.remember_sha256(path, path.with_name(path.name + ".sha256"), files.sha256_of(path))
    assert reencode.reencoded(source, "q4_0") == path and len(made) == 2
    assert source_key(path) == hashlib.sha256(source.read_bytes()).hexdigest()


def test_a_copy_that_cannot_be_loaded_is_made_again_once(fake_llama, capsys):
    source, made, _ = fake_llama
    loads = []

    def load(path):
        loads.append(path)
        if len(loads) == 1:
            raise LoadError(f"llama.cpp could not load {path}")
        return "loaded"

    assert reencode.load_reencoded(source, "q4_0", load) == "loaded" and len(made) == 2
    assert "re-encoding model.gguf to q4_0 again" in capsys.readouterr().err

    def never(path):
        raise LoadError(f"llama.cpp could not load {path}")

    with pytest.raises(LoadError):  # once: a file the engine cannot load at all fails, it does not loop
        reencode.load_reencoded(source, "q4_0", never)
    assert len(made) == 3


def test_load_backend_remakes_a_copy_that_llama_cpp_cannot_load(fake_llama, monkeypatch):
    from specsample.backends import load_backend

    source, made, _ = fake_llama
    loads = []

    def load_llamacpp(path, **kw):
        loads.append((path, kw["name"]))
        if len(loads) == 1:
            raise LoadError(f"llama.cpp could not load {path}")
        return path

    monkeypatch.setattr(llamacpp, "load_llamacpp", load_llamacpp)
    path = load_backend(str(source), "llamacpp", quant="q4_0")
    assert loads == [(path, "model.gguf-q4_0")] * 2 and len(made) == 2 and weights(path) == 1.0


def damaged_backend(logits: list[float]):
    """A LlamaCppBackend over a stub engine whose decode yields these logits."""
    row = (ctypes.c_float * len(logits))(*logits)
    backend = object.__new__(llamacpp.LlamaCppBackend)
    backend.__dict__.update(
        name="draft-q4_0", path=Path("/cache/requantized/draft-q4_0.gguf"), _share=None, _n_batch=4, _lengths=[0], _tokens=[[]],
        _n_vocab=len(logits), vocab_size=len(logits), _ctx=None,
        _batch=SimpleNamespace(token=[0] * 4, pos=[0] * 4, n_seq_id=[0] * 4, seq_id=[[0] for _ in range(4)],
                               logits=[0] * 4, n_tokens=0),
        _lib=SimpleNamespace(llama_decode=lambda ctx, batch: 0, llama_batch_free=lambda batch: None,
                             llama_get_logits_ith=lambda ctx, i: ctypes.cast(row, ctypes.POINTER(ctypes.c_float))))
    return backend


def test_non_finite_logits_from_a_gguf_name_the_file_and_the_fix():
    from specsample.backends.base import BackendError

    assert damaged_backend([0.5, 1.0, -2.0]).score([1, 2], num_logits=1).tolist() == [[0.5, 1.0, -2.0]]
    with pytest.raises(BackendError) as e:
        damaged_backend([0.5, float("nan"), -2.0]).score([1, 2], num_logits=1)
    message = str(e.value)
    assert "/cache/requantized/draft-q4_0.gguf" in message and "delete that file" in message
    assert "float16" not in message and "\n" not in message


def test_a_bad_type_is_refused_in_one_line(fake_llama):
    source, made, _ = fake_llama
    with pytest.raises(ModelError, match="unknown weight type 'q5_q'; choose from .*bf16") as e:
        reencode.reencoded(source, "q5_q")
    assert "\n" not in str(e.value) and not made


def test_the_engine_refusing_leaves_nothing_behind(fake_llama):
    source, _, lib = fake_llama
    lib.llama_model_quantize = lambda source, out, params: 1
    with pytest.raises(ModelError, match="could not re-encode model.gguf to bf16"):
        reencode.reencoded(source, "bf16")
    assert not list((source.parent / "cache" / "requantized").glob("*.gguf"))

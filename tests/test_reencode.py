"""Re-encoded GGUF files (draft requantization, target encodings): made once, reused,
a bad type refused in one line."""

import ctypes
from pathlib import Path
from types import SimpleNamespace

import pytest

from specsample.backends import llamacpp, reencode
from specsample.models import ModelError

pytestmark = pytest.mark.pure


class Params(ctypes.Structure):
    _fields_ = [("ftype", ctypes.c_int), ("allow_requantize", ctypes.c_bool), ("nthread", ctypes.c_int)]


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path / "cache"))
    made = []

    def quantize(source, out, params):
        made.append(params._obj.ftype)
        Path(out.decode()).write_bytes(b"re-encoded " + Path(source.decode()).read_bytes())
        return 0

    lib = SimpleNamespace(llama_model_quantize_default_params=Params, llama_model_quantize=quantize,
                          **{name: code for code, name in enumerate(sorted(reencode.FTYPES.values()))})
    monkeypatch.setattr(llamacpp, "_llama", lambda: lib)
    source = tmp_path / "model.gguf"
    source.write_bytes(b"weights")
    return source, made, lib


@pytest.mark.parametrize("quant", ["bf16", "f16", "q8_0", "q4_0"])
def test_a_file_is_re_encoded_once_then_reused(fake_llama, quant):
    source, made, lib = fake_llama
    path = reencode.reencoded(source, quant)
    assert path.read_bytes() == b"re-encoded weights" and made == [getattr(lib, reencode.FTYPES[quant])]
    assert reencode.reencoded(source, quant) == path and len(made) == 1
    assert reencode.reencoded(source, "q4_1") != path  # each type its own file


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

"""A GGUF model re-encoded to another weight type once, then cached: one function for
both roles.

Draft: requantized to a type with faster CPU kernels. Its quality moves only the
acceptance rate, never the output distribution (verification keeps that exactly the
target's), so it may be requantized freely. Q4_0 is the default: llama.cpp repacks
it for AVX2/AVX-512 matrix kernels, and a draft step of the default 0.5B fell from
15.0 to 10.5 ms on an earlier session's 2-core machine (docs/results/draft-quant-*).

Target: re-encoded to full precision (bf16, f16) or q8_0. The default pair ships only
Q4_K_M, whose calls are compute-bound on a small CPU; a bf16 copy has the cost
structure of a full-precision model (calls that read 3.1x the bytes and are bound by
memory bandwidth), which is where speculative decoding pays. Speed depends on the
weights' types and sizes, not their values: the copy holds the Q4_K_M values
dequantized, so its outputs, and the draft's acceptance, barely move.

Each file is made once (seconds to a minute) by llama.cpp's own quantizer and cached
beside the other converted models, written atomically (files.build_once).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..files import build_once
from ..models import ModelError, cache_dir

FTYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
          "bf16": "LLAMA_FTYPE_MOSTLY_BF16", "f16": "LLAMA_FTYPE_MOSTLY_F16"}
DRAFT_QUANTS = ("q4_0", "q4_1", "q8_0", "iq4_nl", "q3_k_m")
TARGET_QUANTS = ("bf16", "f16", "q8_0")


def reencoded(source: Path, quant: str) -> Path:
    """`source` re-encoded to `quant` (a key of FTYPES), made once and cached."""
    if quant not in FTYPES:
        raise ModelError(f"unknown weight type {quant!r}; choose from {', '.join(FTYPES)}")
    stat = source.stat()
    out = cache_dir() / "requantized" / f"{source.stem}-{stat.st_size}-{quant}.gguf"
    if out.is_file():
        return out
    from .llamacpp import _llama

    lib = _llama()  # also silences llama.cpp's log
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, FTYPES[quant])
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1

    def quantize(tmp: Path) -> None:
        if lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise ModelError(f"llama.cpp could not re-encode {source.name} to {quant}")

    return build_once(out, quantize, ready=Path.is_file)


def file_type(path: Path) -> str:
    """The weight type a GGUF file was written as, in llama.cpp's words ("q4_k_m",
    "bf16", ...), read from its metadata without loading the weights."""
    from .llamacpp import _llama

    lib = _llama()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelError(f"llama.cpp could not read {path}")
    try:
        buf = ctypes.create_string_buffer(64)
        if lib.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf)) < 0:
            return "unknown"
        code = int(buf.value)
    finally:
        lib.llama_model_free(model)
    names = {getattr(lib, name): name for name in dir(lib) if name.startswith("LLAMA_FTYPE_")}
    name = names.get(code, "unknown")
    return name.removeprefix("LLAMA_FTYPE_MOSTLY_").removeprefix("LLAMA_FTYPE_").lower()

"""A draft model requantized to a type with faster CPU kernels.

The draft's quality moves only the acceptance rate, never the output distribution
(verification keeps that exactly the target's), so the draft may be requantized
freely. Q4_0 is the default: llama.cpp repacks it for AVX2/AVX-512 matrix kernels,
and a draft step of the default 0.5B fell from 15.0 to 10.5 ms on this project's
2-core machine (docs/results/draft-quant-*; issue 8 reports 34 to 27 ms on another). The file is made once (a few
seconds) and cached beside the other converted models.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..files import build_once
from ..models import ModelError, cache_dir

QUANT_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
               "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
               "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M"}


def requantized(source: Path, quant: str) -> Path:
    if quant not in QUANT_TYPES:
        raise ModelError(f"unknown draft quantization {quant!r}; choose from {', '.join(QUANT_TYPES)}")
    stat = source.stat()
    out = cache_dir() / "requantized" / f"{source.stem}-{stat.st_size}-{quant}.gguf"
    if out.is_file():
        return out
    from .llamacpp import _llama

    lib = _llama()  # also silences llama.cpp's log
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, QUANT_TYPES[quant])
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1

    def quantize(tmp: Path) -> None:
        if lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise ModelError(f"llama.cpp could not requantize {source.name} to {quant}")

    return build_once(out, quantize, ready=Path.is_file)

"""A GGUF model re-encoded to another weight type once, then cached: one function for
both roles.

Draft: requantized to a type with faster CPU kernels. Its quality moves only the
acceptance rate, never the output distribution (verification keeps that exactly the
target's), so it may be requantized freely. Q4_0 is the default: llama.cpp repacks
it for AVX2/AVX-512 matrix kernels, which made the default 0.5B's draft step faster
(docs/benchmarks.md: the draft-quant runs, with their commands).

Target: re-encoded to full precision (bf16, f16) or q8_0. The default pair ships only
Q4_K_M, whose calls are compute-bound on a small CPU; a bf16 copy has the cost
structure of a full-precision model (calls that read 3.1x the bytes and are bound by
memory bandwidth), which is where speculative decoding pays. Speed depends on the
weights' types and sizes, not their values: the copy holds the Q4_K_M values
dequantized, so its outputs, and the draft's acceptance, barely move.

Each file is made once (seconds to a minute) by llama.cpp's own quantizer and cached
beside the other converted models, written atomically (files.build_once). It is keyed
by the source's content, not its name: the source's sha256 (stamped in the cache with
the file's size and mtime_ns, so it is computed once per change of the source) names
the file and is written into its GGUF metadata, where reuse checks it. The copy's own
sha256, recorded when it was made, is checked again whenever the copy changes, and a
copy that fails the check, or that llama.cpp cannot load, is made again.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable, TypeVar

from ..files import build_once, content_sha256, locked, read_cached_json, remember_sha256, sha256_of, verified_sha256
from .models import ModelError, cache_dir

FTYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
          "bf16": "LLAMA_FTYPE_MOSTLY_BF16", "f16": "LLAMA_FTYPE_MOSTLY_F16"}
DRAFT_QUANTS = ("q4_0", "q4_1", "q8_0", "iq4_nl", "q3_k_m")
TARGET_QUANTS = ("bf16", "f16", "q8_0")


SOURCE_KEY = "specsample.source_sha256"  # GGUF metadata: the sha256 of the file it was made from

Loaded = TypeVar("Loaded")


def _cached_copy(source: Path, quant: str) -> tuple[Path, str, Callable[[Path], bool]]:
    """Where `source` re-encoded to `quant` is cached, the source's key, and the check
    that a file there is a whole copy of this very source."""
    if quant not in FTYPES:
        raise ModelError(f"unknown weight type {quant!r}; choose from {', '.join(FTYPES)}")
    # The source's stamp lives in our cache: the model's own folder may be read-only.
    where = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:32]
    key = content_sha256(source, cache_dir() / "hashes" / f"{where}.json")
    out = cache_dir() / "requantized" / f"{source.stem}-{key[:16]}-{quant}.gguf"
    stamp = out.with_name(out.name + ".sha256")

    def ready(path: Path) -> bool:
        made = read_cached_json(stamp)
        return (path.is_file() and isinstance(made, dict) and isinstance(made.get("sha256"), str)
                and verified_sha256(path, stamp, made["sha256"]) and _source_key(path) == key)

    return out, key, ready


def cached_reencoding(source: Path, quant: str) -> Path | None:
    """The re-encoded copy of `source` if one is cached and whole, else None (never
    makes one: for callers that use a copy only where it costs nothing)."""
    out, _, ready = _cached_copy(source, quant)
    return out if ready(out) else None


def reencoded(source: Path, quant: str, *, rebuild: bool = False) -> Path:
    """`source` re-encoded to `quant` (a key of FTYPES), made once and cached;
    `rebuild`: made again even if a copy is cached."""
    out, key, ready = _cached_copy(source, quant)
    stamp = out.with_name(out.name + ".sha256")
    if rebuild:
        with locked(out):
            out.unlink(missing_ok=True)
    from .llamacpp import _llama

    lib = _llama()  # also silences llama.cpp's log
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, FTYPES[quant])
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1

    def quantize(tmp: Path) -> None:
        raw = tmp.with_name("quantized.gguf")  # in build_once's private folder
        if lib.llama_model_quantize(str(source).encode(), str(raw).encode(), ctypes.byref(params)) != 0:
            raise ModelError(f"llama.cpp could not re-encode {source.name} to {quant}")
        _copy_with_key(raw, tmp, key)
        remember_sha256(tmp, stamp, sha256_of(tmp))  # the rename keeps the size and mtime it stamps

    return build_once(out, quantize, ready=ready)


def load_reencoded(source: Path, quant: str, load: Callable[[Path], Loaded]) -> Loaded:
    """`load` applied to the re-encoded copy of `source`; a copy that the engine
    cannot load (damaged after its stamp, or by a crash mid-write) is made once more."""
    from .llamacpp import LoadError

    path = reencoded(source, quant)
    try:
        return load(path)
    except LoadError as e:
        print(f"specsample: {e}; re-encoding {source.name} to {quant} again", file=sys.stderr, flush=True)
    return load(reencoded(source, quant, rebuild=True))


def _source_key(path: Path) -> str | None:
    """The source key in `path`'s metadata, read from its header alone (gguf_header:
    GGUFReader parses the whole vocabulary, seconds on every load of a cached copy)."""
    from .gguf_header import gguf_metadata

    try:
        key = gguf_metadata(path).get(SOURCE_KEY)
    except Exception:  # noqa: BLE001 - a damaged header fails in struct or mmap in many ways; all mean "not this copy"
        return None
    return key if isinstance(key, str) else None


def _copy_with_key(raw: Path, out: Path, key: str) -> None:
    """`raw` copied to `out` with SOURCE_KEY added to its metadata (as gguf's own
    gguf_new_metadata script does: the header grows, so every tensor moves)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

    reader = GGUFReader(raw)
    arch = reader.get_field(Keys.General.ARCHITECTURE)
    writer = GGUFWriter(out, arch=arch.contents() if arch else None, endianess=reader.endianess)
    alignment = reader.get_field(Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself, or virtual
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    writer.add_key_value(SOURCE_KEY, key, GGUFValueType.STRING)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


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

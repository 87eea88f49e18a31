"""A GGUF file's metadata scalars, read from its header alone.

gguf's GGUFReader parses every array into numpy objects, seconds of work for the
default draft's 151,936-token vocabulary. The sizes that set a context (layers, KV
heads, trained length) are scalars, so this reader keeps those (and short integer
arrays: a per-layer head_count_kv) and steps over the rest.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value type -> struct format (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
SHORT_ARRAY = 1024  # per-layer values; longer arrays (vocabularies, merges) are skipped


class GGUFHeaderError(ValueError):
    pass


def gguf_metadata(path: Path) -> dict[str, object]:
    """key -> value for every scalar and short numeric array in the header."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFHeaderError(f"{path} is not a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return _read(data, path)
            except struct.error:
                raise GGUFHeaderError(f"{path}: its GGUF header is cut short (a truncated or damaged file)") from None


def _read(data, path: Path) -> dict[str, object]:
    version, _tensors, count = struct.unpack_from("<IQQ", data, 4)
    if not 2 <= version <= 3:
        raise GGUFHeaderError(f"{path}: GGUF version {version} (a big-endian file?) is not read here")
    reader, metadata = _Reader(data, 24), {}
    for _ in range(count):
        key = reader.string()
        value = reader.value(reader.unpack("<I"))
        if value is not None:
            metadata[key] = value
    return metadata


class _Reader:
    def __init__(self, data, offset: int):
        self.data, self.offset = data, offset

    def unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.offset += n
        return bytes(self.data[self.offset - n : self.offset]).decode("utf-8", "replace")

    def value(self, kind: int):
        """The value of type `kind` at the offset; None for what is skipped."""
        if kind in SCALARS:
            return self.unpack("<" + SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise GGUFHeaderError(f"unknown GGUF value type {kind}")
        item, n = self.unpack("<I"), self.unpack("<Q")
        if item in SCALARS:
            size = struct.calcsize(SCALARS[item])
            values = struct.unpack_from(f"<{n}{SCALARS[item]}", self.data, self.offset) if n <= SHORT_ARRAY else None
            self.offset += n * size
            return list(values) if values is not None else None
        if item == STRING:  # a vocabulary: 151,936 strings in Qwen's; this loop is the reader's time
            offset, length = self.offset, _U64.unpack_from
            for _ in range(n):
                offset += 8 + length(self.data, offset)[0]
            self.offset = offset
            return None
        for _ in range(n):  # nested arrays: each has its own length
            self.value(item)
        return None

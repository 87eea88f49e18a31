"""Model engines behind one small interface (see base.py)."""

from __future__ import annotations

from ..models import ModelError, cache_dir, resolve

BACKENDS = ("hf", "llamacpp")


def load_backend(name: str, backend: str = "hf", *, device: str = "cpu", dtype: str = "float32", threads: int | None = None):
    """A ready backend for a model name: short name, .gguf path, directory or hub id."""
    model = resolve(name)
    if backend == "hf":
        from .hf import load_hf

        converted = None
        if model.gguf_file:
            key = model.sha256[:16] if model.sha256 else f"{model.gguf_path.stat().st_size}-{int(model.gguf_path.stat().st_mtime)}"
            converted = cache_dir() / "converted" / f"{model.gguf_path.stem}-{key}-{dtype}"
        return load_hf(model.location, model.gguf_file, device=device, dtype=dtype, name=model.name, converted_dir=converted)
    if backend == "llamacpp":
        if model.gguf_path is None:
            raise ModelError(f"the llamacpp backend needs a .gguf file, and {name} is not one")
        from .llamacpp import load_llamacpp

        return load_llamacpp(model.gguf_path, name=model.name, threads=threads)
    raise ModelError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")

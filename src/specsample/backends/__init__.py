"""Model engines behind one small interface (see base.py)."""

from __future__ import annotations

import importlib.util

from .models import ModelError, cache_dir, check_hub_reachable, resolve

BACKENDS = ("auto", "hf", "llamacpp")
# backend -> (the module it imports, the package that provides it); the extra is the backend's name.
ENGINE_PACKAGES = {"hf": ("transformers", "transformers"), "llamacpp": ("llama_cpp", "llama-cpp-python")}


def require_engine(backend: str) -> None:
    """A one-line error now, rather than an ImportError from deep in the load."""
    module, package = ENGINE_PACKAGES[backend]
    if importlib.util.find_spec(module) is None:
        raise ModelError(f"the {backend} backend needs {package}, which is not installed here: "
                         f"pip install 'specsample[{backend}]'")


def pick_backend(name: str, backend: str = "auto", device: str = "cpu") -> str:
    """"auto": llama.cpp for GGUF files on the CPU (quantised kernels, ~10x the
    tokens/s of dequantised float32 here), transformers for model directories, hub
    ids and CUDA devices."""
    if backend != "auto":
        return backend
    if resolve(name).gguf_path is not None and device == "cpu" and importlib.util.find_spec("llama_cpp"):
        return "llamacpp"
    return "hf"


def _engine_and_model(name: str, backend: str, device: str):
    """The engine that serves `name` and the model resolved, with the checks both
    reading its header and loading it make first: the engine's package, before any
    file is read, and a .gguf file for llama.cpp."""
    backend = pick_backend(name, backend, device)
    if backend in ENGINE_PACKAGES:
        require_engine(backend)
    model = resolve(name)
    if backend == "llamacpp" and model.gguf_path is None:
        raise ModelError(f"the llamacpp backend needs a .gguf file, and {name} is not one")
    return backend, model


def model_context(name: str, backend: str = "auto", *, device: str = "cpu", dtype: str = "float32"):
    """What the model `name` asks of a context on `backend` (context_size.ModelContext),
    read before loading it: from its GGUF header, else its transformers config."""
    from .context_size import config_context, gguf_context

    backend, model = _engine_and_model(name, backend, device)
    from .hf import DTYPES  # torch's dtypes; transformers is imported only for a config below

    if backend == "hf" and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    # llama.cpp keeps its cache in f16 and on the host; transformers in the model's dtype, on its device.
    value_bytes, pool = (2, "memory") if backend == "llamacpp" else \
        (DTYPES[dtype].itemsize, "memory" if device == "cpu" else device)
    if model.gguf_path is not None:
        from .gguf_header import gguf_metadata

        return gguf_context(model.name, gguf_metadata(model.gguf_path), value_bytes, pool)
    from transformers import AutoConfig

    if model.hub:
        check_hub_reachable(model.location)
    return config_context(model.name, AutoConfig.from_pretrained(model.location), value_bytes, pool)


def load_backend(name: str, backend: str = "auto", *, device: str = "cpu", dtype: str = "float32",
                 threads: int | None = None, quant: str | None = None, batch_invariant: bool = False,
                 sequences: int = 1, n_ctx: int | None = None, workers=None):
    """A ready backend for a model name: short name, .gguf path, directory or hub id.
    `quant` (llama.cpp only): re-encode the GGUF file to this type first (cached).
    `batch_invariant` (llama.cpp only): logits that do not depend on the call's size.
    `sequences` (llama.cpp): how many it holds at once, in one context (batching.py);
    an hf model gets its sequences from assemble.hold_sequences.
    `workers` (llama.cpp only, rpc.RpcWorkers): the layers live on these RPC workers
    (whether drafting runs during its calls is the pair's placement, which assembly
    decides: assemble.pair_overlaps).
    `n_ctx`: each sequence's context, at most the trained one (assemble chooses it,
    context_size.py); None: 4096 on llama.cpp, which allocates its cache at load, the
    trained context on hf, whose cache grows with use."""
    backend, model = _engine_and_model(name, backend, device)
    if backend == "hf":
        if batch_invariant:
            raise ModelError("--batch-invariant is a llama.cpp setting; the hf backend has none")
        if workers is not None:
            raise ModelError("--target-rpc places a llama.cpp model on RPC workers; the hf backend has none")
        from .hf import load_hf

        if model.hub:
            check_hub_reachable(model.location)
        converted = None
        if model.gguf_file:
            key = model.sha256[:16] if model.sha256 else f"{model.gguf_path.stat().st_size}-{int(model.gguf_path.stat().st_mtime)}"
            converted = cache_dir() / "converted" / f"{model.gguf_path.stem}-{key}-{dtype}"
        return load_hf(model.location, model.gguf_file, device=device, dtype=dtype, name=model.name,
                       converted_dir=converted, n_ctx=n_ctx)
    if backend == "llamacpp":
        from .llamacpp import LLAMACPP_CONTEXT, load_llamacpp

        kw = dict(threads=threads, batch_invariant=batch_invariant, sequences=sequences, n_ctx=n_ctx or LLAMACPP_CONTEXT,
                  workers=workers)
        if quant:
            from .reencode import load_reencoded

            label = f"{model.name}-{quant}"
            return load_reencoded(model.gguf_path, quant, lambda path: load_llamacpp(path, name=label, **kw))
        return load_llamacpp(model.gguf_path, name=model.name, **kw)
    raise ModelError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")

"""Exact speculative sampling (Chen et al. 2023) for Hugging Face and llama.cpp models."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
    from .decoding.generate import GenerationConfig, GenerationResult, GenerationStats, generate, stream
    from .decoding.plans import FixedK
    from .decoding.sampling import SamplingConfig, logits_to_probs
    from .decoding.suffix import SuffixDrafter, SuffixIndex
    from .decoding.verify import verify, verify_block
    from .output.constraints import Constraint
    from .policy.control import Planner
    from .policy.make import make_policy

# The library's names load on first use (PEP 562), not with the package: every process
# under it imports the package first, and an RPC worker's llama.cpp child
# (`python -m specsample.backends.rpc_front`) needs none of them, nor the 1.6 s of
# `import torch` they bring.
_HOME = {
    "HybridDrafter": "decoding.drafters", "ModelDrafter": "decoding.drafters", "NgramDrafter": "decoding.drafters",
    "GenerationConfig": "decoding.generate", "GenerationResult": "decoding.generate",
    "GenerationStats": "decoding.generate", "generate": "decoding.generate", "stream": "decoding.generate",
    "FixedK": "decoding.plans", "SamplingConfig": "decoding.sampling", "logits_to_probs": "decoding.sampling",
    "SuffixDrafter": "decoding.suffix", "SuffixIndex": "decoding.suffix",
    "verify": "decoding.verify", "verify_block": "decoding.verify",
    "Constraint": "output.constraints", "Planner": "policy.control", "make_policy": "policy.make",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

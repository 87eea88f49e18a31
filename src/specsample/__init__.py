"""Exact speculative sampling (Chen et al. 2023) for Hugging Face and llama.cpp models."""

from .decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from .decoding.generate import GenerationConfig, GenerationResult, GenerationStats, generate, stream
from .decoding.plans import FixedK
from .decoding.sampling import SamplingConfig, logits_to_probs
from .decoding.suffix import SuffixDrafter, SuffixIndex
from .decoding.verify import verify, verify_block
from .output.constraints import Constraint
from .policy.make import make_policy
from .policy.control import Planner

__all__ = [
    "Constraint", "FixedK", "GenerationConfig", "GenerationResult", "GenerationStats", "HybridDrafter",
    "ModelDrafter", "NgramDrafter", "Planner", "SamplingConfig", "SuffixDrafter", "SuffixIndex", "generate",
    "logits_to_probs", "make_policy", "stream", "verify", "verify_block",
]

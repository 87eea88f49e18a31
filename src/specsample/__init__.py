"""Exact speculative sampling (Chen et al. 2023) for Hugging Face and llama.cpp models."""

from .constraints import Constraint
from .calibrate import make_policy
from .control import Planner
from .drafters import HybridDrafter, ModelDrafter, NgramDrafter
from .generate import GenerationConfig, GenerationResult, GenerationStats, generate, stream
from .plans import FixedK
from .sampling import SamplingConfig, logits_to_probs
from .verify import verify

__all__ = [
    "Constraint", "FixedK", "GenerationConfig", "GenerationResult", "GenerationStats", "HybridDrafter",
    "ModelDrafter", "NgramDrafter", "Planner", "SamplingConfig", "generate", "logits_to_probs", "make_policy",
    "stream", "verify",
]

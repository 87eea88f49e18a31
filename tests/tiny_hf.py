"""Tiny randomly initialised Hugging Face models built from a config (no download)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specsample.backends.hf import HFBackend

VOCAB = 96


def tiny_model(seed: int, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so drafts get accepted
        model.lm_head.weight.mul_(40)
    return model


def tiny_backend(seed: int, name: str | None = None) -> HFBackend:
    return HFBackend(tiny_model(seed), name=name or f"tiny-{seed}")

"""Tiny randomly initialised Hugging Face models built from a config (no download)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specsample.backends.hf import HFBackend

VOCAB = 96


def tiny_model(seed: int, layers: int = 2, vocab: int = VOCAB, sharpen: float = 40.0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so drafts get accepted
        model.lm_head.weight.mul_(sharpen)
    return model


def tiny_backend(seed: int, name: str | None = None) -> HFBackend:
    return HFBackend(tiny_model(seed), name=name or f"tiny-{seed}")


WINDOW = 4  # shorter than every test sequence, so the window is really used

# Architectures whose transformers cache has sliding-window layers: all of them (Mistral,
# Gemma 3 here), or every other one (Gemma 2, gpt-oss).
WINDOWED = ("mistral", "gemma2", "gemma3", "gpt_oss")


def tiny_windowed_model(arch: str, seed: int, window: int = WINDOW, vocab: int = VOCAB):
    import transformers as tf

    torch.manual_seed(seed)
    sizes = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
                 pad_token_id=None, sliding_window=window)
    if arch != "mistral":
        sizes["head_dim"] = 8
    if arch == "gpt_oss":
        sizes.update(num_local_experts=4, num_experts_per_tok=2)
    config_class, model_class = {
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
        "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM),
    }[arch]
    return model_class(config_class(**sizes)).eval()


def tiny_recurrent_model(seed: int):
    """Qwen3-Next: a linear-attention (gated delta rule) layer, then a full one."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_value_heads=2,
        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"], eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    return Qwen3NextForCausalLM(config).eval()


CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_chat_tokenizer():
    """A byte-level BPE tokenizer with ChatML's special tokens and template, trained on
    the spot (no download): merges across words, spaces and newlines as Qwen's do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["system\nYou are a helpful assistant.\n\nuser\nwrite a function\n  return x\n"] * 8, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    hf.chat_template = CHATML
    return hf


QWEN_FIM = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def tiny_fim_tokenizer(fim_tokens=tuple(QWEN_FIM)):
    """A byte-level BPE tokenizer (as tiny_chat_tokenizer) with these special tokens
    besides <|endoftext|>: Qwen2.5-Coder's FIM tokens by default, none for a model
    without FIM."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", *fim_tokens],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["def add(a, b):\n    return a + b\n\nx = add(1, 2)\nprint(x)\n"] * 8, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")

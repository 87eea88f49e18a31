"""A tiny GGUF model that llama.cpp loads: one llama layer of random weights over a
byte-level BPE vocabulary (the 256 byte tokens, one merge, and the special tokens asked
for), written with the gguf package (no download)."""

from pathlib import Path

import numpy as np

EMBED, HEADS, KV_HEADS, FF = 32, 4, 2, 64
QWEN_FIM = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the text of each byte's token, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    codes, extra = {}, 0
    for b in range(256):
        if b in printable:
            codes[b] = chr(b)
        else:
            codes[b] = chr(256 + extra)
            extra += 1
    return [codes[b] for b in range(256)]


def write_tiny_gguf(path: Path, specials=("<|endoftext|>", *QWEN_FIM), metadata: dict[str, int] | None = None,
                    seed: int = 0, context_length: int = 256, matrices: str = "f32") -> Path:
    """Token ids: bytes 0-255, the merge 256, then `specials` from 257 (the first is EOS);
    `metadata`: extra integer keys (tokenizer.ggml.fim_pre_token_id ...); its trained
    context, `context_length`; its weight matrices stored as `matrices` ("f32" or "bf16",
    llama.cpp's matrix path for a re-encoded target; the norms stay f32)."""
    import gguf

    tokens = byte_tokens() + ["Ġt"] + list(specials)
    types = [gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.CONTROL] * len(specials)
    rng = np.random.default_rng(seed)
    weight = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.5  # noqa: E731
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("tiny-fim")
    writer.add_context_length(context_length)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t"])
    writer.add_eos_token_id(257)
    writer.add_add_bos_token(False)
    for key, value in (metadata or {}).items():
        writer.add_uint32(key, value)
    kv = EMBED // HEADS * KV_HEADS

    def matrix(name, data):
        if matrices == "bf16":
            writer.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, data)

    matrix("token_embd.weight", weight(len(tokens), EMBED))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    matrix("output.weight", weight(len(tokens), EMBED))
    for name, shape in (("attn_norm", (EMBED,)), ("attn_q", (EMBED, EMBED)), ("attn_k", (kv, EMBED)),
                        ("attn_v", (kv, EMBED)), ("attn_output", (EMBED, EMBED)), ("ffn_norm", (EMBED,)),
                        ("ffn_gate", (FF, EMBED)), ("ffn_up", (FF, EMBED)), ("ffn_down", (EMBED, FF))):
        if "norm" in name:
            writer.add_tensor(f"blk.0.{name}.weight", np.ones(shape, dtype=np.float32))
        else:
            matrix(f"blk.0.{name}.weight", weight(*shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

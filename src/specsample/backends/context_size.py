"""The context each model is loaded with (--ctx-size): one choice for target and draft
alike (the draft holds the same text), made before the slow load from what the model
files say and the memory free now. context_fit.py then says what fits in it.

A llama.cpp context allocates its whole KV cache at load: per token, every layer keeps
a key and a value row for each KV head, 2 bytes a value (f16). The default target
(Qwen2.5-Coder-1.5B: 28 layers, 2 KV heads of 128) takes 28 x 2 x (128 + 128) x 2 =
28,672 bytes a token, 0.94 GB for its trained 32,768 tokens; the draft (24 layers,
2 KV heads of 64) 12,288 more; and each sequence held at once (the server's slots,
which share one cache of n_ctx x sequences cells) as much again. A transformers cache
grows with use, in the model's dtype, to the same size at a full context.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_SHARE = 2  # the KV caches may take 1/KV_SHARE of the memory available at load: the rest for
              # the weights (mapped from the files, counted as available until read), compute
              # buffers and everything else on the machine
SLOT_FLOOR = 4096  # the least an automatic context gives each of several sequences
ROUND = 256  # an automatic context is a multiple of this (llama.cpp pads its cache to 256 cells)


@dataclass(frozen=True)
class ModelContext:
    """What one model asks of a context: its trained length, and its KV cache's bytes
    per token of one sequence in the memory `pool` it lives in (0: not known)."""

    name: str
    trained: int
    bytes_per_token: int
    pool: str = "memory"


def choose_context(requested: int, models: list[ModelContext], sequences: int,
                   available: dict[str, int]) -> tuple[int, str | None]:
    """The context of every sequence, and a note for stderr (None: nothing to say).

    requested 0 ("auto"): the shortest trained context among the models, shared among
    `sequences` sequences as llama-server shares its -c among its slots, each getting
    at least SLOT_FLOOR tokens (or the trained context where that is shorter); then
    lowered where their KV caches would take more than 1/KV_SHARE of the memory
    `available` in their pool. Sharing keeps a many-slot server's cache (and its load,
    which clears it) at one trained context's size, not one per slot. One sequence, as an agent's
    client on a --parallel 1 server, gets the whole trained context. An explicit size over a trained context is
    refused (a ValueError): positions past it were never trained, so a model's output
    there is noise; one over the memory share is kept, with a warning.

    Worked example: the default pair on 2 slots gets 32,768 / 2 = 16,384 tokens each,
    (28,672 + 12,288) x 2 = 81,920 bytes a token; with 2 GB available, 1 GB / 81,920 =
    12,207 tokens, so the context is 12,032 (a multiple of 256). On 8 slots each gets
    the floor, 4,096."""
    if requested < 0:
        raise ValueError(f"--ctx-size takes 0 (auto) or a number of tokens, got {requested}")
    shortest = min(models, key=lambda m: m.trained)
    if requested > shortest.trained:
        raise ValueError(f"--ctx-size {requested} is over {shortest.name}'s trained context of {shortest.trained} "
                         f"tokens; give at most {shortest.trained} (or 0 for auto)")
    size = requested or shared(shortest.trained, sequences)
    pool, fits = tightest_pool(models, sequences, available)
    if fits is None:
        return size, None if requested else f"context {size} tokens, the trained context (KV cache size unknown)"
    if size > fits and not requested:
        size = fits // ROUND * ROUND
        if size < ROUND:
            raise ValueError(f"not even {ROUND} tokens of context fit: {_gb(available[pool])} {pool} available, "
                             f"{_gb(kv_bytes(models, sequences, pool, ROUND))} of KV cache needed for {ROUND} tokens "
                             f"x {sequences} sequences; free memory, or hold fewer sequences")
    where = (f"{_gb(kv_bytes(models, sequences, pool, size))} of KV cache for {sequences} "
             f"sequence{'s' * (sequences > 1)}, {_gb(available[pool])} {pool} available")
    if requested:
        return size, None if size <= fits else f"--ctx-size {size}: {where}, over the 1/{KV_SHARE} share it may " \
                                                f"take: the load may fail or swap"
    if size == shortest.trained:
        return size, f"context {size} tokens, {shortest.name}'s trained context ({where})"
    if size == shared(shortest.trained, sequences):
        return size, (f"context {size} tokens a sequence, {shortest.name}'s trained {shortest.trained} shared among "
                      f"{sequences} sequences ({where}); --ctx-size sets it")
    return size, (f"context {size} tokens, lowered from the trained {shortest.trained} so the KV caches take at "
                  f"most 1/{KV_SHARE} of the memory ({where}); --ctx-size sets it")


def shared(trained: int, sequences: int) -> int:
    """Each sequence's share of a trained context: at least SLOT_FLOOR tokens (or all
    of a shorter trained context), a multiple of ROUND."""
    share = max(trained // sequences // ROUND * ROUND, SLOT_FLOOR)
    return min(trained, share)


def tightest_pool(models: list[ModelContext], sequences: int, available: dict[str, int]) -> tuple[str, int | None]:
    """The memory pool that holds the fewest tokens of context, and how many (None:
    no model's cache size is known)."""
    fits = {}
    for pool in {m.pool for m in models}:
        per_token = kv_bytes(models, sequences, pool, 1)
        if per_token:
            fits[pool] = available[pool] // KV_SHARE // per_token
    if not fits:
        return models[0].pool, None
    pool = min(fits, key=fits.get)
    return pool, fits[pool]


def kv_bytes(models: list[ModelContext], sequences: int, pool: str, tokens: int) -> int:
    return sum(m.bytes_per_token for m in models if m.pool == pool) * sequences * tokens


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def gguf_context(name: str, metadata: dict, value_bytes: int = 2, pool: str = "memory") -> ModelContext:
    """A GGUF file's trained context and KV bytes per token (0 where its header lacks
    the sizes: a recurrent model, say). head_count_kv may be one number or one per
    layer; key and value widths default to the embedding over the heads, as llama.cpp's."""
    arch = metadata.get("general.architecture", "")
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)  # noqa: E731
    trained, layers, heads, embed = get("context_length"), get("block_count"), get("attention.head_count"), \
        get("embedding_length")
    if not trained:
        raise ValueError(f"{name}: its GGUF header has no {arch}.context_length")
    kv_heads = get("attention.head_count_kv", heads)
    if not (layers and heads and embed and kv_heads):
        return ModelContext(name, trained, 0, pool)
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    width = get("attention.key_length", embed // heads) + get("attention.value_length", embed // heads)
    return ModelContext(name, trained, sum(per_layer) * width * value_bytes, pool)


def config_context(name: str, config, value_bytes: int, pool: str = "memory") -> ModelContext:
    """A transformers config's trained context (max_position_embeddings; 2048 where it
    has none, as HFBackend assumes) and KV bytes per token."""
    config = config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    trained = getattr(config, "max_position_embeddings", None) or 2048
    return ModelContext(name, trained, config.num_hidden_layers * kv_heads * head_dim * 2 * value_bytes, pool)


def available_memory(pool: str = "memory") -> int:
    """Bytes free for new allocations now: the kernel's MemAvailable (free memory plus
    what it can reclaim) for host memory, torch's free memory for a GPU device."""
    if pool != "memory":
        import torch

        return torch.cuda.mem_get_info(torch.device(pool))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

"""Hugging Face transformers backend: any AutoModelForCausalLM.

Tested with transformers 5.17 (pinned in pyproject). Since 5.x, DynamicCache.crop
takes the number of tokens to remove as a negative integer; a positive argument is
the deprecated "final length" form, removed in 5.18. We only ever pass negatives.

Sliding-window layers (Mistral with a window, Gemma 2/3, gpt-oss) get a plain
full-length cache here, not transformers' windowed one: a windowed layer drops every
state older than window - 1 tokens, so a crop cannot restore them, and its "past
recording" mode keeps them only until the next forward call (a longer key tensor
than the mask it builds). The model's mask applies the window either way, so the
logits are the same; the price is the memory of full attention on those layers.
Linear-attention layers (Qwen3-Next, Mamba hybrids) hold a recurrent state that no
crop restores: those models generate, but refuse a rollback that drops tokens.
"""

from __future__ import annotations

import copy
import hashlib
import sys
import threading
from pathlib import Path

import torch

from ..files import build_once
from .base import Backend, ChatTemplateError, SavedSequence, trim_padding
from .chat import TextOnly, chat_token_ids
from .cpushare import SHARED
from .fim_tokens import FimFormat, fim_from_tokens


class RollbackUnsupported(ValueError):
    pass

# Special tokens that end a turn in common instruct models; the ones a vocabulary
# has are added to the model's own EOS ids (instruct models have several).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFTokenizer:
    def __init__(self, tokenizer):
        self.hf = tokenizer
        # A call's split_special_tokens is set on the shared Rust tokenizer and left there
        # until a call asks otherwise, so two threads (the server tokenizes in a pool)
        # could each encode with the other's setting: calls take turns.
        self._lock = threading.Lock()
        # Added tokens that are not special (Qwen's <tool_call>) are matched even with
        # split_special_tokens: cut apart so that their spellings stay text (chat.TextOnly).
        added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if not t.special]
        self._text_only = TextOnly(lambda text: self._split(text, add_special_tokens=False), added)

    def encode(self, text: str) -> list[int]:
        """A plain prompt's ids: special-token text stays the text it spells, as on
        llama.cpp (only a chat template's own markup makes control tokens)."""
        if not self._text_only.matches(text):
            return self._split(text, add_special_tokens=True)
        first = self._split("", add_special_tokens=True)  # a BOS, for a tokenizer that adds one
        return first + self._text_only(text)

    def _split(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._lock:
            return list(self.hf(text, add_special_tokens=add_special_tokens, split_special_tokens=True).input_ids)

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=True)

    def text_ids(self, text: str) -> list[int]:
        return self._tokens(text, special=False)

    def fim_format(self) -> FimFormat | None:
        """The FIM tokens among this tokenizer's own, by their spelling (fim_tokens.py), and the
        BOS its encoding puts first, if any."""
        bos = self.hf.bos_token_id
        with self._lock:
            first = list(self.hf("", add_special_tokens=True).input_ids[:1])
        return fim_from_tokens(self.hf.get_vocab(), bos if bos is not None and first == [bos] else None)

    def chat_prompt(self, text: str) -> list[int]:
        return self.chat_messages([{"role": "user", "content": text}])

    @property
    def chat_template(self) -> str | None:
        return self.hf.chat_template

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None, check=None) -> list[int]:
        if not self.hf.chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        return chat_token_ids(lambda chat: self._render(chat, tools), messages, self._tokens, tools, check=check)

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        import jinja2

        try:
            return self.hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None

    def _tokens(self, text: str, special: bool) -> list[int]:
        """`text`'s ids with no BOS/EOS added; special-token text parsed as those tokens,
        or (special=False) kept as the text it spells."""
        if not special:
            return self._text_only(text)
        with self._lock:
            return list(self.hf(text, add_special_tokens=False, split_special_tokens=False).input_ids)

    def __len__(self) -> int:
        return len(self.hf)

    def token_text(self, token_id: int) -> str | None:
        return self.hf.convert_ids_to_tokens(token_id)

    def grammar_tokenizer(self, eos_token_ids: list[int]):
        """llguidance's tokenizer over this vocabulary (constraints.py), from the fast
        tokenizer's own serialization."""
        from llguidance.hf import from_tokenizer

        return from_tokenizer(self.hf, eos_token=list(eos_token_ids) or None)


class HFBackend(Backend):
    engine = "hf"

    def __init__(self, model, tokenizer: HFTokenizer | None = None, name: str = "hf-model", n_ctx: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config.get_text_config()
        self.device = next(model.parameters()).device
        self.vocab_size = config.vocab_size
        if tokenizer is not None:
            self.vocab_size = trim_padding(len(tokenizer), tokenizer.token_text)
            self.fim = tokenizer.fim_format()
        if self.vocab_size > config.vocab_size:
            raise ValueError(f"{name}: tokenizer has {self.vocab_size} tokens but the model only {config.vocab_size} logits")
        # The cache grows with use; n_ctx (--ctx-size) caps what a generation may fill.
        trained = getattr(config, "max_position_embeddings", None) or 2048
        self.context_length = min(n_ctx, trained) if n_ctx else trained
        self.eos_token_ids = frozenset(_eos_ids(model, tokenizer) | _fim_ends(self.fim))
        self.cache = None
        # False for recurrent models: the loop can refuse a drafter before any output.
        self._new_cache, self.supports_rollback = _cache_factory(model.config)
        # A copy of a cache is restored by cropping it to the prompt's shared start:
        # what cannot be cropped cannot be kept in the host prompt cache either.
        self.saves_sequences = self.supports_rollback
        self._length = 0
        self._tokens: list[int] = []  # what the cache holds, in order
        self._kept: torch.Tensor | None = None  # [n] token ids the output layer scores (None: all)
        # On the CPU, torch's threads follow the cores other processes leave free
        # (cpushare.py), up to the count set when the model was loaded.
        self._threads = torch.get_num_threads()
        self._share = SHARED if self.device.type == "cpu" else None
        if self._share is not None:
            SHARED.watch()

    def sibling(self) -> "HFBackend":
        """Another sequence on the same weights (and vocabulary cut): a cache of its own."""
        other = HFBackend(self.model, self.tokenizer, self.name, self.context_length)
        other._kept = self._kept
        return other

    def restrict_vocabulary(self, keep: list[int]) -> None:
        """Score only these tokens (a draft-side speed-up, see vocab.py): the output
        layer is replaced by its rows for `keep`; every other logit is -inf."""
        head = self.model.get_output_embeddings()
        kept = torch.tensor(sorted(set(keep)), dtype=torch.long, device=head.weight.device)
        small = torch.nn.Linear(head.in_features, len(kept), bias=head.bias is not None,
                                dtype=head.weight.dtype, device=head.weight.device)
        with torch.no_grad():
            small.weight.copy_(head.weight[kept])
            if head.bias is not None:
                small.bias.copy_(head.bias[kept])
        # A new module, not a view: with tied embeddings the input side keeps every row.
        self.model.config.tie_word_embeddings = False
        self.model.set_output_embeddings(small)
        self._kept = kept

    @property
    def length(self) -> int:
        return self._length

    @torch.inference_mode()
    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        if self._share is not None:
            threads = self._share.threads(self._threads)
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
        if self.cache is None:
            self.cache = self._new_cache()
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        try:
            # logits_to_keep=0 would mean every row: keep one and drop it below.
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=max(1, num_logits))
        except BaseException:
            # A forward that fails midway (out of memory in a long prefill, Ctrl-C) has
            # appended these tokens to the layers before the failure and not to the
            # others; no crop can make that whole again. Start the next sequence afresh.
            self.cache, self._length = None, 0
            self._tokens = []
            raise
        self._length += len(token_ids)
        self._tokens += token_ids
        logits = out.logits[0, out.logits.shape[1] - num_logits:].float().cpu()  # [num_logits, scored]
        if self._kept is not None:
            full = torch.full((num_logits, self.vocab_size), float("-inf"))
            inside = self._kept < self.vocab_size
            full[:, self._kept[inside].cpu()] = logits[:, inside.cpu()]
            return full  # [num_logits, vocab]
        # Rows past the tokenizer's vocabulary are padding: never a real token.
        return logits[:, : self.vocab_size]  # [num_logits, vocab]

    def rollback(self, length: int) -> None:
        if length >= self._length:
            return
        if length == 0:
            self.cache = None
        elif not self.supports_rollback:
            raise RollbackUnsupported(
                f"{self.name} keeps a recurrent state (linear-attention layers) that the transformers cache cannot "
                f"roll back, and speculative decoding must drop rejected drafts: run it autoregressively "
                f"(--autoregressive), or use a model with attention layers only")
        else:
            try:
                self.cache.crop(length - self._length)  # negative: tokens to remove
            except RuntimeError as e:  # a cache layer we do not know
                raise RollbackUnsupported(f"{self.name}: the transformers cache cannot roll back: {e}") from e
        self._length = length
        del self._tokens[length:]

    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def save_sequence(self, seq: int = 0) -> SavedSequence:
        """A deep copy of the cache (every layer's key and value tensors)."""
        if not self.saves_sequences:
            raise RollbackUnsupported(f"{self.name}: a recurrent state cannot be saved and cropped")
        saved = copy.deepcopy(self.cache) if self._length else None
        tensors = [getattr(layer, name, None) for layer in saved.layers for name in ("keys", "values")] if saved else []
        nbytes = sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))
        return SavedSequence(tuple(self._tokens), saved, nbytes)

    def restore_sequence(self, seq: int, saved: SavedSequence, length: int) -> None:
        """A copy of the saved cache (the entry may be restored again), cropped to `length`."""
        self.rollback(0)
        if saved.data is not None and length:
            self.cache = copy.deepcopy(saved.data)
            self._length, self._tokens = len(saved.tokens), list(saved.tokens)
            self.rollback(length)


# Cache layer kinds with a recurrent or convolution state (mamba, gated delta rule,
# short convolutions): a crop restores none of it. "moe" and "mlp" layers hold nothing.
RECURRENT_LAYERS = ("linear_attention", "conv", "hybrid", "hybrid_sliding")


def _cache_factory(config):
    """A function making an empty cache for this model, and whether a crop can roll
    that cache back. See the module docstring for why windows get full layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import get_layer_types_and_kwargs

    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    recurrent = any(t in RECURRENT_LAYERS for t in layer_types)
    if not recurrent and any(t in ("sliding_attention", "chunked_attention") for t in layer_types):
        return DynamicCache, True  # no config: a full DynamicLayer per layer
    return (lambda: DynamicCache(config=config)), not recurrent


def _eos_ids(model, tokenizer: HFTokenizer | None) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    if tokenizer is not None:
        if tokenizer.hf.eos_token_id is not None:
            ids.add(tokenizer.hf.eos_token_id)
        added = tokenizer.hf.get_added_vocab()  # special tokens only: "</s>" is plain text in Qwen
        ids.update(added[t] for t in END_OF_TURN_TOKENS if t in added)
    return ids


def _fim_ends(fim) -> set[int]:
    """FIM's pad, repository and file-separator tokens end a generation, as llama.cpp
    counts them among its end-of-generation tokens: a middle that reaches one is done."""
    return set() if fim is None else {t for t in (fim.pad, fim.repo, fim.file_sep) if t is not None}


def load_hf(
    path_or_id: str,
    gguf_file: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    name: str | None = None,
    converted_dir: Path | None = None,
    n_ctx: int | None = None,
) -> HFBackend:
    """Load a hub id, a local directory, or a GGUF file (dequantised by transformers).

    A GGUF conversion is slow (tens of seconds for a 1.5B model), so when converted_dir is
    given the converted weights are saved there and later loads read them instead.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if gguf_file is not None and converted_dir is not None and (converted_dir / "config.json").exists():
        path_or_id, gguf_file = str(converted_dir), None
    elif gguf_file is not None:
        print(f"specsample: converting {gguf_file} to {dtype} (slow, done once)", file=sys.stderr)
    # Progress bars only for the slow conversion; a plain load takes a second.
    (hf_logging.enable_progress_bar if gguf_file else hf_logging.disable_progress_bar)()
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path_or_id, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=DTYPES[dtype], **kwargs)
    if gguf_file is not None and converted_dir is not None:
        _save_dequantised(model, tokenizer, converted_dir)
    model.to(device)
    backend = HFBackend(model, HFTokenizer(tokenizer), name=name or Path(gguf_file or path_or_id).name, n_ctx=n_ctx)
    # Identifies this model, dtype, device and thread count in the planner's cost cache.
    where = hashlib.sha256(str(Path(path_or_id).resolve() if Path(path_or_id).exists() else path_or_id).encode())
    backend.cost_key = f"hf-{backend.name}-{where.hexdigest()[:12]}-{dtype}-{device}-t{torch.get_num_threads()}"
    return backend


def _save_dequantised(model, tokenizer, directory: Path) -> None:
    # The weights are plain tensors once dequantised; only the GGUF marker makes
    # transformers refuse to save them. Drop it so they save as ordinary safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    # Another process converting the same file at once publishes first; then this
    # one finds the directory complete and keeps it.
    build_once(directory, save, ready=lambda d: (d / "config.json").exists())

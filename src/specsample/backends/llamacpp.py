"""llama.cpp backend over llama-cpp-python's low-level API: quantised GGUF, no
dequantisation.

Pinned to llama-cpp-python 0.3.16: 0.3.36 (newest when this was written) segfaults
inside llama_decode on the Qwen2.5 GGUF files on our CPU machines; 0.3.16 works.

We do not use the high-level Llama class: it keeps a scores buffer of n_batch (or,
with logits_all, n_ctx) rows of vocabulary-wide logits, which for a 151,936-token
vocabulary is hundreds of MB to GB. Here logits are requested only for the positions
the algorithm needs and copied out row by row.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch

from .base import Backend, BackendError, ChatTemplateError, NoRoom, SavedSequence, trim_padding
from .chat import TextOnly, chat_token_ids
from .cpushare import SHARED
from .fim_tokens import FimFormat, fim_from_ids

_quiet_logger = None  # keep the ctypes callback alive for the process's lifetime


def _llama():
    import llama_cpp

    global _quiet_logger
    if _quiet_logger is None:
        _quiet_logger = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_quiet_logger, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


class LoadError(ValueError):
    """llama.cpp could not load a model file (damaged, truncated or not a GGUF)."""


class LoadedModel:
    """A llama_model, freed when its last holder is gone. The tokenizer holds one too:
    its vocab pointer lives inside the model, and a tokenizer may outlive its backend."""

    def __init__(self, lib, path: Path, repack: bool = True, workers=None):
        self.lib = lib
        self.workers = workers
        params = lib.llama_model_default_params()
        if not repack:  # llama.cpp repacks weights for faster kernels by default
            params.use_extra_bufts = False
        keep = []  # what params point into, alive through the load
        if workers is not None:  # the layers live on llama.cpp RPC workers (rpc.py)
            from .rpc import place_on

            place_on(params, lib, workers, keep)
        self.pointer = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.pointer:
            raise LoadError(f"llama.cpp could not load {path}")
        self.vocab = lib.llama_model_get_vocab(self.pointer)

    def __del__(self, _exiting=sys.is_finalizing):  # bound now: at exit this module's globals are gone
        # At interpreter exit the process frees everything, and the bindings may already
        # be torn down (freeing then raised "'NoneType' object is not callable").
        if getattr(self, "pointer", None) and not _exiting() and _workers_answer(self.workers):
            self.lib.llama_model_free(self.pointer)


def _workers_answer(workers) -> bool:
    """Whether a model's (or its context's) memory can be freed: always for one held
    here; for one on RPC workers, only while they are still connected. Freeing sends
    each worker a command, and to a worker that is gone llama.cpp answers by aborting
    the process (rpc.guard_aborts), so memory left on a lost worker is left behind."""
    if workers is None:
        return True
    from .rpc import still_connected

    return still_connected(workers)


UNKNOWN, CONTROL, USER_DEFINED = 1, 8, 16  # llama.h's LLAMA_TOKEN_ATTR_* flags


class LlamaCppTokenizer:
    def __init__(self, backend: "LlamaCppBackend"):
        self._lib = backend._lib
        self._owner = backend._loaded  # keeps self._vocab valid
        self._vocab = backend._vocab
        self.chat_template = backend.chat_template
        lib, vocab = self._lib, self._vocab
        self._bos = lib.llama_vocab_bos(vocab)  # -1: none
        self._add_bos = bool(lib.llama_vocab_get_add_bos(vocab))
        eot = lib.llama_vocab_eot(vocab)
        self.end_of_text = eot if eot >= 0 else lib.llama_vocab_eos(vocab)  # -1: none (infill_sampler.py)
        self._text_only = TextOnly(lambda text: self._tokenize(text, False), self._texts(USER_DEFINED))
        # Every text llama_tokenize may take for a token when it parses special tokens:
        # a text holding none of them tokenizes the same either way (chat.chat_token_ids).
        self._spellings = re.compile("|".join(map(re.escape, self._texts(UNKNOWN | CONTROL | USER_DEFINED))) or "(?!)")
        self._special_text = {name: (lib.llama_vocab_get_text(vocab, t) or b"").decode("utf-8", "replace") if t >= 0 else ""
                              for name, t in (("bos_token", self._bos), ("eos_token", lib.llama_vocab_eos(vocab)))}

    def encode(self, text: str, special: bool = False) -> list[int]:
        """`special`: special-token text becomes those tokens (a chat template's markup);
        else every added token's spelling stays text (chat.TextOnly)."""
        return self._tokenize(text, True) if special else self._text_only(text)

    def _texts(self, attributes: int) -> list[str]:
        """The texts of the tokens with any of `attributes`. USER_DEFINED ones (Qwen's
        <tool_call>) llama_tokenize matches even with special tokens off; UNKNOWN and
        CONTROL ones only with them on (its cache_special_tokens holds all three)."""
        lib, vocab = self._lib, self._vocab
        texts = [(lib.llama_vocab_get_text(vocab, t) or b"").decode("utf-8", "replace")
                 for t in range(lib.llama_vocab_n_tokens(vocab)) if lib.llama_vocab_get_attr(vocab, t) & attributes]
        return [t for t in texts if t]

    def _tokenize(self, text: str, special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (self._lib.llama_token * size)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, size, False, special)
        if n < 0:  # buffer too small: -n is the size needed
            size = -n
            buf = (self._lib.llama_token * size)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, size, False, special)
        return list(buf[:n])

    def text_ids(self, text: str) -> list[int]:
        return self.encode(text)  # llama_tokenize adds nothing here, and parses no special tokens

    def decode(self, token_ids: list[int]) -> str:
        tokens = (self._lib.llama_token * max(1, len(token_ids)))(*token_ids)
        size = 16 * len(token_ids) + 16
        buf = ctypes.create_string_buffer(size)
        n = self._lib.llama_detokenize(self._vocab, tokens, len(token_ids), buf, size, True, False)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_detokenize(self._vocab, tokens, len(token_ids), buf, size, True, False)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def piece(self, token: int) -> bytes:
        """A token's text as llama.cpp writes it alone, special tokens as nothing
        (llama.cpp's infill sampler compares these: infill_sampler.py)."""
        buf = ctypes.create_string_buffer(64)
        n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def grammar_tokenizer(self, eos_token_ids: list[int]):
        """llguidance's tokenizer over this GGUF vocabulary (constraints.py): each
        token's bytes, control tokens marked special, llama.cpp's own tokenize."""
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self._vocab, eos_token=list(eos_token_ids) or None)

    def chat_prompt(self, text: str) -> list[int]:
        return self.chat_messages([{"role": "user", "content": text}])

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None, check=None) -> list[int]:
        if not self.chat_template:
            raise ValueError("this GGUF file has no chat template")
        render = lambda chat: render_chat(self.chat_template, chat, tools=tools, **self._special_text)  # noqa: E731
        ids = chat_token_ids(render, messages, self.encode, tools, self._spellings.search, check)
        return with_bos(ids, self._bos, self._add_bos)


def vocab_fim(lib, vocab) -> FimFormat | None:
    """The GGUF's FIM tokens as llama.cpp reads them: its tokenizer.ggml.fim_*_token_id
    metadata, else the tokens it recognises by their text (-1: none)."""
    ids = {role: getattr(lib, f"llama_vocab_fim_{short}")(vocab) for role, short in
           (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid"), ("pad", "pad"), ("repo", "rep"), ("file_sep", "sep"))}
    bos = lib.llama_vocab_bos(vocab)
    return fim_from_ids(ids, bos if lib.llama_vocab_get_add_bos(vocab) and bos >= 0 else None)


def render_chat(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                tools: list[dict] | None = None) -> str:
    """A chat template rendered as transformers renders it: in jinja2's sandbox, with
    the special tokens, the tools, and the helpers templates call (raise_exception,
    strftime_now, and transformers' tojson: keys in their order, no HTML escapes, as
    the model saw its tools written in training). A template's own error is the
    messages being refused: a ChatTemplateError."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    try:
        return env.from_string(template).render(
            messages=messages, tools=tools, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token,
            raise_exception=raise_exception, strftime_now=lambda f: datetime.datetime.now().strftime(f))
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None


def with_bos(ids: list[int], bos: int, add_bos: bool) -> list[int]:
    """The model's BOS first when its vocabulary asks for one (Llama, Mistral, Gemma;
    not Qwen), once: a template that writes {{ bos_token }} has put it there already."""
    if add_bos and bos >= 0 and ids[:1] != [bos]:
        return [bos] + ids
    return ids


LLAMACPP_CONTEXT = 4096  # a library caller's context when it names none (assemble chooses one: context_size.py)


class LlamaCppBackend(Backend):
    engine = "llamacpp"
    saves_sequences = True

    def __init__(self, path: Path, *, name: str | None = None, threads: int | None = None,
                 n_ctx: int = LLAMACPP_CONTEXT, n_batch: int = 512, share_cores: bool = True, batch_invariant: bool = False, sequences: int = 1,
                 workers=None):
        lib = _llama()
        self._lib = lib
        self.name = name or Path(path).name
        self.path = Path(path)
        # Batch invariance: llama.cpp's logits for a position move with the number of
        # tokens in the call (up to 0.5 in a logit, 3% in total variation), because the
        # repacked weight kernels and the attention path differ by batch size. Without
        # repacking and with flash attention, 1-, 2-, 4- and 8-token calls agree to the
        # bit on the default pair (docs/results/numerics).
        self.batch_invariant = batch_invariant
        self.workers = workers
        self._loaded = LoadedModel(lib, path, repack=not batch_invariant, workers=workers)  # freed after the context (see __del__)
        self._model, self._vocab = self._loaded.pointer, self._loaded.vocab
        threads = threads or os.cpu_count() or 1
        cparams = lib.llama_context_default_params()
        # n_ctx is each sequence's context. Several sequences share one KV cache
        # (kv_unified), so a call of n sequences runs as one micro-batch: 4 sequences of
        # 1 token cost what 4 tokens of one sequence do. With batch-invariant kernels
        # each sequence gets a KV stream of its own instead: its cells then sit in the
        # order of its positions whatever the others do, so its rows are bitwise those
        # it gets alone; but llama.cpp then splits a call per stream, and 4 sequences
        # of 1 token cost about 4 calls (docs/results/numerics/batch-composition.md).
        if sequences < 1:
            raise ValueError(f"a llama.cpp backend holds at least one sequence, got {sequences}")
        self.sequences = sequences
        self.context_length = min(n_ctx, lib.llama_model_n_ctx_train(self._model))
        cparams.n_ctx = self.context_length * sequences
        cparams.n_seq_max = sequences
        cparams.kv_unified = sequences == 1 or not batch_invariant
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn = cparams.flash_attn or batch_invariant
        self.threads = threads
        # Run on the cores other processes leave free (cpushare.py), up to `threads`.
        self._share = SHARED if share_cores else None
        if share_cores:
            SHARED.watch()
        self._threads_now = threads
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise ValueError(f"llama.cpp could not create a context for {path}")
        self._memory = lib.llama_get_memory(self._ctx)
        self._n_batch = n_batch
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._n_vocab = lib.llama_vocab_n_tokens(self._vocab)
        template = lib.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.tokenizer = LlamaCppTokenizer(self)
        self.fim = vocab_fim(lib, self._vocab)
        self.vocab_size = trim_padding(self._n_vocab, lambda t: (lib.llama_vocab_get_text(self._vocab, t) or b"").decode("utf-8", "replace"))
        self.eos_token_ids = frozenset(t for t in range(self._n_vocab) if lib.llama_vocab_is_eog(self._vocab, t))
        self._lengths = [0] * sequences
        self._tokens: list[list[int]] = [[] for _ in range(sequences)]  # what each sequence's cells hold, in order
        # Identifies this engine, file and thread count in the planner's cost cache.
        self.cost_key = (f"llamacpp-{Path(path).name}-{Path(path).stat().st_size}-t{threads}" + ("-bi" if batch_invariant else "")
                         + (f"-s{sequences}" if sequences > 1 else "") + (f"-{workers.key}" if workers else ""))

    @property
    def length(self) -> int:
        return self._lengths[0]

    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        return self.score_many([(0, token_ids, num_logits)])[0]

    def sequence_length(self, seq: int) -> int:
        return self._lengths[seq]

    def cached_tokens(self) -> list[int]:
        return self.sequence_tokens(0)

    def sequence_tokens(self, seq: int) -> list[int]:
        return list(self._tokens[seq])

    def score_many(self, requests: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
        """Several sequences' score() in one batch: (sequence, token_ids, num_logits)
        each, at most one per sequence; llama.cpp decodes them together (in chunks of
        n_batch tokens). Returns each request's [num_logits, vocab] rows."""
        if len({seq for seq, _, _ in requests}) < len(requests):
            raise ValueError("a batch holds at most one request per sequence")
        if self._share is not None:
            self._use_threads(self._share.threads(self.threads))
        # One flat list of (sequence, position, token, wants logits), cut into calls.
        flat = []
        for seq, token_ids, num_logits in requests:
            first_wanted = len(token_ids) - num_logits
            base = self._lengths[seq]
            flat += [(seq, base + i, token, i >= first_wanted) for i, token in enumerate(token_ids)]
        rows = []
        for start in range(0, len(flat), self._n_batch):
            chunk = flat[start : start + self._n_batch]
            batch = self._batch
            batch.n_tokens = len(chunk)
            for i, (seq, pos, token, wanted) in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = wanted
            if self._lib.llama_decode(self._ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed at position {chunk[0][1]} of sequence {chunk[0][0]} ({self.name})")
            for i, (seq, pos, token, wanted) in enumerate(chunk):
                self._lengths[seq] = pos + 1
                del self._tokens[seq][pos:]
                self._tokens[seq].append(token)
                if wanted:
                    pointer = self._lib.llama_get_logits_ith(self._ctx, i)
                    rows.append(np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))[: self.vocab_size].copy())
        if not rows:
            return [torch.empty(0, self.vocab_size) for _ in requests]
        logits = np.stack(rows)  # [every request's num_logits, vocab]
        if not np.isfinite(logits.max(-1)).all():
            # llama.cpp computes in float32: non-finite logits mean damaged weights, not
            # an overflow that another dtype would avoid (base.finite_logits' advice).
            raise BackendError(f"{self.name}: llama.cpp returned NaN or infinite logits from {self.path}, so its "
                               f"weights are damaged: delete that file (a re-encoded copy is made again and a default "
                               f"model fetched again on the next start) or replace it")
        return list(torch.from_numpy(logits).split([n for _, _, n in requests]))

    def _use_threads(self, n: int) -> None:
        if n != self._threads_now:
            self._lib.llama_set_n_threads(self._ctx, n, n)
            self._threads_now = n
        if n != torch.get_num_threads():
            # The sampler's torch work spins on its own OpenMP team: the same cores.
            torch.set_num_threads(n)

    def rollback(self, length: int) -> None:
        self.rollback_sequence(0, length)

    def rollback_sequence(self, seq: int, length: int) -> None:
        if length >= self._lengths[seq]:
            return
        if not self._lib.llama_memory_seq_rm(self._memory, seq, length, -1):
            raise RuntimeError(f"llama.cpp could not roll back sequence {seq} to {length} tokens ({self.name})")
        self._lengths[seq] = length
        del self._tokens[seq][length:]

    def save_sequence(self, seq: int) -> SavedSequence:
        """llama.cpp's own copy of the sequence's cells (llama_state_seq_get_data): each
        layer's keys and values with their positions."""
        lib = self._lib
        size = lib.llama_state_seq_get_size(self._ctx, seq)
        data = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data(self._ctx, data, size, seq) != size:
            raise BackendError(f"{self.name}: llama.cpp could not copy sequence {seq}'s cache out")
        return SavedSequence(tuple(self._tokens[seq]), data, size)

    def restore_sequence(self, seq: int, saved: SavedSequence, length: int) -> None:
        """The saved cells into sequence `seq` (llama_state_seq_set_data empties it
        first), then those past `length` removed, as a rollback removes them. The cells
        keep their positions, so what is scored next sits where it would after a
        fresh prefill of the same tokens (bitwise so with batch-invariant kernels:
        tests/test_prompt_cache_real.py). llama.cpp puts a sequence's cells back in one
        run of free cells; in a cache the slots share (kv_unified), a sequence's freed
        cells lie between the others' and there may be no run long enough: then it
        empties the sequence and fails, and so does this (NoRoom)."""
        self.rollback_sequence(seq, 0)
        if saved.tokens:
            if not self._lib.llama_state_seq_set_data(self._ctx, saved.data, saved.nbytes, seq):
                raise NoRoom(f"{self.name}: llama.cpp found no run of {len(saved.tokens)} free cells to restore a saved "
                             f"cache into sequence {seq}")
            self._lengths[seq] = len(saved.tokens)
            self._tokens[seq] = list(saved.tokens)
        self.rollback_sequence(seq, length)

    def __del__(self, _exiting=sys.is_finalizing):
        lib = getattr(self, "_lib", None)
        if lib is None or _exiting():  # as LoadedModel.__del__
            return
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
        loaded = getattr(self, "_loaded", None)
        if getattr(self, "_ctx", None) and _workers_answer(getattr(loaded, "workers", None)):
            lib.llama_free(self._ctx)
        # The model goes with the last reference to self._loaded: here, or with the tokenizer.


def load_llamacpp(path: Path, *, name: str | None = None, threads: int | None = None,
                  batch_invariant: bool = False, sequences: int = 1, n_ctx: int = LLAMACPP_CONTEXT,
                  workers=None) -> LlamaCppBackend:
    return LlamaCppBackend(path, name=name, threads=threads, batch_invariant=batch_invariant, sequences=sequences,
                           n_ctx=n_ctx, workers=workers)

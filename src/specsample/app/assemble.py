"""Options in, a ready target, drafter and policy out: the one place that puts the
models together, for the command line, the server, the benchmark, `check` and the
contention worker.

Backends are loaded once; drafters are cheap and built per use. A ModelDrafter must
draw from the sampling distribution of the generation it serves (its probabilities
enter the acceptance ratio), so a server builds one per request and the benchmark
one per decoding setting: `Models.drafter(sampling)` is that function, and
`make_drafter` the only code that builds drafters.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields

from ..backends import BACKENDS, load_backend, model_context, pick_backend
from ..backends.base import Backend, SeparateSequences, check_same_vocabulary
from ..backends.context_size import available_memory, choose_context
from ..backends.hf import DTYPES
from ..backends.models import DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir
from ..backends.reencode import DRAFT_QUANTS, TARGET_QUANTS
from ..decoding.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from ..decoding.plans import Policy
from ..decoding.sampling import SamplingConfig
from ..decoding.suffix import SuffixDrafter, SuffixIndex
from ..policy.calibrate import cached_or_measured, cost_cache_path, probe_context
from ..policy.make import K_MAX, make_policy
from ..policy.curve import Curve


class OptionError(ValueError):
    """Options that cannot work together, or not on this machine; the message says which."""


def option(default, help: str, *, choices: tuple[str, ...] | None = None, type=None):
    """A ModelOptions field: its flag is the name with dashes (draft_quant: --draft-quant),
    and this metadata is all that arguments.add_model_arguments needs to build the flag.
    `type` converts the flag's text (default: the default's own type); a bool is a
    switch (--lookup/--no-lookup when on by default, --batch-invariant when off)."""
    return field(default=default, metadata={"help": help, "choices": choices, "type": type or _type(default)})


def _type(default):
    return str if default is None else type(default)


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ModelOptions:
    """The models to load and how: the one list from which every subcommand's flags,
    their parsing and the argv of child processes that load the same models (the
    bench's servers and contention workers, the harness's servers) are made."""

    target: str = option(DEFAULT_TARGET, "short name, .gguf file, model directory or hub id")
    draft: str = option(DEFAULT_DRAFT, "a model like --target, or 'ngram' for prompt lookup alone")
    backend: str = option("auto", "engine for target and draft (default auto: llamacpp for GGUF files on the CPU, "
                                  "else hf)", choices=BACKENDS)
    target_backend: str | None = option(None, "engine for the target alone (overrides --backend)", choices=BACKENDS)
    draft_backend: str | None = option(None, "engine for the draft alone (overrides --backend)", choices=BACKENDS)
    draft_quant: str = option("q4_0", "llamacpp draft: requantize it to this type, cached (default q4_0: faster "
                                      "kernels; the draft's quality moves acceptance only, never the output "
                                      "distribution)", choices=("none", *DRAFT_QUANTS))
    target_quant: str = option("none", "llamacpp target: re-encode its GGUF file to this type first, cached "
                                       "(bf16/f16: the cost structure of a full-precision model, memory-bound, "
                                       "where drafting pays most; default none)", choices=("none", *TARGET_QUANTS))
    draft_vocab: int = option(0, "hf draft: score only its N most frequent tokens (FR-Spec; 0 = all, the default)")
    lookup: bool = option(True, "beside a draft model, propose from context lookup when it is expected to pay "
                                "(default on)")
    dtype: str = option("float32", "hf backend weights (default float32)", choices=tuple(DTYPES))
    device: str = option("cpu", "hf backend device: cpu, cuda, cuda:1 ...")
    threads: int | None = option(None, "CPU threads for torch and llama.cpp (default: all cores)", type=int)
    ctx_size: int = option(0, "tokens of context per sequence, for target and draft alike; 0: the trained context, "
                              "shared among the sequences held at once (at least 4096 each) and lowered so the KV "
                              "caches take at most half the memory available (a note on stderr says what was "
                              "chosen); over the trained context: refused (default %(default)s)")
    ngram_max: int = option(3, "longest n-gram the lookup matches")
    suffix_tokens: int = option(0, "also draft from a suffix index of the prompts and answers this process has served "
                                   "(per cache_salt) and of the current one, holding this many tokens at most, the "
                                   "oldest evicted first (about 100 bytes a token; 0: none, the default)")
    target_rpc: str | None = option(None, "llamacpp target: put its layers on these llama.cpp RPC workers, "
                                          "host:port[,host:port...] (specsample rpc-worker; the draft stays here)")
    tensor_split: str | None = option(None, "with --target-rpc: each worker's share of the layers, e.g. 1,1 "
                                            "(default: by each worker's free memory)")
    draft_rpc: str | None = option(None, "llamacpp draft: put its layers on this llama.cpp RPC worker, host:port "
                                         "(a machine of its own: it drafts while the target computes)")
    rpc_key: str | None = option(None, "the key of --target-rpc/--draft-rpc workers started with --rpc-key (default: "
                                       "$SPECSAMPLE_RPC_KEY, which keeps it out of the process list)")
    overlap: bool = option(True, "draft the next block while the target's call runs, where target and draft compute "
                                 "on cores of their own (--target-rpc or --draft-rpc workers elsewhere, or pinned "
                                 "apart here; PEARL, decoding/overlap.py); --no-overlap drafts after it")
    batch_invariant: bool = option(False, "llamacpp target: kernels whose logits do not depend on how many tokens "
                                          "a call scores, so speculative and plain decoding see the same numbers "
                                          "to the bit (calls run slower: docs/benchmarks.md says by how much)")

    def argv(self) -> list[str]:
        """These options as flags for a child process that parses them with the same
        list. Every value is spelled out, so a parser with defaults of its own (check
        turns --lookup off) still gets these; only None and a switch that is off (which
        have no flag) are left to the child's defaults."""
        argv = []
        for f in fields(self):
            value, flag = getattr(self, f.name), option_flag(f.name)
            if value is None or value is False and not f.default:
                continue
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + flag[2:])
            else:
                argv += [flag, str(value)]
        return argv


@dataclass
class Models:
    """A loaded target and what drafts for it: a draft model's backend, lookup, a
    suffix index of served text, some of them, or none (autoregressive)."""

    target: Backend
    draft: Backend | None = None
    lookup: bool = False
    ngram_max: int = 3
    suffix: SuffixIndex | None = None  # kept as long as the models: every request's text goes in
    # The pair's placement, decided here once (pair_overlaps): the draft model drafts
    # during the target's calls (decoding/overlap.py). A stream is told it (stream's
    # `overlap`); a batch's sequences share their calls and never overlap.
    overlap: bool = False

    @property
    def drafts(self) -> bool:
        return self.draft is not None or self.lookup or self.suffix is not None

    def drafter(self, sampling: SamplingConfig, draft: Backend | None = None, salt: str | None = None) -> Drafter | None:
        """A drafter drawing from `sampling`, on `draft` (one sequence of the draft
        model, batching.Slot) or else on the draft model itself; its suffix drafts come
        from the text served under `salt` (a request's cache_salt) alone."""
        suffix = SuffixDrafter(self.suffix, salt) if self.suffix is not None else None
        return make_drafter(draft or self.draft, sampling, lookup=self.lookup, ngram_max=self.ngram_max, suffix=suffix)

    @property
    def drafter_name(self) -> str | None:
        drafter = self.drafter(SamplingConfig())
        return drafter.name if drafter is not None else None

    def policy(self, k: int | str, k_max: int = K_MAX, parallel: int = 1) -> Policy:
        """The draft-length policy to keep across generations (make.make_policy):
        for -k auto, a seat of a planner whose prices start from costs measured here,
        now, and cached per machine and model pair, so later runs start warm; with
        `parallel` sequences at once, the calls of a whole batch are timed too."""
        cache = cost_cache_path(cache_dir(), self.target, self.draft) if k == "auto" and self.drafts else None
        return make_policy(k, k_max, self.target, self.draft, drafts=self.drafts, cost_cache=cache, parallel=parallel)

    def target_costs(self, max_tokens: int) -> Curve:
        """The target's call costs for 1 .. max_tokens tokens, measured now or read from
        the cache of the target alone (calibrate.py)."""
        cache = cost_cache_path(cache_dir(), self.target, None)
        measured = cached_or_measured(cache, self.target, None, probe_context(self.target), max_tokens)
        return Curve(dict(enumerate(measured["target"], start=1)))


def make_drafter(draft: Backend | None, sampling: SamplingConfig, *, lookup: bool, ngram_max: int = 3,
                 suffix: SuffixDrafter | None = None) -> Drafter | None:
    """The drafter over a draft model's backend (drawing from `sampling`), with n-gram
    lookup beside it when `lookup` and the suffix drafter when given; the copying
    drafters alone without a model; None for none."""
    ngram = NgramDrafter(max_ngram=ngram_max) if lookup else None
    model = ModelDrafter(draft, sampling) if draft is not None else None
    parts = [d for d in (model, ngram, suffix) if d is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return HybridDrafter(model, ngram, suffix)


def assemble(options: ModelOptions, drafting: bool = True, sequences: int = 1) -> Models:
    """Load the target and, when drafting, the draft model (none for "ngram"), each
    holding `sequences` sequences at once (the server's slots, batching.py)."""
    target_engine, draft_engine = check_options(options, drafting)
    n_ctx = context_size(options, target_engine, draft_engine, sequences)
    on_workers = target_workers(options, target_engine)
    draft_on = draft_workers(options, draft_engine)
    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    kw = dict(device=options.device, dtype=options.dtype, threads=options.threads, n_ctx=n_ctx)
    target_quant = None if options.target_quant == "none" else options.target_quant
    kw["sequences"] = sequences if target_engine == "llamacpp" else 1
    target = hold_sequences(load_backend(options.target, target_engine, quant=target_quant,
                                         batch_invariant=options.batch_invariant, workers=on_workers, **kw),
                             sequences)
    if not drafting:
        return Models(target)
    suffix = SuffixIndex(options.suffix_tokens) if options.suffix_tokens else None
    if draft_engine is None:
        return Models(target, lookup=True, ngram_max=options.ngram_max, suffix=suffix)
    quant = options.draft_quant if draft_engine == "llamacpp" and options.draft_quant != "none" else None
    kw["sequences"] = sequences if draft_engine == "llamacpp" else 1
    draft = load_backend(options.draft, draft_engine, quant=quant, workers=draft_on, **kw)
    check_same_vocabulary(target, draft)  # before any prompt work
    if options.draft_vocab:
        from ..backends.draft_vocab import restrict_draft_vocabulary

        restrict_draft_vocabulary(draft, options.draft_vocab, cache_dir())
    return Models(target, hold_sequences(draft, sequences), lookup=options.lookup, ngram_max=options.ngram_max,
                  suffix=suffix, overlap=pair_overlaps(options, draft_engine, on_workers, draft_on))


def context_size(options: ModelOptions, target_engine: str, draft_engine: str | None, sequences: int) -> int:
    """The context of every sequence of target and draft (context_size.choose_context),
    from the models' headers or configs, before either loads; its note on stderr."""
    where = dict(device=options.device, dtype=options.dtype)
    models = [model_context(options.target, target_engine, **where)]
    if draft_engine is not None:
        models.append(model_context(options.draft, draft_engine, **where))
    try:
        n_ctx, note = choose_context(options.ctx_size, models, sequences,
                                     {pool: available_memory(pool) for pool in {m.pool for m in models}})
    except ValueError as e:
        raise OptionError(str(e)) from None
    if note:
        print(f"specsample: {note}", file=sys.stderr, flush=True)
    return n_ctx


def hold_sequences(backend: Backend, sequences: int) -> Backend:
    """The backend, holding `sequences` at once: a llama.cpp one was loaded so; an hf
    one gets a cache per sequence on the same weights (base.SeparateSequences says why)."""
    if backend.sequences >= sequences:
        return backend
    return SeparateSequences([backend] + [backend.sibling() for _ in range(sequences - 1)])


def check_options(options: ModelOptions, drafting: bool = True) -> tuple[str, str | None]:
    """The engines for the target and the draft model (None: no draft model), once every
    option has been checked: all before the first slow load, so that a bad draft option
    does not wait for the target to load."""
    check_machine_options(options)
    if options.suffix_tokens < 0:
        raise OptionError(f"--suffix-tokens must be >= 0, got {options.suffix_tokens}")
    target_engine = pick_backend(options.target, options.target_backend or options.backend, options.device)
    if options.target_quant != "none" and target_engine != "llamacpp":
        raise OptionError(f"--target-quant re-encodes a GGUF file for llama.cpp; the target runs on {target_engine} "
                          f"(use --dtype there)")
    target_workers(options, target_engine)
    if not drafting or options.draft == "ngram":
        if options.draft_rpc is not None:
            raise OptionError("--draft-rpc places a draft model on an RPC worker; "
                              + ("this run drafts nothing" if not drafting else "--draft ngram has no model"))
        return target_engine, None
    draft_engine = pick_backend(options.draft, options.draft_backend or options.backend, options.device)
    if options.draft_vocab and draft_engine != "hf":
        raise OptionError("--draft-vocab needs the hf backend for the draft (--draft-backend hf)")
    draft_workers(options, draft_engine)
    return target_engine, draft_engine


def target_workers(options: ModelOptions, target_engine: str):
    """The RPC workers --target-rpc names (rpc.RpcWorkers), checked; None: the target is local."""
    if options.target_rpc is None:
        if options.tensor_split is not None:
            raise OptionError("--tensor-split splits a target over --target-rpc workers; none is named")
        return None
    if target_engine != "llamacpp":
        raise OptionError(f"--target-rpc places a llama.cpp target on RPC workers; the target runs on {target_engine}")
    from ..backends.rpc import parse_workers

    try:
        return parse_workers(options.target_rpc, options.tensor_split, options.rpc_key)
    except ValueError as e:
        raise OptionError(str(e)) from None


def draft_workers(options: ModelOptions, draft_engine: str | None):
    """The RPC worker --draft-rpc names (rpc.RpcWorkers), checked; None: the draft is local."""
    if options.draft_rpc is None or draft_engine is None:
        return None
    if draft_engine != "llamacpp":
        raise OptionError(f"--draft-rpc places a llama.cpp draft on an RPC worker; the draft runs on {draft_engine}")
    from ..backends.rpc import parse_workers

    try:
        workers = parse_workers(options.draft_rpc, secret=options.rpc_key)
    except ValueError as e:
        text = str(e)
        raise OptionError(text.replace("--target-rpc", "--draft-rpc") if "--target-rpc" in text
                          else f"--draft-rpc: {text}") from None
    if len(workers.endpoints) > 1:
        raise OptionError("--draft-rpc names one worker: a small draft gains nothing from a split")
    return workers


def pair_overlaps(options: ModelOptions, draft_engine: str | None, target_on, draft_on) -> bool:
    """Whether drafting runs during the target's calls (decoding/overlap.py): asked for,
    with a draft model to draft, and target and draft compute on cores of their own
    (rpc.apart, which reads /proc only then), which needs one of them on workers."""
    if not options.overlap or draft_engine is None or target_on is None and draft_on is None:
        return False
    from ..backends.rpc import apart

    return apart(target_on, draft_on)


def check_machine_options(options: ModelOptions) -> None:
    """Threads and device that can work here, checked before the slow load."""
    if options.threads is not None and options.threads < 1:
        raise OptionError(f"--threads must be >= 1, got {options.threads}")
    check_device(options.device)


def check_device(device: str) -> None:
    """A device torch can use here, or an OptionError now rather than after the slow
    load (torch would raise a RuntimeError for a bad name, an AssertionError for CUDA
    on a CPU build)."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise OptionError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    if parsed.type == "cpu":
        return
    module = torch.backends.mps if parsed.type == "mps" else getattr(torch, parsed.type, None)
    if not getattr(module, "is_available", lambda: False)():
        raise OptionError(f"--device {device}: no {parsed.type} device is available to this torch {torch.__version__}")
    count = getattr(module, "device_count", lambda: 1)()
    if parsed.index is not None and parsed.index >= count:
        raise OptionError(f"--device {device}: the {parsed.type} devices here are numbered 0 to {count - 1}")

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

from dataclasses import dataclass

from .backends import load_backend, pick_backend
from .backends.base import Backend, check_same_vocabulary
from .calibrate import cost_cache_path
from .control import make_policy
from .drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir
from .plans import Policy
from .sampling import SamplingConfig


class OptionError(ValueError):
    """Options that cannot work together, or not on this machine; the message says which."""


@dataclass(frozen=True)
class ModelOptions:
    target: str = DEFAULT_TARGET  # short name, .gguf file, model directory or hub id
    draft: str = DEFAULT_DRAFT  # a model like target, or "ngram" for prompt lookup alone
    backend: str = "auto"  # engine for both: auto, hf, llamacpp
    target_backend: str | None = None  # overrides backend for the target
    draft_backend: str | None = None  # overrides backend for the draft
    draft_quant: str = "q4_0"  # llamacpp draft: requantize to this type ("none": keep the file)
    target_quant: str = "none"  # llamacpp target: re-encode to this type (bf16, f16, q8_0; "none": keep the file)
    draft_vocab: int = 0  # hf draft: score only its N most frequent tokens (0: all)
    lookup: bool = True  # beside a draft model, n-gram lookup proposes when it pays
    dtype: str = "float32"  # hf weights
    device: str = "cpu"  # hf device
    threads: int | None = None  # CPU threads (None: all cores)
    ngram_max: int = 3  # longest n-gram the lookup matches
    batch_invariant: bool = False  # llamacpp target: logits independent of the call size


@dataclass
class Models:
    """A loaded target and what drafts for it: a draft model's backend, lookup, both,
    or neither (autoregressive)."""

    target: Backend
    draft: Backend | None = None
    lookup: bool = False
    ngram_max: int = 3

    @property
    def drafts(self) -> bool:
        return self.draft is not None or self.lookup

    def drafter(self, sampling: SamplingConfig) -> Drafter | None:
        return make_drafter(self.draft, sampling, lookup=self.lookup, ngram_max=self.ngram_max)

    @property
    def drafter_name(self) -> str | None:
        drafter = self.drafter(SamplingConfig())
        return drafter.name if drafter is not None else None

    def policy(self, k: int | str, k_max: int = 8) -> Policy:
        """The draft-length policy to keep across generations (control.make_policy):
        for -k auto, an adaptive controller that starts from costs measured here, now,
        and cached per machine and model pair, so later runs start warm."""
        cache = cost_cache_path(cache_dir(), self.target, self.draft) if k == "auto" and self.drafts else None
        return make_policy(k, k_max, self.target, self.draft, drafts=self.drafts, cost_cache=cache)


def make_drafter(draft: Backend | None, sampling: SamplingConfig, *, lookup: bool, ngram_max: int = 3) -> Drafter | None:
    """The drafter over a draft model's backend (drawing from `sampling`), with n-gram
    lookup beside it when `lookup`; lookup alone without a model; None for neither."""
    ngram = NgramDrafter(max_ngram=ngram_max) if lookup else None
    if draft is None:
        return ngram
    model = ModelDrafter(draft, sampling)
    return HybridDrafter(model, ngram) if ngram is not None else model


def assemble(options: ModelOptions, drafting: bool = True) -> Models:
    """Load the target and, when drafting, the draft model (none for "ngram")."""
    check_machine_options(options)
    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    kw = dict(device=options.device, dtype=options.dtype, threads=options.threads)
    target_engine = pick_backend(options.target, options.target_backend or options.backend, options.device)
    target_quant = None if options.target_quant == "none" else options.target_quant
    if target_quant and target_engine != "llamacpp":
        raise OptionError(f"--target-quant re-encodes a GGUF file for llama.cpp; the target runs on {target_engine} "
                          f"(use --dtype there)")
    target = load_backend(options.target, target_engine, quant=target_quant,
                          batch_invariant=options.batch_invariant, **kw)
    if not drafting:
        return Models(target)
    if options.draft == "ngram":
        return Models(target, lookup=True, ngram_max=options.ngram_max)
    draft_engine = pick_backend(options.draft, options.draft_backend or options.backend, options.device)
    quant = options.draft_quant if draft_engine == "llamacpp" and options.draft_quant != "none" else None
    if options.draft_vocab and draft_engine != "hf":
        raise OptionError("--draft-vocab needs the hf backend for the draft (--draft-backend hf)")
    draft = load_backend(options.draft, draft_engine, quant=quant, **kw)
    check_same_vocabulary(target, draft)  # before any prompt work
    if options.draft_vocab:
        from .vocab import restrict_draft_vocabulary

        restrict_draft_vocabulary(draft, options.draft_vocab, cache_dir())
    return Models(target, draft, lookup=options.lookup, ngram_max=options.ngram_max)


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

"""What the benchmark times: our loops and peer implementations behind one call.

Every mode takes the same prompt token ids and decoding setting and returns an
Outcome whose stats use GenerationStats.as_dict() keys (peers fill what they can).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafters import ModelDrafter, NgramDrafter
from ..generate import GenerationConfig, generate
from ..sampling import SamplingConfig

SETTINGS = {
    "greedy": SamplingConfig(temperature=0.0),
    "sample": SamplingConfig(temperature=0.8, top_k=0, top_p=0.95),
}
FAMILIES = ("ar", "spec", "ngram", "hf-generate", "hf-assisted", "llamacpp-ar", "llamacpp-lookup")


@dataclass
class Outcome:
    token_ids: list[int]
    text: str
    stop_reason: str
    stats: dict = field(default_factory=dict)


class OurMode:
    """specsample's own loop: autoregressive, model draft, or n-gram draft."""

    def __init__(self, name: str, family: str, target, k: int | None = None, draft=None, ngram_max: int = 3):
        self.name, self.family, self.k = name, family, k
        self.target, self.draft, self.ngram_max = target, draft, ngram_max

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig, seed: int) -> Outcome:
        if self.family == "spec":
            drafter = ModelDrafter(self.draft, sampling)
        elif self.family == "ngram":
            drafter = NgramDrafter(max_ngram=self.ngram_max)
        else:
            drafter = None
        config = GenerationConfig(max_new_tokens=max_new_tokens, k=self.k or 1, sampling=sampling, seed=seed)
        result = generate(self.target, prompt_ids, config, drafter)
        return Outcome(result.token_ids, result.text, result.stop_reason, result.stats.as_dict())


class HFGenerateMode:
    """transformers' own `generate`, plain or with an assistant model (its assisted
    decoding, with a constant K and no confidence-based early stop)."""

    def __init__(self, name: str, target, assistant=None, k: int | None = None):
        self.name, self.k = name, k
        self.family = "hf-assisted" if assistant is not None else "hf-generate"
        self.target, self.assistant = target, assistant
        if assistant is not None:
            config = assistant.model.generation_config
            config.num_assistant_tokens = k
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0

    @torch.inference_mode()
    def run(self, prompt_ids, max_new_tokens, sampling, seed) -> Outcome:
        model = self.target.model
        input_ids = torch.tensor([prompt_ids], device=self.target.device)  # [1, prompt]
        eos = sorted(self.target.eos_token_ids)
        kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=eos, pad_token_id=eos[0],
                      repetition_penalty=1.0, attention_mask=torch.ones_like(input_ids))
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.model
        torch.manual_seed(seed)
        with _CallCounter(model) as target_calls, _CallCounter(self.assistant and self.assistant.model) as draft_calls:
            out = model.generate(input_ids, **kwargs)  # [1, prompt + new]
        new = out[0, len(prompt_ids):].tolist()
        stats = {"new_tokens": len(new), "target_calls": target_calls.n}
        if self.assistant is not None:
            # Each target call is one round that emits its accepted drafts plus one token.
            stats.update(draft_calls=draft_calls.n, drafted=draft_calls.n, accepted=max(0, len(new) - target_calls.n))
        stop = "eos" if new and new[-1] in self.target.eos_token_ids else "length"
        return Outcome(new, _decode(self.target, new), stop, stats)


class LlamaCppMode:
    """llama-cpp-python's high-level Llama, plain or with its prompt-lookup draft
    (LlamaPromptLookupDecoding), on the target's GGUF file."""

    def __init__(self, name: str, model_path, tokenizer, eos_token_ids, *, threads: int, n_ctx: int,
                 k: int | None = None, ngram_max: int = 3):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.name, self.k = name, k
        self.family = "llamacpp-lookup" if k else "llamacpp-ar"
        self.tokenizer, self.eos_token_ids = tokenizer, eos_token_ids
        self.drafted = 0
        lookup = LlamaPromptLookupDecoding(max_ngram_size=ngram_max, num_pred_tokens=k) if k else None
        # With a draft model Llama keeps logits for every position, so size n_ctx to the run.
        # logits_all must then be passed as True too: llama-cpp-python 0.3.16 switches to
        # all-position logits for a draft model but sizes its buffer from the argument
        # (n_batch = 512 rows), and fails once a prompt plus output passes 512 tokens.
        self.llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         draft_model=lookup and self._counting(lookup), logits_all=bool(lookup), verbose=False)
        self.calls = 0
        evaluate = self.llm.eval

        def counting_eval(tokens):
            self.calls += 1
            return evaluate(tokens)

        self.llm.eval = counting_eval

    def _counting(self, lookup):
        def propose(input_ids, **kwargs):
            draft = lookup(input_ids, **kwargs)
            self.drafted += len(draft)
            return draft

        return propose

    def run(self, prompt_ids, max_new_tokens, sampling, seed) -> Outcome:
        self.llm.reset()
        self.llm.set_seed(seed)
        self.calls = self.drafted = 0
        new, stop = [], "length"
        tokens = self.llm.generate(prompt_ids, temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                   min_p=0.0, repeat_penalty=1.0)
        for token in tokens:
            new.append(int(token))
            if token in self.eos_token_ids:
                stop = "eos"
                break
            if len(new) >= max_new_tokens:
                break
        tokens.close()
        # The first eval is the prompt, and it also yields the first token.
        stats = {"new_tokens": len(new), "target_calls": self.calls}
        if self.k:
            stats.update(drafted=self.drafted, accepted=max(0, len(new) - self.calls))
        return Outcome(new, self.tokenizer.decode(new) if self.tokenizer else "", stop, stats)


class _CallCounter:
    """Counts forward calls of a torch module while in the `with` block."""

    def __init__(self, module):
        self.module, self.n, self._handle = module, 0, None

    def __enter__(self):
        if self.module is not None:
            self._handle = self.module.register_forward_hook(self._hook)
        return self

    def _hook(self, *args):
        self.n += 1

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()


def _decode(backend, ids: list[int]) -> str:
    return backend.tokenizer.decode(ids) if backend.tokenizer is not None else ""


def build_modes(families, ks, peer_k, target, draft=None, *, target_gguf=None, ngram_max=3, n_ctx=2048):
    """The modes to run, and a note for every requested family that cannot run here."""
    modes, skipped = [], []
    hf_target = hasattr(target, "model")
    for family in families:
        if family == "ar":
            modes.append(OurMode("ar", "ar", target))
        elif family == "spec":
            if draft is None:
                skipped.append("spec: no draft model")
                continue
            modes += [OurMode(f"spec-k{k}", "spec", target, k, draft) for k in ks]
        elif family == "ngram":
            modes.append(OurMode(f"ngram-k{peer_k}", "ngram", target, peer_k, ngram_max=ngram_max))
        elif family == "hf-generate":
            if not hf_target:
                skipped.append("hf-generate: the target is not an hf backend")
                continue
            modes.append(HFGenerateMode("hf-generate", target))
        elif family == "hf-assisted":
            if not (hf_target and hasattr(draft, "model")):
                skipped.append("hf-assisted: needs hf backends for both target and draft")
                continue
            modes.append(HFGenerateMode(f"hf-assisted-k{peer_k}", target, draft, peer_k))
        elif family in ("llamacpp-ar", "llamacpp-lookup"):
            if target_gguf is None or not hasattr(target, "threads"):
                skipped.append(f"{family}: the target is not a llamacpp backend")
                continue
            k = peer_k if family == "llamacpp-lookup" else None
            name = f"llamacpp-lookup-k{peer_k}" if k else "llamacpp-ar"
            modes.append(LlamaCppMode(name, target_gguf, target.tokenizer, target.eos_token_ids,
                                      threads=target.threads, n_ctx=n_ctx, k=k, ngram_max=ngram_max))
        else:
            raise ValueError(f"unknown mode {family!r}; choose from {', '.join(FAMILIES)}")
    return modes, skipped

"""Research peers of the bench: transformers' own `generate` (plain, or assisted by the
draft model) and llama-cpp-python's Llama (plain, or with its prompt-lookup draft),
each behind the bench's mode interface (specsample.bench.modes). `python -m
benchmarks.bench --modes hf-generate,hf-assisted,...` runs them beside our modes.
"""

from __future__ import annotations

import torch

from specsample.app.arguments import UsageError
from specsample.bench.modes import FAMILIES as OUR_FAMILIES
from specsample.bench.modes import Outcome

from .peer_sampling import peer_sampling

PEER_FAMILIES = ("hf-generate", "hf-assisted", "hf-assisted-default", "llamacpp-ar", "llamacpp-lookup")
# transformers' own defaults for an assistant model (GenerationConfig in 5.x): up to
# 20 drafts, cut short when the assistant's confidence falls below a threshold that
# it tunes as it goes (and keeps across calls).
HF_ASSISTANT_DEFAULTS = dict(num_assistant_tokens=20, num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.4)


def first_stop(text: str, stop_strings: tuple[str, ...]) -> int | None:
    """Index of the earliest stop string in text, or None.

    "    return x\n\ndef g():" with the HumanEval stops -> 12 (the "\n" before "def")."""
    hits = [i for i in (text.find(s) for s in stop_strings) if i != -1]
    return min(hits) if hits else None


class HFGenerateMode:
    """transformers' own `generate`, plain or with an assistant model: either fixed
    (K drafts every round, no confidence stop: the configuration our spec-kK mirrors)
    or with transformers' defaults, as a user gets it."""

    structured = False

    def __init__(self, name: str, target, assistant=None, k: int | None = None):
        self.name, self.k = name, k
        self.target, self.assistant = target, assistant
        if assistant is None:
            self.family, self.assistant_settings = "hf-generate", {}
        elif k is None:
            self.family, self.assistant_settings = "hf-assisted-default", dict(HF_ASSISTANT_DEFAULTS)
        else:
            self.family = "hf-assisted"
            self.assistant_settings = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                                           assistant_confidence_threshold=0.0)

    @torch.inference_mode()
    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=()) -> Outcome:
        model = self.target.model
        input_ids = torch.tensor([prompt_ids], device=self.target.device)  # [1, prompt]
        eos = sorted(self.target.eos_token_ids)
        kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=eos, pad_token_id=eos[0],
                      attention_mask=torch.ones_like(input_ids), **peer_sampling("hf_generate", sampling))
        if stop_strings:
            # Our own criterion, not `stop_strings=`: transformers hands that on to the
            # assistant's generate, which then fails for want of a tokenizer.
            kwargs["stopping_criteria"] = [_StopStrings(self.target.tokenizer, len(prompt_ids), stop_strings)]
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.model
            self._swap_assistant_settings()
        torch.manual_seed(seed)
        try:
            with _CallCounter(model) as target_calls, _CallCounter(self.assistant and self.assistant.model) as draft_calls:
                out = model.generate(input_ids, **kwargs)  # [1, prompt + new]
        finally:
            if self.assistant is not None:
                self._swap_assistant_settings()
        new = out[0, len(prompt_ids):].tolist()
        stats = {"new_tokens": len(new), "target_calls": target_calls.n}
        if self.assistant is not None:
            # Each target call is one round that emits its accepted drafts plus one token.
            stats.update(draft_calls=draft_calls.n, drafted=draft_calls.n, accepted=max(0, len(new) - target_calls.n))
        text = _decode(self.target, new)
        stop = "eos" if new and new[-1] in self.target.eos_token_ids else "length"
        cut = first_stop(text, stop_strings)
        if cut is not None:
            text, stop = text[:cut], "stop_string"
        return Outcome(new, text, stop, stats)

    def _swap_assistant_settings(self) -> None:
        # The assistant's generation config is shared by every mode using it, and
        # transformers tunes the confidence threshold in place: each mode keeps its own.
        config = self.assistant.model.generation_config
        for key, value in self.assistant_settings.items():
            self.assistant_settings[key] = getattr(config, key, None)
            setattr(config, key, value)


class LlamaCppMode:
    """llama-cpp-python's high-level Llama, plain or with its prompt-lookup draft
    (LlamaPromptLookupDecoding), on the target's GGUF file."""

    structured = False

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

    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=()) -> Outcome:
        self.llm.reset()
        self.llm.set_seed(seed)
        self.calls = self.drafted = 0
        new, stop = [], "length"
        tokens = self.llm.generate(prompt_ids, **peer_sampling("llama_cpp_python", sampling))
        for token in tokens:
            new.append(int(token))
            if token in self.eos_token_ids:
                stop = "eos"
                break
            # Llama.generate has no stop strings; stop where create_completion would,
            # so the peer is timed on the same answer length as our loop.
            if stop_strings and first_stop(self.tokenizer.decode(new), stop_strings) is not None:
                stop = "stop_string"
                break
            if len(new) >= max_new_tokens:
                break
        tokens.close()
        # The first eval is the prompt, and it also yields the first token.
        stats = {"new_tokens": len(new), "target_calls": self.calls}
        if self.k:
            stats.update(drafted=self.drafted, accepted=max(0, len(new) - self.calls))
        text = self.tokenizer.decode(new) if self.tokenizer else ""
        cut = first_stop(text, stop_strings)
        return Outcome(new, text if cut is None else text[:cut], stop, stats)


class _StopStrings:
    """A transformers stopping criterion: True once the new text holds a stop string."""

    def __init__(self, tokenizer, prompt_length: int, stop_strings):
        self.tokenizer, self.prompt_length, self.stop_strings = tokenizer, prompt_length, tuple(stop_strings)

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:  # input_ids [1, prompt + new]
        text = self.tokenizer.decode(input_ids[0, self.prompt_length:].tolist())
        return torch.tensor([first_stop(text, self.stop_strings) is not None])


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


def build_peer_modes(families, peer_ks, target, draft=None, *, target_gguf=None, ngram_max=3, n_ctx=2048):
    """The peers' modes among `families`, and a note for each that cannot run here;
    peer_ks: the draft lengths of the fixed-K families (one mode per K)."""
    modes, skipped = [], []
    for family in families:
        if family == "hf-generate":
            if target.engine != "hf":
                skipped.append("hf-generate: the target is not an hf backend")
                continue
            modes.append(HFGenerateMode("hf-generate", target))
        elif family in ("hf-assisted", "hf-assisted-default"):
            if target.engine != "hf" or draft is None or draft.engine != "hf":
                skipped.append(f"{family}: needs hf backends for both target and draft")
                continue
            for k in peer_ks if family == "hf-assisted" else [None]:
                modes.append(HFGenerateMode(f"hf-assisted-k{k}" if k else family, target, draft, k))
        elif family in ("llamacpp-ar", "llamacpp-lookup"):
            if target_gguf is None or target.engine != "llamacpp":
                skipped.append(f"{family}: the target is not a llamacpp backend")
                continue
            for k in peer_ks if family == "llamacpp-lookup" else [None]:
                name = f"llamacpp-lookup-k{k}" if k else "llamacpp-ar"
                modes.append(LlamaCppMode(name, target_gguf, target.tokenizer, target.eos_token_ids,
                                          threads=target.threads, n_ctx=n_ctx, k=k, ngram_max=ngram_max))
        else:
            raise ValueError(f"unknown peer {family!r}; choose from {', '.join(PEER_FAMILIES)}")
    return modes, skipped


def check_remote_modes(args, families) -> None:
    """With --target-rpc or --draft-rpc, only our own modes: a peer (transformers,
    llama-server) would run the model on this machine, and its row would compare a
    local model with ours."""
    local = [f for f in families if f not in OUR_FAMILIES]
    for flag in ("target_rpc", "draft_rpc"):
        if getattr(args, flag, None) and local:
            raise UsageError(f"--{flag.replace('_', '-')} runs the {flag.split('_')[0]} on its workers in "
                             f"{', '.join(OUR_FAMILIES)} only; {', '.join(local)} would run it here (pass --modes)")

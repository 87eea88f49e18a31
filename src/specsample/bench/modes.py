"""What the benchmark times: our loops and peer implementations behind one call.

Every mode takes the same prompt token ids and decoding setting and returns an
Outcome whose stats use GenerationStats.as_dict() keys (peers fill what they can).
Modes that can hold an answer to a JSON schema or a tool call say so (`structured`);
the others sit out tasks that ask for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..app.assemble import make_drafter
from ..decoding.generate import GenerationConfig, generate
from ..decoding.sampling import SamplingConfig
from ..output.constraints import Constraint
from ..output.tools import special_markers, tool_constraint
from ..policy.calibrate import make_policy
from .native import LlamaServer, completion_request, parse_completion
from .peer_sampling import peer_sampling
from .tasks import first_stop
from .tool_task import call_grammar, library_tools, target_format

SETTINGS = {
    "greedy": SamplingConfig(temperature=0.0),
    "sample": SamplingConfig(temperature=0.8, top_k=0, top_p=0.95),
}
# Our own loop's modes (OurMode, on the target assemble loaded), then the peers'.
# spec-token and spec-auto-token are spec and spec-auto verified token by token
# (verifier "rejection"), rows to set beside those modes under --verifier block; run
# when named, never by --modes auto.
TOKEN_FAMILIES = {"spec-token": "spec", "spec-auto-token": "spec-auto"}
OUR_FAMILIES = ("ar", "spec-auto", "spec", "ngram", *TOKEN_FAMILIES)
FAMILIES = OUR_FAMILIES + ("hf-generate", "hf-assisted", "hf-assisted-default", "llamacpp-ar", "llamacpp-lookup",
                           "llamacpp-server", "llamacpp-spec")
AUTO_FAMILIES = tuple(f for f in FAMILIES if f not in TOKEN_FAMILIES)
# transformers' own defaults for an assistant model (GenerationConfig in 5.x): up to
# 20 drafts, cut short when the assistant's confidence falls below a threshold that
# it tunes as it goes (and keeps across calls).
HF_ASSISTANT_DEFAULTS = dict(num_assistant_tokens=20, num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.4)


@dataclass
class Outcome:
    token_ids: list[int]
    text: str
    stop_reason: str
    stats: dict = field(default_factory=dict)


class OurMode:
    """specsample's own loop: autoregressive, model draft, n-gram draft, or the
    default `-k auto` (the planner over the hybrid drafter, or over
    lookup alone without a draft model). The planner lives as long as
    the mode, as it would in a server: its measurements carry across prompts."""

    structured = True

    def __init__(self, name: str, family: str, target, k: int | str | None = None, draft=None, ngram_max: int = 3,
                 k_max: int = 8, verifier: str = "auto"):
        self.name, self.family, self.k = name, family, k
        self.target, self.draft, self.ngram_max = target, draft, ngram_max
        # GenerationConfig.verifier: "auto" is coupled here, as every prompt is seeded.
        self.verifier = "rejection" if family in TOKEN_FAMILIES else verifier
        self.loop = TOKEN_FAMILIES.get(family, family)  # the loop it runs: spec-token runs spec's
        self.policy = make_policy(k or 1, k_max, target, draft if self.loop in ("spec", "spec-auto") else None,
                                  drafts=family != "ar")

    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=(), schema=None, tools=()) -> Outcome:
        # spec-auto: the hybrid drafter (lookup alone without a draft model); spec: the
        # draft model alone; ngram: lookup alone; ar: none.
        draft = self.draft if self.loop in ("spec", "spec-auto") else None
        drafter = make_drafter(draft, sampling, lookup=self.loop in ("spec-auto", "ngram"), ngram_max=self.ngram_max)
        config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                                  stop_strings=tuple(stop_strings), verifier=self.verifier,
                                  constraint=self._constraint(schema, tools))
        result = generate(self.target, prompt_ids, config, drafter, self.policy)
        return Outcome(result.token_ids, result.text, result.stop_reason, result.stats.as_dict())

    def _constraint(self, schema, tools) -> Constraint | None:
        if tools:
            fmt = target_format(self.target)
            return tool_constraint(library_tools(tools), fmt, "required", False, special_markers(self.target, fmt))
        return None if schema is None else Constraint.json_schema(schema)


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


class LlamaServerMode:
    """llama.cpp's own speculative decoding (llama-server with a draft model), or the
    same server decoding plainly (k None): see native.py for what it measures. A
    schema goes in its `json_schema` field (llama.cpp turns it into a grammar), tools
    in its `grammar` field as GBNF of the same calls."""

    structured = True

    def __init__(self, name: str, server, k: int | None = None):
        self.name, self.server, self.k = name, server, k
        self.family = "llamacpp-spec" if k else "llamacpp-server"

    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=(), schema=None, tools=()) -> Outcome:
        body = completion_request(prompt_ids, max_new_tokens, sampling, seed, stop_strings, self.k, schema,
                                  call_grammar(tools) if tools else None)
        parsed = parse_completion(self.server.complete(body))
        return Outcome(parsed["token_ids"], parsed["text"], parsed["stop_reason"], parsed["stats"])


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


def build_modes(families, ks, peer_ks, target, draft=None, *, target_gguf=None, ngram_max=3, n_ctx=2048,
                k_max: int = 8, server: LlamaServer | None = None, no_server: str | None = None,
                verifier: str = "auto"):
    """The modes to run, and a note for every requested family that cannot run here.

    peer_ks: the draft lengths of the peers' fixed-K families (one mode per K).
    server: a running llama-server for the llamacpp-spec and llamacpp-server
    families; without one, no_server is the one-line reason why.
    verifier: how our drafting modes verify (GenerationConfig.verifier), but the
    TOKEN_FAMILIES, which verify token by token."""
    modes, skipped = [], []
    for family in families:
        token = "-token" if family in TOKEN_FAMILIES else ""
        ours = dict(target=target, verifier=verifier)
        if family == "ar":
            modes.append(OurMode("ar", "ar", target))
        elif family in ("spec-auto", "spec-auto-token"):
            modes.append(OurMode(family, family, k="auto", draft=draft, ngram_max=ngram_max, k_max=k_max, **ours))
        elif family in ("spec", "spec-token"):
            if draft is None:
                skipped.append(f"{family}: no draft model")
                continue
            modes += [OurMode(f"spec-k{k}{token}", family, k=k, draft=draft, **ours) for k in ks]
        elif family == "ngram":
            modes += [OurMode(f"ngram-k{k}", "ngram", k=k, ngram_max=ngram_max, **ours) for k in peer_ks]
        elif family == "hf-generate":
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
        elif family in ("llamacpp-server", "llamacpp-spec"):
            if server is None:
                skipped.append(f"{family}: {no_server or 'needs GGUF files for target and draft'}")
                continue
            for k in peer_ks if family == "llamacpp-spec" else [None]:
                modes.append(LlamaServerMode(f"llamacpp-spec-k{k}" if k else family, server, k))
        else:
            raise ValueError(f"unknown mode {family!r}; choose from {', '.join(FAMILIES)}")
    return modes, skipped

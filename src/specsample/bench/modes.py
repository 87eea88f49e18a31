"""What the benchmark times: our loops, behind the one call that the research bench's
peers (benchmarks/: llama-server, transformers, llama-cpp-python) answer too.

Every mode takes the same prompt token ids and decoding setting and returns an
Outcome whose stats use GenerationStats.as_dict() keys (peers fill what they can).
Modes that can hold an answer to a JSON schema or a tool call say so (`structured`);
the others sit out tasks that ask for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..app.assemble import make_drafter
from ..decoding.generate import GenerationConfig, generate
from ..decoding.sampling import SamplingConfig
from ..output.constraints import Constraint
from ..output.tools import Tool, ToolFormat, special_markers, tool_constraint, tool_format
from ..policy.make import K_MAX, make_policy

SETTINGS = {
    "greedy": SamplingConfig(temperature=0.0),
    "sample": SamplingConfig(temperature=0.8, top_k=0, top_p=0.95),
}
# Our own loop's modes (OurMode, on the target assemble loaded); the peers (llama-server,
# transformers, llama-cpp-python) are the research bench's (benchmarks/native.py,
# peers.py). spec-token and spec-auto-token are spec and spec-auto verified token by
# token (verifier "rejection"), rows to set beside those modes under --verifier block;
# run when named, never by --modes auto.
TOKEN_FAMILIES = {"spec-token": "spec", "spec-auto-token": "spec-auto"}
FAMILIES = ("ar", "spec-auto", "spec", "ngram", *TOKEN_FAMILIES)
AUTO_FAMILIES = tuple(f for f in FAMILIES if f not in TOKEN_FAMILIES)


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
                 k_max: int = K_MAX, verifier: str = "auto", overlap: bool = False):
        self.name, self.family, self.k, self.overlap = name, family, k, overlap  # overlap: the pair's placement
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
        result = generate(self.target, prompt_ids, config, drafter, self.policy, overlap=self.overlap)
        return Outcome(result.token_ids, result.text, result.stop_reason, result.stats.as_dict())

    def _constraint(self, schema, tools) -> Constraint | None:
        if tools:
            fmt = target_format(self.target)
            return tool_constraint(library_tools(tools), fmt, "required", False, special_markers(self.target, fmt))
        return None if schema is None else Constraint.json_schema(schema)


def build_modes(families, ks, peer_ks, target, draft=None, *, ngram_max=3, k_max: int = K_MAX,
                verifier: str = "auto", overlap: bool = False):
    """The modes to run, and a note for every requested family that cannot run here.

    peer_ks: the draft lengths of ngram (one mode per K).
    verifier: how our drafting modes verify (GenerationConfig.verifier), but the
    TOKEN_FAMILIES, which verify token by token. overlap: the pair's placement
    (assemble's Models.overlap), for the modes that draft with the draft model."""
    modes, skipped = [], []
    for family in families:
        token = "-token" if family in TOKEN_FAMILIES else ""
        ours = dict(target=target, verifier=verifier, overlap=overlap)
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
        else:
            raise ValueError(f"unknown mode {family!r}; choose from {', '.join(FAMILIES)}")
    return modes, skipped


def library_tools(tools) -> list[Tool]:
    return [Tool(t["function"]["name"], t["function"]["parameters"]) for t in tools]


def target_format(target) -> ToolFormat:
    fmt = tool_format(target.tokenizer.chat_template if target.tokenizer is not None else None)
    if fmt is None:
        raise ValueError(f"an answer held to tools needs a model whose chat template shows a tool-call format; {target.name} "
                         "has none that specsample reads")
    return fmt

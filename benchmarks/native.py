"""llama.cpp's own speculative decoding (`llama-server -md`) and plain llama-server as
research peers of the bench: the families llamacpp-server and llamacpp-spec of
`python -m benchmarks.bench` (and `make demo`), and the llama-server of its --serve.

The pinned llama-cpp-python sdist vendors the whole llama.cpp tree it was built
from, so the server we compare with is the same llama.cpp as our llama.cpp backend:
`python -m benchmarks.llama_server` builds it once with CMake and caches it under the
specsample cache directory, where the research bench finds it (or --llama-server names
another).

Why the server and not `llama-speculative-simple`: the server stops on strings
(the HumanEval protocol needs it), loads both models once for the whole run, takes
the prompt as token ids (so it sees exactly the tokens our loops see), and reports
prompt and generation time apart, with its draft counts.

What its numbers mean (read from tools/server/server.cpp of that tree):
- timings.predicted_ms runs from the first sampled token to the last, so the
  target's prompt prefill is left out and the draft's prefill (done on the first
  draft call) stays in, as in our "decode" figures.
- Drafts are the draft model's most probable tokens, cut short once that token's
  probability falls below `speculative.p_min` (default 0.75) and dropped when shorter
  than `speculative.n_min`; we send p_min 0 and n_min 0 so that every round drafts
  exactly min(K, tokens left - 1), as our loop does.
- Verification samples the target and accepts a draft token only when the sample
  equals it: exact, but below the rejection scheme's acceptance when sampling.
"""

from __future__ import annotations

import json
from pathlib import Path

from specsample.backends.models import cache_dir, resolve
from specsample.bench.modes import Outcome
from specsample.bench.options import threads
from specsample.output.tools import HERMES, ToolFormat

from .peer_sampling import peer_sampling
from .servers import ServerProcess, ServerUnavailable

FAMILIES = ("llamacpp-server", "llamacpp-spec")

LLAMA_CPP_PYTHON_VERSION = "0.3.16"
SERVER_NAME = f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"


class NativeUnavailable(ServerUnavailable):
    """The native peer cannot run here; the message is the one-line reason."""


def server_path() -> Path:
    return cache_dir() / "bin" / SERVER_NAME


def llama_server_binary(path: Path | None = None) -> Path:
    """`--llama-server PATH`, or the pinned build that `python -m benchmarks.llama_server`
    makes (the same llama.cpp as our llama.cpp backend)."""
    binary = Path(path) if path is not None else server_path()
    if not binary.is_file():
        raise NativeUnavailable(f"--llama-server {binary}: no such file" if path is not None else
                                f"{binary} is not built (python -m benchmarks.llama_server builds it, once)")
    return binary


def completion_request(prompt_ids: list[int], max_new_tokens: int, sampling, seed: int, stop_strings, k: int | None,
                       json_schema: dict | None = None, grammar: str | None = None) -> dict:
    """A /completion body that decodes as our loops do: the same tokens, sampling
    and stop strings, with llama.cpp's extra samplers and penalties off; with a
    schema or a GBNF grammar, the answer held to it (llama.cpp converts a schema to a
    grammar)."""
    body = {
        "prompt": list(prompt_ids), "n_predict": max_new_tokens, "stop": list(stop_strings), "seed": seed,
        **peer_sampling("llama_server", sampling),
        "cache_prompt": True,  # the server speculates only with it on; we erase the slot before each request
        "return_tokens": True, "stream": False,
        "speculative.n_max": k or 0, "speculative.n_min": 0, "speculative.p_min": 0.0,
    }
    if json_schema is not None:
        body["json_schema"] = json_schema
    if grammar is not None:
        body["grammar"] = grammar
    return body


def parse_completion(response: dict) -> dict:
    """token_ids, text, stop_reason and GenerationStats-style stats of one /completion answer."""
    timings = response["timings"]
    tokens = list(response.get("tokens") or [])
    # predicted_n also counts accepted drafts past a stop string; the token list does not.
    new_tokens = len(tokens) if tokens else timings["predicted_n"]
    stop = {"eos": "eos", "word": "stop_string", "limit": "length"}.get(response.get("stop_type"), "length")
    drafted = timings.get("draft_n", 0)
    stats = {
        "new_tokens": new_tokens,
        "drafted": drafted,
        "accepted": timings.get("draft_n_accepted", 0),
        "acceptance_rate": timings.get("draft_n_accepted", 0) / drafted if drafted else None,
        "prefill_seconds": timings["prompt_ms"] / 1000,
        # Its first token is sampled from the prompt's last row: the prefill is its wait.
        "first_token_seconds": timings["prompt_ms"] / 1000,
        "decode_seconds": timings["predicted_ms"] / 1000,
        "prompt_tokens_evaluated": timings["prompt_n"],
    }
    return {"token_ids": tokens, "text": response.get("content", ""), "stop_reason": stop, "stats": stats}


def llama_server_argv(binary: Path, target_gguf, draft_gguf, *, port: int, tmp: str, threads: int, n_ctx: int,
                      k_max: int, parallel: int = 1) -> list[str]:
    """llama-server's command line: the target and draft on `threads` threads, `parallel`
    slots (-np) of n_ctx tokens each. llama-server divides -c among its slots, so -c is
    parallel x n_ctx; the draft gets a context of its own in every slot, sized by -cd."""
    return [str(binary), "-m", str(target_gguf), "-md", str(draft_gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-td", str(threads), "-tbd", str(threads),
            "-c", str(n_ctx * parallel), "-cd", str(n_ctx), "-np", str(parallel), "-ngl", "0", "-ngld", "0",
            "--draft-max", str(k_max), "--draft-min", "0", "--draft-p-min", "0",
            "--slot-save-path", tmp, "--no-webui",
            # An HTTP thread for every client of `bench --serve` (its default is the
            # core count), so waiting clients queue in the server, not in its backlog.
            "--threads-http", "64"]


class LlamaServer(ServerProcess):
    """One llama-server process holding the target and draft models, on a local port,
    with `parallel` slots (requests decoded at once, in one batch per step)."""

    def __init__(self, binary: Path, target_gguf, draft_gguf, *, threads: int, n_ctx: int, k_max: int,
                 parallel: int = 1):
        super().__init__(lambda port, tmp: llama_server_argv(binary, target_gguf, draft_gguf, port=port, tmp=tmp,
                                                             threads=threads, n_ctx=n_ctx, k_max=k_max,
                                                             parallel=parallel), name="llama-server", parallel=parallel)

    _seen: frozenset = frozenset()  # the tokens of the last request's prompt and answer

    def complete(self, body: dict) -> dict:
        # A fresh prefill every time, as our loops do: forget the previous prompt.
        self.request("/slots/0?action=erase", {})
        if body.get("speculative.n_max"):
            self.forget_draft(body["prompt"])
        response = self.request("/completion", body)
        self._seen = frozenset(body["prompt"]) | frozenset(response.get("tokens") or ())
        return response

    def forget_draft(self, prompt: list[int], slot: int = 0) -> None:
        """Empty the draft model's context in `slot` before a measured request. Erasing the
        slot leaves it, and common_speculative_gen_draft reuses it: when it holds this
        prompt followed by an earlier answer (the same prompt asked before by another
        K, the other setting or the warm-up), it hands that answer back as the draft,
        free and mostly right, which no user's fresh request gets. A short request that
        starts with a token found in neither this prompt nor the last request's text
        matches nothing there, so the draft's context is cleared and refilled with it."""
        seen = self._seen | frozenset(prompt)
        token = next(t for t in range(1000, 0, -1) if t not in seen)
        self.request("/completion", {"prompt": [token, token], "n_predict": 4, "temperature": 0.0, "cache_prompt": True,
                                     "speculative.n_max": 2, "speculative.n_min": 0, "speculative.p_min": 0.0,
                                     "id_slot": slot})
        self.request(f"/slots/{slot}?action=erase", {})

    def reset(self, prompts: list[list[int]]) -> None:
        """Before a serving load of these prompts: every slot forgets its cached prompt
        and its draft context, so no request finds an earlier answer to reuse (the same
        prompts come again under the other setting and every client count)."""
        everything = [t for prompt in prompts for t in prompt]
        for slot in range(self.parallel):
            self.forget_draft(everything, slot)


class LlamaServerMode:
    """llama.cpp's own speculative decoding (llama-server with a draft model), or the
    same server decoding plainly (k None), behind the bench's mode interface. A schema
    goes in its `json_schema` field (llama.cpp turns it into a grammar), tools in its
    `grammar` field as GBNF of the same calls."""

    structured = True

    def __init__(self, name: str, server, k: int | None = None):
        self.name, self.server, self.k = name, server, k
        self.family = "llamacpp-spec" if k else "llamacpp-server"

    def run(self, prompt_ids, max_new_tokens, sampling, seed, stop_strings=(), schema=None, tools=()) -> Outcome:
        body = completion_request(prompt_ids, max_new_tokens, sampling, seed, stop_strings, self.k, schema,
                                  call_grammar(tools) if tools else None)
        parsed = parse_completion(self.server.complete(body))
        return Outcome(parsed["token_ids"], parsed["text"], parsed["stop_reason"], parsed["stats"])


def build_llama_server_modes(families, peer_ks, server: LlamaServer | None, no_server: str | None = None):
    """The llamacpp-server and llamacpp-spec modes (one of the latter per K of peer_ks)
    on a running server, and a note for each family asked for when there is none
    (no_server: why)."""
    modes, skipped = [], []
    for family in families:
        if server is None:
            skipped.append(f"{family}: {no_server or 'needs GGUF files for target and draft'}")
            continue
        for k in peer_ks if family == "llamacpp-spec" else [None]:
            modes.append(LlamaServerMode(f"llamacpp-spec-k{k}" if k else family, server, k))
    return modes, skipped


def call_grammar(tools, fmt: ToolFormat = HERMES) -> str:
    """GBNF for llama-server: one call in the format, its body under the tools'
    schemas (llama-cpp-python's converter, the one llama.cpp's own follows)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    bodies = {"anyOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                          "arguments": t["function"]["parameters"]},
                         "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
    body = json_schema_to_gbnf(json.dumps(bodies), prop_order=["name", "arguments"])
    body = body.replace("root ::=", "call-body ::=", 1)
    return f"root ::= {json.dumps(fmt.trigger + fmt.opening)} call-body {json.dumps(fmt.closing)}\n{body}"


def start_server(args, families, n_ctx: int, k_max: int, target_gguf: Path | None, parallel: int = 1,
                 loaded_draft=None) -> LlamaServer | None:
    """A running llama-server for the llama-server families on the target file our modes
    run (re-encoded as --target-quant says), with `parallel` slots of n_ctx tokens each;
    None when no mode asks for one. Raises ServerUnavailable with the one-line reason
    when it cannot run here."""
    if not set(FAMILIES) & set(families):
        return None
    if args.draft == "ngram":
        raise ServerUnavailable("needs a draft model")
    draft = resolve(args.draft)
    if target_gguf is None or draft.gguf_path is None:
        raise ServerUnavailable("needs GGUF files for target and draft")
    binary = llama_server_binary(args.llama_server)
    # The peer gets the very files our modes use (the draft as requantized by --draft-quant).
    draft_path = getattr(loaded_draft, "path", None) or draft_file(args, draft.gguf_path)
    return LlamaServer(binary, target_gguf, draft_path, threads=threads(args), n_ctx=n_ctx, k_max=k_max,
                       parallel=parallel)


def draft_file(args, gguf: Path) -> Path:
    """The draft file our llama.cpp modes load: requantized as --draft-quant says."""
    if args.draft_quant == "none":
        return gguf
    from specsample.backends.reencode import reencoded

    return reencoded(gguf, args.draft_quant)

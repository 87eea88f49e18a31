"""What cache_prompt saves a chat: each turn of an agent-like conversation repeats the
whole conversation before it (a system prompt holding a source file, then the turns),
asked of one real `specsample serve` with cache_prompt off and then on, streamed.
Reports per turn the prompt tokens, those a slot held already, and the time to the
first token.

    python -m benchmarks.studies.prompt_cache --threads 2 --out results/prompt-cache

With --side, a side request (a one-sentence summary of the last exchange, as aider
sends between turns) takes the one slot between turns, and the two settings are the
slot's cache alone (`serve --prompt-cache-mib 0`) and the host prompt cache beside it
(the default), cache_prompt on in both.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path

QUESTIONS = [
    "What does dedent do? One sentence.",
    "Which function wraps a paragraph? One sentence.",
    "Write a one-line example that calls shorten.",
    "Which regular expression finds leading whitespace? Name it.",
]
MAX_TOKENS = 48


def conversation(url: str, model: str, cache_prompt: bool, module=textwrap, turns_asked: int = len(QUESTIONS),
                 side: bool = False) -> list[dict]:
    """Every turn of the conversation, in order: its prompt tokens, cached tokens and
    time to first token; with `side`, a side request before each turn after the first."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1200)
    messages = [{"role": "system", "content": "You answer questions about this module:\n\n" +
                 inspect.getsource(module)}]
    turns = []
    for question in QUESTIONS[:turns_asked]:
        if side and turns:
            client.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=[
                {"role": "system", "content": "Summarize the exchange below in one sentence."},
                {"role": "user", "content": f"{messages[-2]['content']}\n{messages[-1]['content']}"}])
        messages.append({"role": "user", "content": question})
        started, first, text, usage = time.perf_counter(), None, "", None
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"cache_prompt": cache_prompt}):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - started
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
        messages.append({"role": "assistant", "content": text})
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        turns.append({"prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached, "ttft_seconds": first,
                      "seconds": time.perf_counter() - started, "text": text})
    return turns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.prompt_cache", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--module", default="textwrap", help="the standard module whose source the system prompt holds")
    p.add_argument("--turns", type=int, default=len(QUESTIONS), choices=range(1, len(QUESTIONS) + 1))
    p.add_argument("--side", action="store_true", help="a side request between turns; compare the host prompt "
                                                       "cache against the slot's alone")
    args = p.parse_args(argv)
    import importlib

    from benchmarks.serving import specsample_server

    module = importlib.import_module(args.module)

    model_argv = ["--threads", str(args.threads)] if args.threads else []
    command = "python -m benchmarks.studies.prompt_cache " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = {}
    # A server each: "on" starts with an empty cache too. With --side, "off" is the
    # slot's cache alone and "on" the host prompt cache beside it.
    settings = ((("off", True, ["--prompt-cache-mib", "0"]), ("on", True, [])) if args.side else
                (("off", False, []), ("on", True, [])))
    for name, on, serve_argv in settings:
        with specsample_server(model_argv, ["--parallel", "1", *serve_argv], f"serve, {name}") as server:
            runs[name] = conversation(server.url, server.request("/v1/models")["data"][0]["id"], on, module,
                                      args.turns, args.side)
    if args.side:
        return report_side(command, runs, args.out, args.module)
    rows = ["| turn | prompt tokens | cached (on) | TTFT off s | TTFT on s | same answer |", "|---|---|---|---|---|---|"]
    for i, (off, on) in enumerate(zip(runs["off"], runs["on"]), start=1):
        rows.append(f"| {i} | {off['prompt_tokens']} | {on['cached_tokens']} | {off['ttft_seconds']:.2f} | "
                    f"{on['ttft_seconds']:.2f} | {'yes' if off['text'] == on['text'] else 'no'} |")
    report = "\n".join([f"Command: `{command}`", "", f"{len(QUESTIONS)} turns, greedy, {MAX_TOKENS} tokens at most "
                        "each, a fresh `specsample serve --parallel 1` (default pair, -k auto) for each setting; each "
                        "turn repeats the conversation before it. Same answer: the turn's text with cache_prompt off "
                        "and on (the default kernels' numbers move with a call's size: docs/serve.md).", "", *rows, ""])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompt-cache.md").write_text(report)
    (args.out / "prompt-cache.json").write_text(json.dumps({"command": command, **runs}, indent=1))
    print(report)
    return 0


def report_side(command: str, runs: dict, out: Path, module: str) -> int:
    rows = ["| turn | prompt tokens | cached, slot alone | cached, host cache | TTFT slot alone s | TTFT host cache s "
            "| same answer |", "|---|---|---|---|---|---|---|"]
    for i, (off, on) in enumerate(zip(runs["off"], runs["on"]), start=1):
        rows.append(f"| {i} | {off['prompt_tokens']} | {off['cached_tokens']} | {on['cached_tokens']} | "
                    f"{off['ttft_seconds']:.2f} | {on['ttft_seconds']:.2f} | {'yes' if off['text'] == on['text'] else 'no'} |")
    report = "\n".join([f"Command: `{command}`", "", f"{len(runs['on'])} turns about `{module}`'s source, greedy, "
                        f"{MAX_TOKENS} tokens at most each, a side request (a one-sentence summary, 8 tokens) before "
                        "each turn after the first, a fresh `specsample serve --parallel 1` (default pair, -k auto) "
                        "for each setting, cache_prompt on: the slot's cache alone (`--prompt-cache-mib 0`) or the "
                        "host prompt cache beside it (default).", "", *rows, ""])
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompt-cache-side.md").write_text(report)
    (out / "prompt-cache-side.json").write_text(json.dumps({"command": command, **runs}, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

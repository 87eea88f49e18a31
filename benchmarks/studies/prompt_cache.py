"""What cache_prompt saves a chat: each turn of an agent-like conversation repeats the
whole conversation before it (a system prompt holding a source file, then the turns),
asked of one real `specsample serve` with cache_prompt off and then on, streamed.
Reports per turn the prompt tokens, those a slot held already, and the time to the
first token.

    python -m benchmarks.studies.prompt_cache --threads 2 --out results/prompt-cache
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


def conversation(url: str, model: str, cache_prompt: bool) -> list[dict]:
    """Every turn of the conversation, in order: its prompt tokens, cached tokens and
    time to first token."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1200)
    messages = [{"role": "system", "content": "You answer questions about this module:\n\n" +
                 inspect.getsource(textwrap)}]
    turns = []
    for question in QUESTIONS:
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
    args = p.parse_args(argv)
    from specsample.bench import specsample_server

    model_argv = ["--threads", str(args.threads)] if args.threads else []
    command = "python -m benchmarks.studies.prompt_cache " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = {}
    for name, on in (("off", False), ("on", True)):  # a server each: "on" starts with an empty cache too
        with specsample_server(model_argv, ["--parallel", "1"], f"serve, cache_prompt {name}") as server:
            runs[name] = conversation(server.url, server.request("/v1/models")["data"][0]["id"], on)
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


if __name__ == "__main__":
    sys.exit(main())

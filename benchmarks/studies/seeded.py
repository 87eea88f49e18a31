"""Does a seed give the same text whichever server answers? Real `specsample serve`
processes, one at a time (`--autoregressive`, `-k auto`, `-k 3`), each asked the same
seeded, sampled questions by 6 concurrent clients, half of them streaming; with the
engine's default kernels and with `--batch-invariant`. Reports, per kernel setting,
how many (question, client) answers equal the autoregressive server's.

    python -m benchmarks.studies.seeded --threads 2 --out results/seeded
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

QUESTIONS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a Python generator is, with an example.",
]
SERVERS = {"autoregressive": ["--autoregressive"], "-k auto": [], "-k 3": ["-k", "3"]}
REQUEST = dict(temperature=0.8, top_p=0.95, max_tokens=64, seed=7)


def ask(url: str, model: str, question: str, stream: bool) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": question}]
    if stream:
        chunks = client.chat.completions.create(model=model, messages=messages, stream=True, **REQUEST)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return client.chat.completions.create(model=model, messages=messages, **REQUEST).choices[0].message.content


def answers(model_argv: list[str], extra: list[str], name: str, clients: int) -> dict[str, list[str]]:
    from benchmarks.serving import specsample_server

    with specsample_server(model_argv, extra, name) as server:
        model = server.request("/v1/models")["data"][0]["id"]
        with ThreadPoolExecutor(clients) as pool:
            return {q: list(pool.map(lambda i, q=q: ask(server.url, model, q, stream=i % 2 == 1), range(clients)))
                    for q in QUESTIONS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.seeded", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    model_argv = ["--threads", str(args.threads)] if args.threads else []
    report = {"command": "python -m benchmarks.studies.seeded " + " ".join(argv if argv is not None else sys.argv[1:]),
              "request": REQUEST, "clients": args.clients, "kernels": {}}
    for kernels, flags in (("default", []), ("batch-invariant", ["--batch-invariant"])):
        texts = {name: answers(model_argv, flags + extra, f"serve {name}", args.clients)
                 for name, extra in SERVERS.items()}
        reference = texts["autoregressive"]
        report["kernels"][kernels] = {
            name: {"same as autoregressive": sum(a == reference[q][0] for q in QUESTIONS for a in texts[name][q]),
                   "answers": len(QUESTIONS) * args.clients,
                   "clients agree within the server": sum(len(set(texts[name][q])) == 1 for q in QUESTIONS)}
            for name in SERVERS}
        report["kernels"][kernels]["texts"] = texts
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeded.json").write_text(json.dumps(report, indent=1) + "\n")
    json.dump({k: {n: v for n, v in d.items() if n != "texts"} for k, d in report["kernels"].items()}, sys.stdout,
              indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

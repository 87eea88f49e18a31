"""Time to first token against llama-server, on the same file and threads (issue 51).

    python -m benchmarks.ttft --sizes 40,500,2000,4000 --reps 2 --out docs/results/ttft/q4_k_m
    python -m benchmarks.ttft --target-quant bf16 --sizes 40,500,2000 --out docs/results/ttft/bf16

Starts three servers at once on the default target (or --target-quant's re-encoding):
llama-server with its own defaults and no draft (`ls`), `specsample serve
--autoregressive` (`plain`) and `specsample serve` (`auto`: -k auto with the draft
model), each with one slot and --threads. All load before any request, and each
prompt size is asked of the three in a rotating order, so drift and the order itself
hit each alike. A prompt is a streamed chat of about N tokens (the README's text)
asking for a one-sentence summary, opened with a nonce so that no prompt cache can
help; TTFT is the time to the first content delta, the whole request runs to 8 tokens.
--servers ls,auto starts only those (ls is always started: every ratio is to it).
Writes ttft.json and ttft.md under --out; sends to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS_PER_TOKEN = 0.62  # the README's text, in the default pair's tokenizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers(args) -> dict[str, list[str]]:
    from specsample.backends.models import DEFAULT_TARGET, resolve
    from specsample.backends.reencode import reencoded
    from benchmarks.llama_server import ensure_server

    target = resolve(DEFAULT_TARGET).gguf_path
    target = target if args.target_quant == "none" else reencoded(target, args.target_quant)
    ours = [sys.executable, "-m", "specsample", "serve", "--parallel", "1", "--ctx-size", str(args.ctx),
            "--threads", str(args.threads), "--target-quant", args.target_quant]
    return {
        "ls": [str(ensure_server()), "-m", str(target), "-t", str(args.threads), "-tb", str(args.threads),
               "-c", str(args.ctx), "-np", "1", "--no-webui"],
        "plain": ours + ["--autoregressive"],
        "auto": ours,
    }


def wait_ready(http: httpx.Client, url: str, proc: subprocess.Popen, exited: str) -> None:
    """Until the server at `url` answers /health (10 minutes at most); SystemExit(exited)
    if its process ends first."""
    for _ in range(1200):
        try:
            if http.get(url + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(exited)
        time.sleep(0.5)


def prompt(words: list[str], tokens: int, nonce: str) -> str:
    return f"Request {nonce}. Summarise this text in one sentence.\n\n" + " ".join(words[: int(tokens * WORDS_PER_TOKEN)])


def ask(http: httpx.Client, url: str, text: str, max_tokens: int) -> tuple[float, float, int | None]:
    """(seconds to the first content delta, to the end, prompt tokens) of one streamed chat."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, prompt_tokens = None, None
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            prompt_tokens = (event.get("usage") or {}).get("prompt_tokens", prompt_tokens)
            choices = event.get("choices") or []
            if first is None and choices and (choices[0].get("delta") or {}).get("content"):
                first = time.perf_counter() - t0
    return first, time.perf_counter() - t0, prompt_tokens


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="40,500,2000,4000", help="prompt sizes in tokens, about")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--target-quant", default="none", help="none (the file as shipped, Q4_K_M) or bf16, f16, q8_0")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("results/ttft"))
    p.add_argument("--servers", default="ls,plain,auto",
                   help="which of ls, plain, auto to start (ls, the base of every ratio, always)")
    args = p.parse_args()
    wanted = {"ls", *args.servers.split(",")}
    if not wanted <= {"ls", "plain", "auto"}:
        p.error(f"--servers: unknown {sorted(wanted - {'ls', 'plain', 'auto'})}")
    args.out.mkdir(parents=True, exist_ok=True)
    words = (ROOT / "README.md").read_text().split() * 4
    procs, urls = {}, {}
    try:
        for name, argv in servers(args).items():
            if name not in wanted:
                continue
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            procs[name] = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port)],
                                           stdout=subprocess.DEVNULL, stderr=open(args.out / f"{name}.log", "w"),
                                           start_new_session=True)
        with httpx.Client(timeout=1800) as http:
            for name, url in urls.items():
                wait_ready(http, url, procs[name], f"{name} exited: see {args.out / (name + '.log')}")
                ask(http, url, "Say hi.", 2)  # first-call allocations, not timed
            names = list(urls)
            rows = []
            for size in (int(s) for s in args.sizes.split(",")):
                times: dict[str, list] = {n: [] for n in names}
                for rep in range(args.reps):
                    turn = (rep + size) % len(names)
                    for name in names[turn:] + names[:turn]:
                        text = prompt(words, size, f"{size}-{rep}-{name}-{time.time_ns()}")
                        times[name].append(ask(http, urls[name], text, args.max_tokens))
                base = statistics.median(t[0] for t in times["ls"])
                base_tokens = times["ls"][0][2]
                for name in names:
                    first = [t[0] for t in times[name]]
                    row = {"size": size, "server": name, "prompt_tokens": times[name][0][2],
                           "ttft_median": statistics.median(first), "ttft": first,
                           "whole": [t[1] for t in times[name]], "vs_ls": statistics.median(first) / base}
                    # Our chat template adds Qwen's default system line, which llama-server's built-in
                    # chatml (no --jinja) leaves out: per prompt token, the same text costs what it costs.
                    row["vs_ls_per_token"] = row["vs_ls"] * base_tokens / row["prompt_tokens"]
                    rows.append(row)
                    print(f"~{size:>5} tokens {name:6s} ({row['prompt_tokens']} prompt tokens): TTFT median "
                          f"{row['ttft_median']:.2f} s, {row['vs_ls']:.2f}x ls ({row['vs_ls_per_token']:.2f}x per "
                          f"prompt token)  {['%.2f' % t for t in first]}", flush=True)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    write(args.out, "python -m benchmarks.ttft " + " ".join(sys.argv[1:]), rows)
    return 0


def write(out: Path, command: str, rows: list[dict]) -> None:
    """ttft.json and ttft.md under `out`."""
    (out / "ttft.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    table = ["| prompt | server | prompt tokens | TTFT median s | x llama-server | x per prompt token | each |",
             "|---|---|---|---|---|---|---|"]
    table += [f"| ~{r['size']} | {r['server']} | {r['prompt_tokens']} | {r['ttft_median']:.2f} | {r['vs_ls']:.2f} | "
              f"{r['vs_ls_per_token']:.2f} | {', '.join('%.2f' % t for t in r['ttft'])} |" for r in rows]
    note = ("`ls`: llama-server with its defaults, no draft; `plain`: `specsample serve --autoregressive`; `auto`: "
            "`specsample serve` (-k auto, the draft model). Our prompts carry the model's own chat template, whose "
            "default system line llama-server's built-in chatml leaves out; 'x per prompt token' divides that out.")
    (out / "ttft.md").write_text(f"# Time to first token\n\nCommand: `{command}`\n\n{note}\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""Two servers at once (auto, plain) on BF16, as benchmarks/ttft.py starts them; one ~N-token request each, in turn."""
import json, subprocess, sys, time, os, signal
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import httpx
import os
OUT = os.environ.get("TRACE_OUT", "/tmp/ttft-trace")
os.makedirs(OUT, exist_ok=True)
from benchmarks.ttft import prompt, ROOT
size, order = int(sys.argv[1]), sys.argv[2].split(",")
base = [sys.executable, "-m", "specsample", "serve", "--parallel", "1", "--ctx-size", "8192", "--threads", "2", "--target-quant", "bf16"]
argvs = {"auto": base, "plain": base + ["--autoregressive"]}
procs, urls = {}, {}
def ask(http, url, text, max_tokens):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter(); first = None; extra = None
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            e = json.loads(line[6:])
            if first is None and (e.get("choices") or [{}])[0].get("delta", {}).get("content"): first = time.perf_counter() - t0
            if "timings" in e: extra = e["timings"]
    return first, time.perf_counter() - t0, extra
if __name__ == '__main__':
    words = (ROOT     / "README.md").read_text().split() * 4
    try:
        for i, (name, argv) in enumerate(argvs.items()):
            urls[name] = f"http://127.0.0.1:{8710 + i}"
            procs[name] = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(8710 + i)] + (["--trace", f"{OUT}/p2-{name}.jsonl"] if name == "auto" else []),
                                           stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/p2-{name}.log", "w"), start_new_session=True)
        with httpx.Client(timeout=1800) as http:
            for name, url in urls.items():
                for _ in range(1200):
                    try:
                        if http.get(url + "/health").status_code == 200: break
                    except httpx.HTTPError: pass
                    time.sleep(0.5)
                print("warm", name, ask(http, url, "Say hi.", 2), flush=True)
            for name in order:
                text = prompt(words, size, f"{size}-{name}-{time.time_ns()}")
                print(name, size, ask(http, urls[name], text, 8), flush=True)
    finally:
        for p in procs.values(): os.killpg(p.pid, signal.SIGTERM); p.wait(30)

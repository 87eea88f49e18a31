"""Two servers at once (auto, plain) on BF16, as benchmarks/ttft.py starts them; one ~N-token request each, in turn."""
import json, subprocess, sys, time, os, signal
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import httpx
OUT = os.environ.get("TRACE_OUT", "/tmp/ttft-trace")
os.makedirs(OUT, exist_ok=True)
from benchmarks.ttft import prompt, ROOT, free_port, wait_ready
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
def start(argvs, log):
    """Each server of {name: argv} on a free port, its stderr to log(name) (a path, or None
    for none): (processes, urls)."""
    procs, urls = {}, {}
    for name, argv in argvs.items():
        port = free_port()
        urls[name] = f"http://127.0.0.1:{port}"
        err = open(log(name), "w") if log(name) else subprocess.DEVNULL
        procs[name] = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                                       stderr=err, start_new_session=True)
    return procs, urls


def warm(http, urls, procs):
    """Wait for each server's /health, then send it a first short request (not timed)."""
    for name, url in urls.items():
        wait_ready(http, url, procs[name], f"{name} exited")
        print("warm", name, ask(http, url, "Say hi.", 2)[:2], flush=True)


def stop(procs):
    for p in procs.values():
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


if __name__ == '__main__':
    size, order = int(sys.argv[1]), sys.argv[2].split(",")
    base = [sys.executable, "-m", "specsample", "serve", "--parallel", "1", "--ctx-size", "8192", "--threads", "2",
            "--target-quant", "bf16"]
    argvs = {"auto": base, "plain": base + ["--autoregressive"]}
    words = (ROOT / "README.md").read_text().split() * 4
    argvs["auto"] = argvs["auto"] + ["--trace", f"{OUT}/p2-auto.jsonl"]
    procs, urls = start(argvs, lambda name: f"{OUT}/p2-{name}.log")
    try:
        with httpx.Client(timeout=1800) as http:
            warm(http, urls, procs)
            for name in order:
                text = prompt(words, size, f"{size}-{name}-{time.time_ns()}")
                print(name, size, ask(http, urls[name], text, 8), flush=True)
    finally:
        stop(procs)

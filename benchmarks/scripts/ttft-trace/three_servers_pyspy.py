"""The three servers of benchmarks.ttft loaded at once; py-spy on each of ours during a ~N-token request."""
import argparse, subprocess, sys, time, os, signal
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import httpx
import os
OUT = os.environ.get("TRACE_OUT", "/tmp/ttft-trace")
os.makedirs(OUT, exist_ok=True)
from benchmarks.ttft import prompt, ROOT, servers, free_port
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from two_servers import ask  # noqa: E402
size, order, tag = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
a = argparse.Namespace(target_quant="bf16", threads=2, ctx=8192)
procs, urls = {}, {}
words = (ROOT / "README.md").read_text().split() * 4
try:
    for name, argv in servers(a).items():
        port = free_port(); urls[name] = f"http://127.0.0.1:{port}"
        procs[name] = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                                       stderr=open(f"{OUT}/p3-{name}.log", "w"), start_new_session=True)
    with httpx.Client(timeout=1800) as http:
        for name, url in urls.items():
            for _ in range(1200):
                try:
                    if http.get(url + "/health").status_code == 200: break
                except httpx.HTTPError: pass
                time.sleep(0.5)
            print("warm", name, ask(http, url, "Say hi.", 2), flush=True)
        for name in order:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(procs[name].pid), "-r", "3", "--native", "--threads", "-f", "raw",
                                    "-o", f"{OUT}/p3-{tag}-{name}.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            text = prompt(words, size, f"{size}-{name}-{time.time_ns()}")
            print(name, size, ask(http, urls[name], text, 8), flush=True)
            spy.send_signal(signal.SIGINT); spy.wait(30)
        print(open("/proc/meminfo").read()[:400])
        for name, p in procs.items():
            print(name, open(f"/proc/{p.pid}/status").read().split("VmRSS")[1][:30].strip(),
                  [l for l in open(f"/proc/{p.pid}/smaps_rollup").read().splitlines() if "AnonHuge" in l or "Rss" in l])
finally:
    for p in procs.values(): os.killpg(p.pid, signal.SIGTERM); p.wait(30)

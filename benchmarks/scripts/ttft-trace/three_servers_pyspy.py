"""The three servers of benchmarks.ttft loaded at once; py-spy on each of ours during a ~N-token request."""
import argparse, subprocess, sys, time, os, signal
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import httpx
OUT = os.environ.get("TRACE_OUT", "/tmp/ttft-trace")
os.makedirs(OUT, exist_ok=True)
from benchmarks.ttft import prompt, ROOT, servers
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from two_servers import ask, start, stop, warm  # noqa: E402
size, order, tag = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
a = argparse.Namespace(target_quant="bf16", threads=2, ctx=8192)
words = (ROOT / "README.md").read_text().split() * 4
procs, urls = start(servers(a), lambda name: f"{OUT}/p3-{name}.log")
try:
    with httpx.Client(timeout=1800) as http:
        warm(http, urls, procs)
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
    stop(procs)

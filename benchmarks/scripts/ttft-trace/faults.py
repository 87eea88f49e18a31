"""Three servers as benchmarks.ttft starts them; one ~N-token request to each named, with the
server's page faults and CPU time over it and the machine's major faults and file refaults.

    python benchmarks/scripts/ttft-trace/faults.py 4000 plain,auto none   # none: the Q4_K_M file as shipped
"""
import argparse, sys, time
_here = __import__("pathlib").Path(__file__).resolve()
sys.path.insert(0, str(_here.parents[3])); sys.path.insert(0, str(_here.parent))
import httpx
from benchmarks.ttft import prompt, ROOT, servers
from two_servers import ask, start, stop, warm
def faults(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[7]), int(f[9]), int(f[11]) + int(f[12])  # minflt, majflt, cpu ticks
def machine_faults():
    return [int(l.split()[1]) for l in open("/proc/vmstat") if l.startswith(("pgmajfault ", "workingset_refault_file "))]
size, order = int(sys.argv[1]), sys.argv[2].split(",")
a = argparse.Namespace(target_quant=sys.argv[3], threads=2, ctx=8192)
words = (ROOT / "README.md").read_text().split() * 4
procs, urls = start(servers(a), lambda name: None)
try:
    with httpx.Client(timeout=1800) as http:
        warm(http, urls, procs)
        for name in order:
            pid = procs[name].pid
            v0, b = machine_faults(), faults(pid)
            r = ask(http, urls[name], prompt(words, size, f"{size}-{name}-{time.time_ns()}"), 8)
            e = faults(pid)
            v1 = machine_faults()
            print(name, size, "ttft %.1f" % r[0], "minflt", e[0]-b[0], "majflt", e[1]-b[1], "cpu s %.1f" % ((e[2]-b[2])/100),
                  "sys majflt,refault", [y - x for x, y in zip(v0, v1)], flush=True)
finally:
    stop(procs)

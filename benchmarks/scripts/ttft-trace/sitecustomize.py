import os, sys, time, threading
OUT = os.environ.get("TRACE_OUT", "/tmp/ttft-trace")
os.makedirs(OUT, exist_ok=True)
if "serve" in sys.argv or any("specsample" in a for a in sys.argv):
    try:
        from specsample.backends import cpushare
        _orig = cpushare.CpuShare.threads
        _f = open(f"{OUT}/share-{os.getpid()}.log", "a", buffering=1)
        _f.write(" ".join(sys.argv) + "\n")
        def threads(self, wanted):
            n = _orig(self, wanted)
            _f.write(f"{time.monotonic():.3f} {wanted} {n} others={self.others:.2f} own={self.own:.2f}\n")
            return n
        cpushare.CpuShare.threads = threads
    except Exception as e:
        print("sitecustomize:", e, file=sys.stderr)

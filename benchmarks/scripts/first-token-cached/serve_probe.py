"""The same question through `specsample serve`: a turn that reuses a cached start after a
side request (the host prompt cache restores the start, the draft's copy with it), plain
against -k auto, one server at a time. Prints each turn's time to its first streamed text."""
import inspect, json, statistics, sys, time
import httpx
from benchmarks.servers import ServerProcess

base = "Read this module, then answer.\n\n" + inspect.getsource(statistics)[:2400]
for name, extra in (("plain", ["--autoregressive"]), ("auto", []), ("plain2", ["--autoregressive"]), ("auto2", [])):
    with ServerProcess(lambda port, tmp: [sys.executable, "-m", "specsample", "serve", "--threads", "2",
                                          "--parallel", "1", "--host", "127.0.0.1", "--port", str(port), *extra],
                       name) as server:
        url = server.url
        model = server.request("/v1/models")["data"][0]["id"]
        post = lambda body: httpx.post(url + "/v1/completions", json={"model": model, "temperature": 0, **body}, timeout=300)
        post({"prompt": base, "max_tokens": 1})  # the shared start, prefilled once
        times = []
        for i in range(5):
            post({"prompt": f"Say hello {i}.", "max_tokens": 2})  # a side request takes the slot
            t0 = time.perf_counter(); first = None
            body = {"model": model, "temperature": 0, "prompt": base + f"\n\nQuestion {i}: what does function {i + 3} return?",
                    "max_tokens": 3, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and first is None and json.loads(line[6:])["choices"][0]["text"]:
                        first = time.perf_counter() - t0
            times.append(first)
        print(name, " ".join("%.3f" % t for t in times), "median %.3f" % statistics.median(times), flush=True)

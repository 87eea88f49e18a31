"""A mixed soak of a real `specsample serve`, with hostile sockets interleaved (issue 55).

    python benchmarks/soak.py --minutes 15 --out docs/results/soak

Starts `specsample serve --parallel 4 --api-key K` on a free 127.0.0.1 port (the
default pair unless --serve-args says otherwise) and, for --minutes:

- two clients send valid requests in turn (chat, streamed chat, completions with
  logprobs, a JSON-schema answer, n=2) and check each answer: status 200, a finish
  reason, usage that adds up, a stream that ends in [DONE], JSON that holds to its schema;
- a prober asks /health every quarter second and times it;
- every few seconds one attack from issue 55 runs beside them: an answered request
  whose body keeps trickling, headers that never finish, a stream never read, a
  stream dropped mid-way, 2,049 messages, a lone surrogate, an erase under another
  salt, control bytes in a schema's format, malformed JSON, no key; each has the
  answer it must get;
- the server's RSS is read every 30 s.

It prints and writes (soak.json, soak.md under --out): valid requests answered and
lost, /health p50/p99/max and its non-200s, each attack's count and how many got
what they must, and RSS over time. It sends to 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, port: int, pid: int, seconds: float):
        self.base, self.port, self.pid = f"http://127.0.0.1:{port}", port, pid
        self.end = time.monotonic() + seconds
        self.valid: dict[str, list[int]] = {}  # kind -> [answered, lost]
        self.failures: list[str] = []
        self.health: list[float] = []
        self.health_bad: list[str] = []
        self.attacks: dict[str, list[int]] = {}  # name -> [runs, as expected]
        self.attack_failures: list[str] = []
        self.rss: list[tuple[float, int]] = []

    @property
    def going(self) -> bool:
        return time.monotonic() < self.end

    # Valid clients ---------------------------------------------------------
    async def client(self, n: int) -> None:
        kinds = [self.chat, self.stream, self.completion, self.schema, self.n_two]
        async with httpx.AsyncClient(base_url=self.base, headers=AUTH, timeout=300) as http:
            i = n
            while self.going:
                check = kinds[i % len(kinds)]
                i += 1
                tally = self.valid.setdefault(check.__name__, [0, 0])
                try:
                    await check(http, i)
                    tally[0] += 1
                except Exception as e:  # noqa: BLE001 - every way a valid request can fail is a loss
                    tally[1] += 1
                    self.failures.append(f"{check.__name__}: {type(e).__name__}: {e}"[:300])

    async def chat(self, http, i) -> None:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": f"Name {i % 7 + 2} colours."}], "max_tokens": 16})
        body = _ok(r)
        _answer(body["choices"][0], body["usage"])

    async def stream(self, http, i) -> None:
        done, text, usage, finish = False, "", None, None
        async with http.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Count to {i % 5 + 3}."}], "max_tokens": 24, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            if r.status_code != 200:
                raise AssertionError(f"status {r.status_code}")
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise AssertionError(f"error event {event['error']}")
                    usage = event.get("usage") or usage
                    for c in event.get("choices", []):
                        text += (c.get("delta") or {}).get("content") or ""
                        finish = c.get("finish_reason") or finish
        if not (done and finish and usage and usage["completion_tokens"] >= 1 and
                usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]):
            raise AssertionError(f"stream incomplete: done={done} finish={finish} usage={usage}")

    async def completion(self, http, i) -> None:
        r = await http.post("/v1/completions", json={"prompt": f"def f{i}(x):\n    return", "max_tokens": 12,
                                                     "logprobs": 2})
        body = _ok(r)
        choice = body["choices"][0]
        _answer(choice, body["usage"])
        if len(choice["logprobs"]["tokens"]) != body["usage"]["completion_tokens"]:
            raise AssertionError("one log-probability per token")

    async def schema(self, http, i) -> None:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Invent a person."}], "max_tokens": 48,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}})
        body = _ok(r)
        choice = body["choices"][0]
        _answer(choice, body["usage"])
        if choice["finish_reason"] == "stop":
            value = json.loads(choice["message"]["content"])
            if not (isinstance(value.get("name"), str) and isinstance(value.get("age"), int)):
                raise AssertionError(f"answer breaks its schema: {value}")

    async def n_two(self, http, i) -> None:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "n": 2, "temperature": 0.8})
        body = _ok(r)
        if sorted(c["index"] for c in body["choices"]) != [0, 1]:
            raise AssertionError("two choices")
        for c in body["choices"]:
            if not c["finish_reason"]:
                raise AssertionError("no finish reason")

    # The prober, and RSS --------------------------------------------------
    async def prober(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            while self.going:
                t0 = time.perf_counter()
                try:
                    r = await http.get("/health")
                    self.health.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        self.health_bad.append(f"{r.status_code} at {self.elapsed():.0f} s")
                except httpx.HTTPError as e:
                    self.health.append(time.perf_counter() - t0)
                    self.health_bad.append(f"{type(e).__name__} at {self.elapsed():.0f} s")
                await asyncio.sleep(0.25)

    async def memory(self) -> None:
        start = time.monotonic()
        while self.going:
            self.rss.append((time.monotonic() - start, _rss_kb(self.pid)))
            await asyncio.sleep(30)
        self.rss.append((time.monotonic() - start, _rss_kb(self.pid)))

    def elapsed(self) -> float:
        return time.monotonic() - (self.end - ARGS.minutes * 60)

    # Attacks --------------------------------------------------------------
    async def attacker(self) -> None:
        attacks = [self.trickling_body, self.endless_headers, self.unread_stream, self.dropped_stream,
                   self.many_messages, self.surrogate, self.salted_erase, self.control_bytes, self.bad_json,
                   self.no_key]
        rng = random.Random(0)
        tasks = set()
        while self.going:
            attack = rng.choice(attacks)
            task = asyncio.create_task(self.run_attack(attack))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.uniform(2, 5))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run_attack(self, attack) -> None:
        tally = self.attacks.setdefault(attack.__name__, [0, 0])
        tally[0] += 1
        try:
            await attack()
            tally[1] += 1
        except Exception as e:  # noqa: BLE001 - an attack that got another answer than it must
            self.attack_failures.append(f"{attack.__name__}: {type(e).__name__}: {e}"[:300])

    async def _raw(self, data: bytes):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(data)
        await writer.drain()
        return reader, writer

    async def trickling_body(self) -> None:
        """Item 1: answered, its declared body never sent, a byte every half second:
        the server must close it within its keep-alive timeout (5 s) plus slack."""
        reader, writer = await self._raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nx")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        closed_at = await _trickle_until_closed(reader, writer, 20)
        if closed_at is None:
            raise AssertionError("still open after 20 s")

    async def endless_headers(self) -> None:
        """Headers that never end: closed by the header deadline (10 s by default)."""
        reader, writer = await self._raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        if await _trickle_until_closed(reader, writer, 25, b"X-A: b\r\n") is None:
            raise AssertionError("still open after 25 s")

    async def unread_stream(self) -> None:
        """Item 2: a stream asked for and never read; the server drops it after its send
        timeout, and the place is freed (the prober sees 503s if it is not)."""
        body = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 256,
                           "n": 2, "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
        reader, writer = await self._raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                         b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                                         b"Content-Type: application/json\r\nContent-Length: "
                                         + str(len(body)).encode() + b"\r\n\r\n" + body)
        await asyncio.sleep(30)  # never read
        writer.close()

    async def dropped_stream(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, headers=AUTH, timeout=300) as http:
            async with http.stream("POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 200,
                    "stream": True}) as r:
                if r.status_code != 200:
                    raise AssertionError(f"status {r.status_code}")
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 3:
                        break  # the client leaves mid-way

    async def many_messages(self) -> None:
        await self._expect(400, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}] * 2049,
                                                          "max_tokens": 1})

    async def surrogate(self) -> None:
        await self._expect(400, "/v1/completions", content=b'{"prompt":"a\\ud800b","max_tokens":1}')

    async def salted_erase(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, headers=AUTH, timeout=60) as http:
            r = await http.post("/slots/0?action=erase", json={"cache_salt": "someone-else"})
        if r.status_code == 409:
            return  # the slot was generating: its contents were never in question
        if r.status_code != 200 or r.json().get("n_erased") != 0:
            raise AssertionError(f"{r.status_code} {r.text[:200]}")

    async def control_bytes(self) -> None:
        schema = {"type": "string", "format": "\x1b[31mevil\x7f"}
        async with httpx.AsyncClient(base_url=self.base, headers=AUTH, timeout=300) as http:
            r = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Say a word."}], "max_tokens": 4,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
        for name, value in r.headers.items():
            if any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise AssertionError(f"control bytes in {name}")
        if r.status_code not in (200, 400):
            raise AssertionError(f"status {r.status_code}")

    async def bad_json(self) -> None:
        await self._expect(400, "/v1/chat/completions", content=b'{"messages": [')

    async def no_key(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=60) as http:
            r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        if r.status_code != 401:
            raise AssertionError(f"status {r.status_code}")

    async def _expect(self, status: int, path: str, json_body=None, content: bytes | None = None) -> None:
        async with httpx.AsyncClient(base_url=self.base, headers=AUTH, timeout=120) as http:
            if content is not None:
                r = await http.post(path, content=content, headers={"Content-Type": "application/json"})
            else:
                r = await http.post(path, json=json_body)
        if r.status_code != status:
            raise AssertionError(f"status {r.status_code}, not {status}: {r.text[:200]}")

    # The report -----------------------------------------------------------
    def report(self) -> dict:
        answered = sum(a for a, _ in self.valid.values())
        lost = sum(b for _, b in self.valid.values())
        health = sorted(self.health)
        rss = [kb for _, kb in self.rss]
        return {
            "minutes": ARGS.minutes,
            "valid": {"answered": answered, "lost": lost, "by_kind": self.valid, "failures": self.failures[:20]},
            "health": {"probes": len(health), "p50_ms": 1000 * statistics.median(health),
                       "p99_ms": 1000 * health[int(0.99 * (len(health) - 1))], "max_ms": 1000 * health[-1],
                       "not_200": self.health_bad[:50], "not_200_count": len(self.health_bad)},
            "attacks": {name: {"runs": r, "as_expected": ok} for name, (r, ok) in sorted(self.attacks.items())},
            "attack_failures": self.attack_failures[:20],
            "rss_mb": {"first": rss[0] / 1024, "after_first_minute": rss[min(2, len(rss) - 1)] / 1024,
                       "last": rss[-1] / 1024, "max": max(rss) / 1024, "samples": [(round(t), kb // 1024) for t, kb in self.rss]},
        }


async def _trickle_until_closed(reader, writer, limit: float, piece: bytes = b"y") -> float | None:
    """Send `piece` every half second until the server closes (seconds) or `limit` passes (None)."""
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            try:
                if await asyncio.wait_for(reader.read(4096), 0.5) == b"":
                    return time.monotonic() - start
            except asyncio.TimeoutError:
                pass
            writer.write(piece)
            await writer.drain()
    except (ConnectionError, OSError):
        return time.monotonic() - start
    finally:
        writer.close()
    return None


def _ok(r) -> dict:
    if r.status_code != 200:
        raise AssertionError(f"status {r.status_code}: {r.text[:200]}")
    return r.json()


def _answer(choice: dict, usage: dict) -> None:
    if not choice.get("finish_reason"):
        raise AssertionError("no finish reason")
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"] or usage["completion_tokens"] < 1:
        raise AssertionError(f"usage does not add up: {usage}")


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def markdown(report: dict, command: str) -> str:
    v, h, m = report["valid"], report["health"], report["rss_mb"]
    lines = [f"# Soak: {report['minutes']} minutes", "", f"Command: `{command}`", "",
             f"- Valid requests: {v['answered']} answered, {v['lost']} lost "
             f"({', '.join(f'{k} {a}/{a + b}' for k, (a, b) in v['by_kind'].items())}).",
             f"- /health: {h['probes']} probes, p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms, max "
             f"{h['max_ms']:.1f} ms; {h['not_200_count']} not 200.",
             f"- RSS: {m['after_first_minute']:.0f} MB after the first minute, {m['last']:.0f} MB at the end, "
             f"{m['max']:.0f} MB at most.", "", "| attack | runs | got what it must |", "|---|---|---|"]
    lines += [f"| {name} | {a['runs']} | {a['as_expected']} |" for name, a in report["attacks"].items()]
    for title, items in (("Lost requests", v["failures"]), ("Attacks answered otherwise", report["attack_failures"]),
                         ("/health not 200", h["not_200"])):
        if items:
            lines += ["", f"{title}:", *[f"- {x}" for x in items]]
    return "\n".join(lines) + "\n"


async def main() -> int:
    port = free_port()
    argv = [sys.executable, "-m", "specsample", "serve", "--parallel", "4", "--api-key", KEY, "--port", str(port),
            *ARGS.serve_args.split()]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(ARGS.out / "serve.log", "w"),
                              start_new_session=True)
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            for _ in range(600):
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None:
                    raise SystemExit(f"serve exited: see {ARGS.out / 'serve.log'}")
                await asyncio.sleep(0.5)
        soak = Soak(port, server.pid, ARGS.minutes * 60)
        await asyncio.gather(soak.client(0), soak.client(1), soak.prober(), soak.memory(), soak.attacker())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    report = soak.report()
    command = "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    (ARGS.out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report, command)
    (ARGS.out / "soak.md").write_text(text)
    print(text)
    ok = report["valid"]["lost"] == 0 and report["health"]["p99_ms"] < 50 and not report["attack_failures"]
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--out", type=Path, default=Path("results/soak"))
    parser.add_argument("--serve-args", default="", help="more `specsample serve` arguments, e.g. '--draft ngram'")
    ARGS = parser.parse_args()
    ARGS.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main()))

"""Servers the research bench starts as processes of their own: llama-server
(native.py) and `specsample serve` (serving.py), each on a free loopback port, logging
to a temporary file. A server is stopped when the bench ends, fails or is interrupted,
even while it starts, and dies with the bench process (specsample.processes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from specsample.processes import dies_with_parent


class ServerUnavailable(RuntimeError):
    """A server could not start; the message is the one-line reason."""


class ServerProcess:
    """`command(port, tmp_dir)` run until /health answers 200."""

    def __init__(self, command: Callable[[int, str], list[str]], name: str, ready_timeout: float = 300.0,
                 parallel: int = 1):
        self.name, self.parallel = name, parallel
        self._tmp = tempfile.TemporaryDirectory(prefix="specsample-server-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(self._tmp.name) / "server.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(command(self.port, self._tmp.name), stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=dies_with_parent())
        try:
            self._wait_ready(ready_timeout)
        except BaseException:  # it crashed, hung, or Ctrl-C / SIGTERM came while it loaded
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                last = self.log_path.read_text().strip().splitlines()[-1:] or ["no output"]
                raise ServerUnavailable(f"{self.name} exited: {last[0]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise ServerUnavailable(f"{self.name} did not come up within {timeout:.0f} s")

    def request(self, route: str, body: dict | None = None) -> dict:
        """GET route, or POST body to it."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{route}", data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as r:
            return json.loads(r.read())

    def text(self, route: str) -> str:
        """GET route, as text (/metrics)."""
        with urllib.request.urlopen(f"{self.url}{route}", timeout=60) as r:
            return r.read().decode()

    def reset(self, prompts: list[list[int]]) -> None:
        """Before a load of these prompts, forget whatever earlier requests left that
        could serve them for free: every slot of `specsample serve` is erased (its
        cache_prompt, on by default, would find the same prompts again under the
        other setting and every client count; llama-server's own: native.LlamaServer)."""
        for slot in range(self.parallel):
            self.request(f"/slots/{slot}?action=erase", {})

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self._log.closed:
            self._log.close()
        self._tell_failures()
        self._tmp.cleanup()

    def _tell_failures(self) -> None:
        """Every traceback the server logged, on the bench's stderr before its log goes:
        a request answered 500 says only the error's type."""
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
        if starts:
            print(f"benchmarks: {self.name} logged {len(starts)} traceback(s); the last:", file=sys.stderr)
            print("\n".join(lines[max(0, starts[-1] - 1):][:80]), file=sys.stderr, flush=True)  # with the line it follows

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""The processes a benchmark starts: llama-server (benchmarks/llama_server.py) is built once and appears only when
whole; servers and workers end when the bench ends, however it ends; every command
has a time limit."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import specsample
from benchmarks import llama_server as native
from benchmarks.studies import contention
from benchmarks.servers import ServerProcess

pytestmark = pytest.mark.system

SRC = str(Path(specsample.__file__).parents[1])


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """ensure_server with pip and cmake replaced: the build takes 0.3 s and writes a binary."""
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(native, "_vendored_source", lambda tmp, log: tmp / "source")
    builds = []

    def run(cmd, timeout=None):
        if "--build" in cmd:
            builds.append(cmd)
            time.sleep(0.3)
            binary = Path(cmd[cmd.index("--build") + 1]) / "bin" / "llama-server"
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_bytes(b"\x7fELF" + b"x" * 1000)

    monkeypatch.setattr(native, "_run", run)
    return builds


def test_two_benches_at_once_build_llama_server_once(fake_build):
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(native.ensure_server(log=lambda msg: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(fake_build) == 1
    assert paths == [native.server_path()] * 2 and native.server_path().stat().st_size == 1004


def test_a_copy_that_fails_midway_leaves_no_binary(fake_build, monkeypatch):
    def copy_half(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:500])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(native.shutil, "copy2", copy_half)
    with pytest.raises(OSError, match="No space left"):
        native.ensure_server(log=lambda msg: None)
    assert not native.server_path().exists()  # a later bench must not run half a binary


def test_a_server_interrupted_while_it_starts_is_stopped(monkeypatch):
    started = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    def interrupted(self, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", recording)
    monkeypatch.setattr(ServerProcess, "_wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ServerProcess(lambda port, tmp: [sys.executable, "-c", "import time; time.sleep(60)"], name="slow")
    assert started[0].wait(timeout=15) is not None


HEALTHY = textwrap.dedent("""
    import http.server, sys
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
""")


def child_gone(pid: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):  # exited; its new parent has not reaped it yet
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def kill_if_running(pid: int) -> None:
    """Cleanup for a test that failed: the server it started must not outlive it."""
    if not child_gone(pid, within=0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_parent(script: str) -> tuple[subprocess.Popen, int, str]:
    """A Python process running script, which prints the pid of the server it started
    and that server's log folder; returns the process, the pid and the folder."""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC})
    pid, folder = parent.stdout.readline().split()
    return parent, int(pid), folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_dies_with_the_bench_however_the_bench_dies():
    script = textwrap.dedent(f"""
        import sys, time
        from benchmarks.servers import ServerProcess
        server = ServerProcess(lambda port, tmp: [sys.executable, "-c", {HEALTHY!r}, str(port)], name="child")
        print(server.process.pid, server.log_path.parent, flush=True)
        time.sleep(60)
    """)
    parent, pid, _ = start_parent(script)
    try:
        parent.send_signal(signal.SIGKILL)  # no cleanup can run
        parent.wait(timeout=15)
        assert child_gone(pid)
    finally:
        kill_if_running(pid)


def test_sigterm_to_the_command_line_runs_its_cleanup():
    """`kill` on a running `specsample bench`: the servers it started are closed and
    their files removed, as on Ctrl-C, and the exit status says SIGTERM."""
    script = textwrap.dedent(f"""
        import sys, time
        from specsample import cli
        from benchmarks.servers import ServerProcess

        def fetch_default(spec):  # stands in for a long bench run
            with ServerProcess(lambda port, tmp: [sys.executable, "-c", {HEALTHY!r}, str(port)], name="s") as server:
                print(server.process.pid, server.log_path.parent, flush=True)
                time.sleep(60)

        cli.fetch_default = fetch_default
        sys.exit(cli.main(["fetch", "qwen2.5-coder-0.5b"]))
    """)
    parent, pid, folder = start_parent(script)
    try:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 128 + signal.SIGTERM
        assert child_gone(pid) and not Path(folder).exists()
    finally:
        kill_if_running(pid)


def test_a_command_past_its_time_limit_is_killed_with_what_it_started():
    from specsample import processes

    grandchild = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        processes.run([sys.executable, "-c", grandchild], timeout=2)
    assert time.monotonic() - start < 10
    assert child_gone(int(e.value.output.split()[0]))


def test_pip_or_cmake_past_its_time_limit_is_a_one_line_reason():
    with pytest.raises(native.NativeUnavailable, match="sleep did not finish within 1 s"):
        native._run(["sleep", "30"], timeout=1)


def test_contention_workers_that_hang_are_killed_at_the_time_limit():
    hung = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within 1 s"):
        contention._run_workers(2, hung, None, timeout=1)
    assert time.monotonic() - start < 10

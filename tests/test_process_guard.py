"""A pytest run stopped by SIGTERM or Ctrl-C (SIGINT) leaves no process behind
(tests/process_guard.py): a run whose fixture started a server-like child in a
session of its own is stopped mid-test, and within 10 s neither pytest nor the child
is left."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.system

TESTS = Path(__file__).parent

INNER = textwrap.dedent('''
    import subprocess, sys, time
    import pytest

    pytest_plugins = ["process_guard"]

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        yield child
        child.terminate()  # what a fixture does; a stopped run may never get here

    def test_runs_long(server):
        with open(PIDFILE, "w") as f:
            f.write(str(server.pid))
        time.sleep(300)
''')


def wait_for(path: Path, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_stopped_run_leaves_nothing_behind(tmp_path, how, workers):
    pidfile = tmp_path / "child.pid"
    (tmp_path / "test_inner.py").write_text(f"PIDFILE = {str(pidfile)!r}\n" + INNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    # Outside this checkout no pyproject.toml turns langsmith's plugin off (1.4 s a process).
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
            "--rootdir", str(tmp_path),
            str(tmp_path / "test_inner.py")] + (["-n", str(workers)] if workers else [])
    # SIGINT as a terminal gives it: a shell ignores it in the jobs it starts in the
    # background (make test &, CI runners), and Python then never raises KeyboardInterrupt.
    run = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        child = int(wait_for(pidfile, 60))
        run.send_signal(how)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (run.poll() is not None and gone(child)):
            time.sleep(0.1)
        assert run.poll() is not None, "pytest still running 10 s after the signal"
        assert gone(child), "the fixture's child outlived the run"
    finally:
        if run.poll() is None:
            run.kill()


def test_ending_a_group_ends_what_its_leader_started_even_once_orphaned():
    """A server's own children are in its group: ended with it, even one whose parent
    is already gone (without pytest as its subreaper, no descendant of pytest's)."""
    from process_guard import end_group, popen

    script = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
              "print(p.pid, flush=True)")  # the leader exits at once, orphaning its child
    leader = popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    orphan = int(leader.stdout.readline())
    leader.wait(30)
    assert not gone(orphan)
    end_group(leader)
    deadline = time.monotonic() + 10
    while not gone(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(orphan)

"""Nothing a test run starts outlives it.

Servers, RPC workers and llama-server are started by fixtures that end them when
their tests end; this plugin is the net under them. SIGTERM becomes KeyboardInterrupt,
so a terminated run unwinds like a Ctrl-C one (fixtures' teardowns run, then the
session's end); and when the session ends, however it ends short of SIGKILL, every
process still descending from pytest is ended: asked to terminate, then killed after
GRACE seconds. With pytest-xdist the controller's session ends last and its workers
and everything they started are its descendants.
"""

from __future__ import annotations

import signal
import threading

import psutil

GRACE = 3.0


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def end(processes: list[psutil.Process], grace: float = GRACE) -> None:
    """Terminate, wait up to `grace` seconds, kill what is left."""
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_sessionfinish(session, exitstatus):
    end(descendants())


def pytest_unconfigure(config):
    # A run interrupted before its session ended (during collection, say) ends here.
    end(descendants())

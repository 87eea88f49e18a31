"""Nothing a test run starts outlives it.

Servers, RPC workers and llama-server are started by fixtures that end them when
their tests end; this plugin is the net under them. SIGTERM becomes KeyboardInterrupt,
so a terminated run unwinds like a Ctrl-C one (fixtures' teardowns run, then the
session's end); and when the session ends, however it ends short of SIGKILL, every
process still descending from pytest is ended: asked to terminate, then killed after
GRACE seconds. With pytest-xdist the controller's session ends last and its workers
and everything they started are its descendants.

A test that starts a process itself does so through `popen`: the process leads a
process group of its own, which `end_group` ends whole (a server and whatever it
started, even one whose parent has died and that is no longer anyone's descendant),
and which the session's end ends too if the test could not.
"""

from __future__ import annotations

import os
import signal
import subprocess
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


_groups: set[int] = set()  # process groups that tests started in this process


def popen(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen, leading a process group of its own that the run ends."""
    process = subprocess.Popen(args, start_new_session=True, **kwargs)
    _groups.add(process.pid)
    return process


def end_group(process: subprocess.Popen, grace: float = GRACE) -> None:
    """`process` and everything in its group: terminated, then killed after `grace` s."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(process.pid, signal.SIGKILL)  # what ignored SIGTERM, and children left in the group
    process.wait()
    _groups.discard(process.pid)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _end_groups() -> None:
    for pgid in list(_groups):
        _signal_group(pgid, signal.SIGKILL)
        _groups.discard(pgid)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _become_subreaper() -> None:
    """Orphans below this process are re-parented to it, not to init (Linux's
    PR_SET_CHILD_SUBREAPER), so they stay its descendants for the session's sweep: an
    xdist worker killed outright, or a server whose own parent died, leaves nothing
    that the sweep cannot see."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux: the sweep still sees every descendant whose parent lives


def pytest_configure(config):
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    if not hasattr(config, "workerinput"):  # the run's own process, not an xdist worker
        _become_subreaper()


def pytest_sessionfinish(session, exitstatus):
    end(descendants())
    _end_groups()


def pytest_unconfigure(config):
    # A run interrupted before its session ended (during collection, say) ends here.
    end(descendants())
    _end_groups()

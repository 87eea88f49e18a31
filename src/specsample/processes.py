"""Child processes that neither hang nor outlive us.

A command we run for the user (pip, cmake) gets a time limit, after which its whole
process group is killed: cmake's compilers are its grandchildren. A child meant to
live beside us (a benchmark's server or worker) asks the kernel to kill it when we
die, however we die: Ctrl-C and SIGTERM run our own cleanup first (cli.py turns
SIGTERM into SystemExit), but nothing runs after SIGKILL or a crash.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`cmd` with its output captured as text; subprocess.TimeoutExpired once it runs
    past `timeout` seconds, after killing it and everything it started."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as e:  # the timeout, or Ctrl-C while waiting
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            e.output, e.stderr = out, err
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def dies_with_parent():
    """A preexec_fn that has the kernel send the child SIGTERM when the thread that
    started it ends: start children meant to live as long as this process from its
    main thread. Linux only; elsewhere the parent's own cleanup is all there is."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    # Looked up here: a forked child of a threaded process should not load libraries.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nobody would signal us
            os._exit(1)

    return preexec

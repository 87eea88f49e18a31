"""A busy neighbour: processes that keep a core busy beside a benchmark, as a user's
other programs would (an editor, a browser, a build), so that what adapts to timings
is measured where it has to adapt (bench --neighbour N)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

from specsample.processes import dies_with_parent

SPIN = "while True: pass"


@contextlib.contextmanager
def busy_neighbours(count: int):
    """`count` processes, each spinning one core, for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=dies_with_parent(), start_new_session=True)
             for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

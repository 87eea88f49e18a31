"""Threads for a machine shared with other processes.

llama.cpp (and torch) run each call on an OpenMP team whose threads spin at every
barrier. When another process holds some of the cores, one of our threads gets
descheduled and its partners spin away the time it needs: on 2 cores, two model
processes each running 2 threads made every call several times slower. Waiting
passively instead (OMP_WAIT_POLICY=PASSIVE) keeps a pair fair but makes a lone
llama.cpp process much slower (docs/benchmarks.md, "Two processes at once", has the
figures and the command).

So we ask how many cores the others use and run on what is left: a lone process
keeps all its threads, and two processes settle at one thread each on two cores,
where no thread waits for a descheduled partner. The others' share comes from
/proc: busy time of all cores less this process's own, over the last quarter
second. Elsewhere than Linux, the configured threads are used as they are, and
SPECSAMPLE_SHARE_CORES=0 turns this off (as benchmarks/studies/contention.py does to compare).
"""

from __future__ import annotations

import os
import threading
import time

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
OLD_WINDOW = 4  # a window longer than this many intervals is too old to go by...
IDLE = 0.5  # ...if this process used less than this many cores' worth in it
# How long the first call after an idle spell watches the others' running threads, at
# most: an OpenMP team that has just finished spins on for libgomp's 300,000 turns
# (milliseconds here) before it sleeps, and one that computes stays.
SETTLE, SETTLE_STEP = 0.03, 0.005


def read_proc(helpers: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """(busy ticks of the cores this process may run on, ticks used by this process
    and its `helpers`), or None off Linux. Helpers are processes that work only while
    this one waits for them (local RPC workers holding a target's layers): their
    time is this process's own work, not a competitor's. A helper that is gone counts
    nothing."""
    try:
        with open("/proc/stat") as f:
            busy = busy_ticks(f.read(), _affinity())
        own = _process_ticks("self")
    except (OSError, ValueError, IndexError):
        return None
    for pid in helpers:
        try:
            own += _process_ticks(str(pid))
        except (OSError, ValueError, IndexError):
            pass
    return busy, own


def running_others() -> int | None:
    """Threads of other processes running at this instant: /proc/stat's procs_running
    (every runnable thread on the machine) less this process's own (the caller's
    among them), or None off Linux. A snapshot, not a window: what a call about to
    start competes with."""
    try:
        with open("/proc/stat") as f:
            running = next(int(line.split()[1]) for line in f if line.startswith("procs_running "))
        own = 0
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/stat") as f:
                    own += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:  # a thread that ended meanwhile
                pass
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return max(0, running - own)


def _process_ticks(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    return int(fields[11]) + int(fields[12])  # utime + stime


def busy_ticks(stat: str, cores: set[int]) -> int:
    """Ticks the given cores spent running processes, from /proc/stat's text: user,
    nice, system, irq and softirq. Not idle or iowait, and not steal: time the
    hypervisor gave this virtual core's physical one to another machine is no process
    here, and counted as one it costs a thread for the next interval after every
    burst (a short burst on a virtual machine reads as most of a core in use), which
    slows decoding beside a peer on the same cores; left out, the two decode alike."""
    names = {f"cpu{c}" for c in cores}
    busy = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name in names:
            user, nice, system, idle, iowait, irq, softirq = (int(x) for x in fields[:7])
            busy += user + nice + system + irq + softirq
    return busy


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def available_cores() -> int:
    return len(_affinity())


class CpuShare:
    """Cores the other processes on this machine are using, re-read every `interval`."""

    def __init__(self, interval: float = 0.25, read=read_proc, clock=time.monotonic, cores: int | None = None,
                 enabled: bool = True, running=running_others, sleep=time.sleep):
        self.interval = interval
        self.helpers: frozenset[int] = frozenset()  # processes whose time is ours (read_proc)
        self.enabled = enabled
        self.cores = cores or available_cores()
        self._read, self._clock, self._running, self._sleep = read, clock, running, sleep
        self._last: tuple[float, int, int] | None = None
        self._lock = threading.Lock()
        self._watching = False
        self.others = 0.0  # cores' worth of CPU time used by other processes lately
        self.own = 0.0  # cores' worth this process used in the same window

    def threads(self, wanted: int) -> int:
        """Threads to run now: `wanted`, less the cores others use (rounded), at least 1.
        One thread asked is one thread run: nothing to take away, so /proc is not read
        and no neighbour is waited out (a settle wait on every call of a one-thread
        backend beside a busy neighbour was pure loss)."""
        if not self.enabled or wanted <= 1:
            return wanted
        with self._lock:
            self._update()
            others = self.others
            if others >= 0.5 and self.own < IDLE:
                # The first call after an idle spell of ours (a request's prefill, the
                # call its user waits for): the window is what ran before it came, a
                # client or another server that has just finished (interleaved against
                # llama-server, every prompt after its turn was prefilled on one thread
                # of two). Go by the neighbours still running now, never more than the
                # window says; one that runs on is running now and still counts.
                others = min(others, self._running_now(others))
        free = self.cores - others
        return max(1, min(wanted, int(free + 0.5)))

    def _running_now(self, window: float) -> float:
        """The fewest threads of other processes seen running over SETTLE seconds (the
        window's figure if /proc cannot say); done as soon as none is."""
        fewest, waited = window, 0.0
        while True:
            now = self._running()
            if now is None:
                return fewest
            fewest = min(fewest, float(now))
            if fewest < 0.5 or waited >= SETTLE:
                return fewest
            self._sleep(SETTLE_STEP)
            waited += SETTLE_STEP

    def _update(self) -> None:
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval:
            return
        sample = self._read(self.helpers)
        if sample is None:
            return
        if self._last is not None:
            wall = now - self._last[0]
            own = (sample[1] - self._last[2]) / TICKS / wall
            others = (sample[0] - self._last[1]) / TICKS / wall - own
            # After an idle spell (between requests, between a benchmark's modes) the
            # window would average in work that has ended: a process that had just
            # finished made our next call, a whole prompt prefill, run on one thread.
            # Such a window says nothing about now; start afresh, with every thread.
            # A long window in which this process worked throughout is no idle spell:
            # it is a slow call, and a call is slowest when a neighbour in another
            # scheduling group (another session, another cgroup) leaves our threads
            # sharing one core, each spinning while it waits for the other. Taken for
            # idle, it would hand back every thread and keep the calls that slow.
            idle = wall > OLD_WINDOW * self.interval and own < IDLE
            self.others = 0.0 if idle else max(0.0, others)
            self.own = own
        self._last = (now, *sample)

    def count_as_ours(self, pids) -> None:
        """Count these processes' CPU time as this one's from now on (read_proc)."""
        with self._lock:
            self.helpers = self.helpers | frozenset(pids)
            self._last = None  # a window that straddles the change would mix two meanings of "own"

    def watch(self) -> None:
        """Re-read /proc every interval on a daemon thread, idle or not, so that the
        first call after an idle spell (a request's prefill, the call a user waits
        for) goes by the last quarter second instead of every thread: beside a
        neighbour in another scheduling group, two threads on one core made a
        118-token prefill take 3 s instead of 0.3. A read costs tens of microseconds."""
        if self._watching or not self.enabled:
            return
        self._watching = True
        threading.Thread(target=self._watch, name="specsample-cpushare", daemon=True).start()

    def _watch(self) -> None:
        while self._watching:
            with self._lock:
                self._update()
            time.sleep(self.interval)


# One per process: every backend reads the same measurement.
SHARED = CpuShare(enabled=os.environ.get("SPECSAMPLE_SHARE_CORES", "1") != "0")

"""Threads follow the cores other processes leave free."""

import threading
import time

import pytest

from specsample.backends.cpushare import TICKS, CpuShare, busy_ticks, read_proc, running_others

pytestmark = pytest.mark.system


class FakeProc:
    """/proc as a script: each read advances the wall clock by 0.5 s, during which
    other processes use `others` cores and this one `own` cores."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0, 0
        self.others = self.own_cores = 0.0

    def clock(self):
        return self.now

    def read(self, helpers=frozenset()):
        return self.busy, self.own

    def running(self):  # other processes' threads running at this instant
        return round(self.others)

    def advance(self, seconds=0.5):
        self.now += seconds
        self.busy += int(TICKS * seconds * (self.others + self.own_cores))
        self.own += int(TICKS * seconds * self.own_cores)


def test_a_lone_process_keeps_its_threads_and_a_busy_machine_takes_them_away():
    proc = FakeProc()
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=proc.running)
    proc.own_cores = 2.0
    assert share.threads(2) == 2  # first sample: nothing measured yet
    proc.advance()
    assert share.threads(2) == 2 and share.others == 0.0  # all the busy time is ours
    proc.others, proc.own_cores = 1.0, 1.0  # a second model process arrives
    proc.advance()
    assert share.threads(2) == 1
    proc.others = 2.0  # a process using both cores: still one thread, never none
    proc.advance()
    assert share.threads(2) == 1
    proc.others = 0.3  # background noise under half a core does not cost a thread
    proc.advance()
    assert share.threads(2) == 2
    assert share.threads(1) == 1  # never more than asked


def test_one_thread_asked_reads_nothing_and_waits_for_no_one():
    # Beside a busy neighbour, after an idle spell of ours: where two threads asked
    # would read /proc and wait the neighbour out, one thread asked is answered at once.
    proc = FakeProc()
    reads, sleeps = [], []
    share = CpuShare(interval=0.25, read=lambda helpers: reads.append(1) or proc.read(helpers),
                     clock=proc.clock, cores=2, running=proc.running, sleep=sleeps.append)
    share.threads(2)
    proc.others = 2.0
    proc.advance()
    assert share.threads(2) == 1 and sleeps  # the control: two asked, the neighbour waited out
    reads.clear(), sleeps.clear()
    proc.advance()
    assert share.threads(1) == 1 and not reads and not sleeps


def test_the_measurement_is_reread_only_after_the_interval():
    proc = FakeProc()
    share = CpuShare(interval=1.0, read=proc.read, clock=proc.clock, cores=2, running=proc.running)
    share.threads(2)
    proc.others = 2.0
    proc.advance(0.5)
    assert share.threads(2) == 2  # too soon to look again
    proc.advance(0.5)
    assert share.threads(2) == 1


def test_work_that_ended_during_an_idle_spell_costs_no_threads():
    proc = FakeProc()
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=proc.running)
    share.threads(2)
    proc.others = 2.0
    proc.advance(1.0)  # another process ran flat out, then stopped while we were idle
    proc.others = 0.0
    proc.advance(1.5)
    assert share.threads(2) == 2  # a 2.5 s window (0.8 cores busy on average) is stale
    proc.others = 2.0
    proc.advance(0.5)
    assert share.threads(2) == 1  # a fresh window still sees a busy machine


def test_a_neighbour_that_just_finished_costs_the_next_prefill_no_thread():
    """Interleaved against llama-server, each of our prompts after its turn saw a
    quarter second of two busy cores and was prefilled on one thread of two."""
    proc = FakeProc()
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=proc.running,
                     sleep=lambda s: None)
    share.threads(2)
    proc.others = 2.0  # another server answered while we were idle...
    proc.advance(0.25)
    proc.others = 0.0  # ...and has stopped as our request comes
    assert share.threads(2) == 2
    proc.others = 2.0  # one that is still running counts
    proc.advance(0.25)
    assert share.threads(2) == 1


def test_a_team_still_spinning_down_is_waited_out_and_one_that_computes_is_not():
    """A neighbour's OpenMP threads spin on for milliseconds after its last call: the
    instant right after it answered still showed both running."""
    proc = FakeProc()
    readings, slept = iter([2, 2, 1, 0, 2]), []
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=lambda: next(readings),
                     sleep=slept.append)
    share.threads(2)
    proc.others = 2.0
    proc.advance(0.25)
    assert share.threads(2) == 2 and len(slept) == 3  # gone after three short waits
    busy = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=lambda: 2, sleep=slept.append)
    slept.clear()
    busy.threads(2)
    proc.advance(0.25)
    assert busy.threads(2) == 1 and sum(slept) == pytest.approx(0.03)  # watched at most 30 ms


def test_the_instant_is_read_only_after_an_idle_spell_of_ours():
    proc = FakeProc()
    asked = []
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2,
                     running=lambda: asked.append(1) or 0)
    share.threads(2)
    proc.others, proc.own_cores = 1.0, 1.0  # we are decoding beside a neighbour: the window holds
    proc.advance(0.25)
    assert share.threads(2) == 1 and not asked
    proc.own_cores = 0.0  # idle, and the window says someone else ran: look now
    proc.advance(0.25)
    assert share.threads(2) == 2 and asked


def test_running_others_counts_a_spinning_neighbour():
    import subprocess
    import sys

    if running_others() is None:
        pytest.skip("no /proc here")
    child = subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        assert max(running_others() for _ in range(20)) >= 1
    finally:
        child.kill()
        child.wait()


def test_turned_off_or_off_linux_it_uses_the_threads_asked_for():
    proc = FakeProc()
    proc.others = 2.0
    off = CpuShare(read=proc.read, clock=proc.clock, cores=2, enabled=False)
    no_proc = CpuShare(read=lambda helpers: None, clock=proc.clock, cores=2)
    for share in (off, no_proc):
        share.threads(2)
        proc.advance()
        assert share.threads(2) == 2


def test_this_process_busy_time_shows_in_its_own_and_the_machines_share():
    before = read_proc()
    if before is None:
        pytest.skip("no /proc here")
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of CPU in this process
        pass
    after = read_proc()
    own, busy = after[1] - before[1], after[0] - before[0]
    assert own >= 0.2 * TICKS  # 0.3 s, less the clock's tick granularity
    assert busy >= own - 2  # the cores' busy time includes ours


def test_time_the_hypervisor_took_is_not_another_process():
    # user nice system idle iowait irq softirq steal guest guest_nice, per core
    stat = ("cpu  300 0 30 900 9 0 3 500 0 0\n"
            "cpu0 100 0 10 400 4 0 1 250 0 0\n"
            "cpu1 200 0 20 500 5 0 2 250 0 0\n"
            "intr 12345 0 0\n")
    assert busy_ticks(stat, {0, 1}) == 111 + 222  # steal (250 a core) left out
    assert busy_ticks(stat, {1}) == 222  # only the cores this process may run on


def test_a_helper_process_working_while_this_one_waits_costs_no_thread():
    """Local RPC workers compute a target's call while this process waits on it; their
    time counted as a competitor's once made every draft step after a target call run
    on one thread of two."""
    proc = FakeProc()
    helper_ticks = {"value": 0}

    def read(helpers=frozenset()):
        return proc.busy, proc.own + (helper_ticks["value"] if 4242 in helpers else 0)

    share = CpuShare(interval=0.25, read=read, clock=proc.clock, cores=2, running=proc.running)
    share.threads(2)
    proc.others = 2.0  # the workers run flat out on a target call
    proc.advance()
    helper_ticks["value"] += int(TICKS * 0.5 * 2.0)
    assert share.threads(2) == 1  # not yet known as ours: a competitor
    share.count_as_ours([4242])
    share.threads(2)  # the window restarts: a window across the change would mix two meanings of "own"
    proc.advance()
    helper_ticks["value"] += int(TICKS * 0.5 * 2.0)
    assert share.threads(2) == 2 and share.others == 0.0


def test_a_helper_is_read_from_proc_and_one_that_is_gone_counts_nothing():
    import os
    import subprocess
    import sys

    if read_proc() is None:
        pytest.skip("no /proc here")
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                                                    "while time.process_time() < end: pass\nprint(flush=True)\n"
                                                    "time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # its 0.4 s of CPU spent; now it sleeps
        alone, with_child = read_proc()[1], read_proc(frozenset([child.pid]))[1]
        assert with_child - alone >= 0.3 * TICKS
    finally:
        child.kill()
        child.wait()
    gone = read_proc(frozenset([child.pid, os.getpid() + 10**7]))
    assert gone is not None and gone[1] - read_proc()[1] <= 2  # dead and missing pids: nothing


def test_a_slow_call_beside_a_busy_neighbour_is_no_idle_spell():
    proc = FakeProc()
    share = CpuShare(interval=0.25, read=proc.read, clock=proc.clock, cores=2, running=proc.running)
    share.threads(2)
    # A neighbour in another scheduling group holds one core; our two threads share
    # the other and one call lasts two seconds: the window is long but we worked
    # throughout, so it is read, and the next call runs on the free core alone.
    proc.others, proc.own_cores = 1.0, 1.0
    proc.advance(2.0)
    assert share.threads(2) == 1 and share.others == pytest.approx(1.0, abs=0.02)
    proc.advance(0.5)
    assert share.threads(2) == 1


def test_watching_keeps_the_window_fresh_through_an_idle_spell():
    share = CpuShare(interval=0.1, clock=time.monotonic, cores=2, running=lambda: 1)  # the neighbour runs now too

    def read(helpers=frozenset()):  # a neighbour holding one core, in real time
        return int(TICKS * time.monotonic()), 0

    def watchers():
        return sum(t.name == "specsample-cpushare" for t in threading.enumerate())

    share._read = read
    before = watchers()
    share.watch()
    share.watch()  # once only
    try:
        time.sleep(0.5)  # idle: no call asks for threads, yet the window follows now
        assert share.threads(2) == 1
        assert watchers() == before + 1
    finally:
        share._watching = False  # its loop's condition: the thread ends (a server's watches for good)

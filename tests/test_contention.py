"""Contention measured from the kernel's CPU accounting (trainables/contention.py): another
process's CPU is seen, the trial's own process tree's is not, and the judgement follows
the cores the trial left free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from accelsweep.trainables.contention import (CONTENDED_CPUS, HELD_CPUS_VARIABLE, Contention, ContentionMeter,
                                              WindowsOfReports, assigned_cpus, read_cpu)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")

BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def busy_elsewhere(seconds: float) -> int:
    """A process burning one core for ``seconds``, started through a shell that exits at
    once: not below this process (the meter counts what is below it as the trial's own)."""
    launched = subprocess.run(["sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', sys.executable,
                               BUSY.format(seconds=seconds)], check=True, capture_output=True, text=True)
    return int(launched.stdout)


@pytest.mark.host_timing
def test_another_process_burning_a_core_is_measured_and_contends_with_a_trial_holding_every_core():
    pid = busy_elsewhere(3.0)
    try:
        time.sleep(0.3)
        meter = ContentionMeter(held_cpus=os.cpu_count())
        meter.start()
        time.sleep(1.5)
        contention = meter.stop()
    finally:
        os.kill(pid, signal.SIGKILL)
    assert 0.6 < contention.other_cpus < 1.6, contention
    assert contention.free_cpus == 0 and contention.contended
    # The same load, for a trial that left a core free for it: not contended.
    left_free = Contention(other_cpus=contention.other_cpus, steal_cpus=0.0, free_cpus=1.0, seconds=1.5)
    assert left_free.excess_cpus <= max(0.0, contention.other_cpus - 1.0)
    assert left_free.contended == (contention.other_cpus - 1.0 > CONTENDED_CPUS)


@pytest.mark.host_timing  # reads the whole machine's CPU time
def test_the_trials_own_child_processes_are_its_own_cpu_not_contention():
    before = read_cpu()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=1.5)])
    child.wait()  # reaped: its time is in this process's children's time now
    after = read_cpu()
    own_s = (after.own_ticks - before.own_ticks) / os.sysconf("SC_CLK_TCK")
    assert own_s >= 1.2, own_s  # the child's 1.5 s of CPU counted as the trial's
    meter = ContentionMeter(held_cpus=os.cpu_count())
    meter.start()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=1.0)])
    time.sleep(0.5)  # measured while the child is still alive (a live descendant)
    contention = meter.stop()
    child.wait()
    assert contention.other_cpus < 0.5, contention


def test_reports_of_a_trainable_get_their_windows_contention_unless_they_measured_their_own():
    windows = WindowsOfReports(held_cpus=os.cpu_count())
    pid = busy_elsewhere(2.0)
    try:
        time.sleep(1.0)
        disturbed = windows({"score": 1.0})
    finally:
        os.kill(pid, signal.SIGKILL)
    assert disturbed["window_contended"] == 1.0 and disturbed["contended_windows"] == 1
    assert disturbed["other_cpus"] > 0.5 and disturbed["score"] == 1.0
    own = windows({"score": 2.0, "window_contended": 0.0})  # the training loop's, measured by itself
    assert own == {"score": 2.0, "window_contended": 0.0}


def test_what_a_trial_holds_travels_to_its_child_processes(monkeypatch):
    monkeypatch.setenv(HELD_CPUS_VARIABLE, "1")
    assert assigned_cpus() == 1.0
    assert ContentionMeter().held_cpus == 1.0
    monkeypatch.delenv(HELD_CPUS_VARIABLE)
    assert assigned_cpus() == float(os.cpu_count())  # no Ray here: the machine is the trial's

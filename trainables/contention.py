"""How much of the machine a trial did not get while it measured: contention, read
directly from the kernel's CPU accounting, for every window of every trainable.

A speed probe between windows (a fixed single-threaded loop: measure.host_probe_s) does
not see a competitor: with as many intra-op threads as cores, each op waits for the
thread that lost its core while a one-thread probe keeps a core and runs at full speed.
So each window is bracketed by two readings of the machine's busy and stolen CPU time
(``/proc/stat``) and of the trial's own process tree (``read_cpu``). ``other_cpus`` is
what other processes used, in cores; past the cores the trial left free by more than
CONTENDED_CPUS, the window is ``contended``. Linux only: elsewhere a reading is None and
no window is judged (said, not guessed).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from accelsweep.trainables import ray_adapter
from accelsweep.trainables.environment_variables import environment_restored
from accelsweep.trainables.processes import descendants, process_table

__all__ = ["CONTENDED_CPUS", "HELD_CPUS_VARIABLE", "Contention", "ContentionMeter", "CpuReading", "assigned_cpus",
           "machine_cpus", "read_cpu", "trial_contention", "WindowsOfReports"]

# Other processes' CPU, in cores, beyond the cores a trial left free, above which a
# window counts as contended: above what a quiet main job's own neighbours (raylet, GCS,
# Tune's driver loop, MLflow writes, the progress actor) read over its windows, below what a
# competitor that slows a 2-thread training step by a quarter in every round reads, on each
# host kind recorded (benchmarks/results/host_rules.md, from benchmarks/contention.py).
# Smaller competitors slow such a step by less and read under it: they show as noise, the
# confirmation's interleaving spreads them over every config, and one that holds a core
# from a trial's start costs it a thread (platforms/cpu_threads.py).
CONTENDED_CPUS = 0.15

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
READING_SLACK_TICKS = 2
# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice
# (guest time is counted in user already).
_BUSY_FIELDS, _STEAL_FIELD = (0, 1, 2, 5, 6), 7


@dataclass(frozen=True)
class CpuReading:
    at: float  # time.monotonic()
    busy_ticks: int  # every CPU of the machine, busy
    steal_ticks: int
    own_ticks: int  # the trial's process tree: user + system, reaped children's included


@dataclass(frozen=True)
class Contention:
    """What other processes took while a window ran."""

    other_cpus: float  # cores other processes (and the hypervisor's steal) kept busy, on average
    steal_cpus: float  # the part of it the hypervisor stole
    free_cpus: float  # cores the trial left to others: the machine's minus those it holds
    seconds: float

    @property
    def excess_cpus(self) -> float:
        """Other processes' CPU beyond the cores the trial left free."""
        return max(0.0, self.other_cpus - self.free_cpus)

    @property
    def contended(self) -> bool:
        # The kernel counts CPU time in ticks (10 ms): a short window's reading is coarse,
        # so READING_SLACK_TICKS of it are given the benefit of the doubt.
        return self.excess_cpus - READING_SLACK_TICKS / (_TICKS_PER_S * self.seconds) > CONTENDED_CPUS

    def figures(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}other_cpus": self.other_cpus, f"{prefix}steal_cpus": self.steal_cpus,
                f"{prefix}contention_cpus": self.excess_cpus}


def _machine_ticks() -> Optional[tuple[int, int]]:
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) <= _STEAL_FIELD:
        return None
    return sum(fields[i] for i in _BUSY_FIELDS), fields[_STEAL_FIELD]


def _tree_ticks(root: int) -> int:
    """CPU ticks of ``root`` and every live process below it, each with its reaped
    children's (a worker that exited during the window stays counted as the trial's)."""
    total = 0
    for pid in descendants(process_table(include_zombies=True), [root]):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile: its time went to its parent's cutime
    return total


def read_cpu(root: Optional[int] = None) -> Optional[CpuReading]:
    """The machine's and the process tree's CPU time now (``root``: this process): the CPU
    time the whole machine spent busy (``/proc/stat``: user, nice, system, irq, softirq)
    and stolen from it by the hypervisor (``steal``: a VM's neighbours), and that of the
    trial's own process tree (the process and everything below it: data loader workers,
    compile workers, a fresh-process trial's child)."""
    machine = _machine_ticks()
    if machine is None:
        return None
    return CpuReading(at=time.monotonic(), busy_ticks=machine[0], steal_ticks=machine[1],
                      own_ticks=_tree_ticks(root or os.getpid()))


def machine_cpus() -> int:
    return os.cpu_count() or 1


class ContentionMeter:
    """Readings at window boundaries: ``start()`` before a window, ``stop()`` after it
    returns the Contention of that window (None where /proc cannot be read).

    ``held_cpus``: the cores the trial holds (its Ray resources); default: the CPUs Ray
    assigned this process, else every CPU of the machine."""

    def __init__(self, held_cpus: Optional[float] = None, root: Optional[int] = None):
        self.held_cpus = held_cpus if held_cpus is not None else assigned_cpus()
        self.root = root
        self._start: Optional[CpuReading] = None

    def start(self) -> None:
        self._start = read_cpu(self.root)

    def stop(self) -> Optional[Contention]:
        """Other processes' CPU over the window, in cores: the machine's busy time minus the
        trial's own, plus steal, over the window's wall time."""
        start, end = self._start, read_cpu(self.root)
        self._start = end  # back-to-back windows: the next one starts here
        if start is None or end is None or end.at <= start.at:
            return None
        seconds = end.at - start.at
        stolen = (end.steal_ticks - start.steal_ticks) / _TICKS_PER_S
        others = max(0.0, ((end.busy_ticks - start.busy_ticks) - (end.own_ticks - start.own_ticks)) / _TICKS_PER_S)
        free = max(0.0, machine_cpus() - self.held_cpus)
        return Contention(other_cpus=(others + stolen) / seconds, steal_cpus=stolen / seconds, free_cpus=free,
                          seconds=seconds)


# Set by a trial's wrapper (trainables/loop/failures.py run_isolated) for what the trial
# holds: a fresh-process trial's child is no Ray worker, and would otherwise judge by the
# whole machine.
HELD_CPUS_VARIABLE = "ACCELSWEEP_HELD_CPUS"


class WindowsOfReports:
    """Contention for a trainable that does not measure its own: each report of a trial
    (tune.report) closes a window that opened at the one before (or at the trial's start),
    and gets its figures (``other_cpus``, ``contention_cpus``, ``window_contended``,
    ``contended_windows``). A report that carries ``window_contended`` already (the
    training loop and the kernel harness time their windows themselves) is left as it is."""

    def __init__(self, held_cpus: Optional[float] = None):
        self.meter = ContentionMeter(held_cpus)
        self.meter.start()
        self.contended = 0

    def __call__(self, metrics: dict) -> dict:
        contention = self.meter.stop()
        if not isinstance(metrics, dict) or "window_contended" in metrics or contention is None:
            return metrics
        self.contended += contention.contended
        return {**metrics, **contention.figures(), "window_contended": float(contention.contended),
                "contended_windows": self.contended}


@contextlib.contextmanager
def trial_contention(held_cpus: Optional[float] = None) -> Iterator[None]:
    """For the trial this process runs now: what it holds, said to its child processes
    (HELD_CPUS_VARIABLE), and contention added to each of its reports (WindowsOfReports)."""
    held = held_cpus if held_cpus is not None else assigned_cpus()
    with environment_restored([HELD_CPUS_VARIABLE]):
        os.environ[HELD_CPUS_VARIABLE] = f"{held:g}"
        with ray_adapter.report_hook(WindowsOfReports(held)):
            yield


def assigned_cpus() -> float:
    """The CPUs this trial holds: its wrapper's HELD_CPUS_VARIABLE, else what Ray assigned
    this process, else the machine's."""
    try:
        return float(os.environ[HELD_CPUS_VARIABLE])
    except (KeyError, ValueError):
        pass
    try:
        import ray

        if ray.is_initialized():
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            if cpus:
                return float(cpus)
    except Exception:  # noqa: BLE001 - outside a Ray worker: the machine is the trial's
        pass
    return float(machine_cpus())

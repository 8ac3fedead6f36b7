"""A CPU trial's intra-op threads and niceness, fitted to the cores free when it starts.

Why: OpenMP's threads spin at each barrier waiting for the slowest one; when another
process keeps one of a trial's cores busy, the thread sharing that core runs a slice at a
time and every op waits for it, and Ray starts its workers at nice 15 (about 1/30 of the
core beside a nice-0 process). Measured in a plain loop (benchmarks/results/
neighbour_plain_loop.md, 2-core AMD EPYC): beside one busy process, 2 spinning threads ran
3.7x slower at nice 0 and 22x at nice 15; one thread 1.6x; two with OpenMP's passive wait
policy 1.7x, but 1.4x slower than spinning when quiet. So the trial keeps the spinning
policy (quiet figures are what sweeps rank), lowers its niceness to 0 where it may, and
runs one thread fewer for each core another process keeps busy, read twice (over its
start, then a quarter second more: a burst while it started costs it nothing). Its windows
then count as contended: a figure of fewer threads is not the config's.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from accelsweep.trainables.contention import ContentionMeter, machine_cpus

__all__ = ["MIN_READING_S", "ThreadFit", "busy_cores", "fitted_threads", "renice"]

# A reading of other processes' CPU over less than this is too coarse to act on (the
# kernel's counters tick at 100 Hz: a tick or two is a tenth of a core over 0.2 s).
MIN_READING_S = 0.25


def busy_cores(other_cpus: float) -> int:
    """Cores another process holds: one for each it kept busy at least half the time (a
    quiet local sweep's own neighbours, Ray's and the driver's, read under 0.15 core:
    trainables/contention.py CONTENDED_CPUS)."""
    return math.floor(other_cpus + 0.5) if math.isfinite(other_cpus) else 0


def fitted_threads(asked: int, cores: int, other_cpus: float) -> int:
    """``asked`` intra-op threads, at most one per core no other process keeps busy, at least one."""
    return max(1, min(asked, cores - busy_cores(other_cpus)))


def renice(target: int = 0) -> tuple[int, str]:
    """Lower every thread of this process to niceness ``target`` (Linux keeps a niceness
    per thread: the intra-op pool a reused worker made keeps its own); (the niceness now,
    why it is not ``target``: '' when it is). Lowering needs CAP_SYS_NICE (root) or an
    RLIMIT_NICE that allows it; refused, the trial keeps Ray's and says so."""
    refused = ""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
        except PermissionError as error:
            refused = (f"{error.strerror}: lowering niceness needs root (CAP_SYS_NICE); start Ray with "
                       "RAY_worker_niceness=0 in its environment instead")
        except (ProcessLookupError, OSError):
            pass  # a thread that ended meanwhile
    return os.getpriority(os.PRIO_PROCESS, 0), refused


@dataclass
class ThreadFit:
    """One trial's fit: ``start()`` at the trial's start, ``fit()`` before its warm-up.
    Threads are cut only when two readings say a core is busy. ``measure`` False: the
    threads asked, unread, for a trial whose neighbours are its own (the confirmation's
    configs taking turns, a data-parallel trial's other workers), which would read as other
    processes; its niceness is still lowered, as every trial's is, so that it meets a
    neighbour on the footing the search's trials did."""

    asked: int
    cores: int = field(default_factory=machine_cpus)
    measure: bool = True
    threads: int = 0
    readings: list = field(default_factory=list)  # other processes' CPU, in cores, per reading
    niceness: Optional[int] = None
    nice_refused: str = ""
    _meter: Optional[ContentionMeter] = None
    _since: float = 0.0

    def start(self) -> "ThreadFit":
        self.niceness, self.nice_refused = renice()
        self.threads = self.asked
        if self.measure:
            self._meter = ContentionMeter()
            self._meter.start()
        self._since = time.monotonic()
        return self

    def keep_threads(self) -> None:
        """From now on as if made with ``measure`` False."""
        self.measure, self._meter = False, None

    def fit(self) -> int:
        """Once, before the warm-up (a compiled config's kernels keep the thread count they
        were compiled with): read other processes' CPU since ``start`` (waited out to
        MIN_READING_S), and when that says a core is busy, read again over MIN_READING_S
        (a burst while the trial started costs it nothing); set the threads."""
        import torch

        if self._meter is None:
            self.niceness, self.nice_refused = renice()  # threads started since (the intra-op pool's)
            return self.threads
        for _ in range(2):
            short = MIN_READING_S - (time.monotonic() - self._since)
            if short > 0:
                time.sleep(short)
            contention = self._meter.stop()
            self._since = time.monotonic()
            if contention is None:  # no /proc here: the threads asked, unread
                self._meter = None
                return self.threads
            self.readings.append(contention.other_cpus)
            if fitted_threads(self.asked, self.cores, min(self.readings)) == self.asked:
                break
        self.threads = fitted_threads(self.asked, self.cores, min(self.readings))
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        self.niceness, self.nice_refused = renice()  # threads started since (the intra-op pool's)
        return self.threads

    @property
    def cut(self) -> bool:
        """It runs fewer threads than asked: its figure is not the config's."""
        return self.threads < self.asked

    def figures(self) -> dict[str, float]:
        """For each result of the trial."""
        other = min(self.readings) if self.readings else float("nan")
        return {"intra_op_threads": float(self.threads), "threads_asked": float(self.asked),
                "other_cpus_at_start": other,
                "niceness": float(self.niceness) if self.niceness is not None else float("nan")}

    def note(self) -> str:
        """What the fit did, in words ('' when it ran the threads asked at niceness 0)."""
        parts = []
        if self.threads < self.asked:
            parts.append(f"{self.threads} intra-op thread(s), not the {self.asked} asked: other processes kept "
                         f"{min(self.readings):.1f} of the {self.cores} cores busy as it started")
        if self.nice_refused:
            parts.append(f"niceness {self.niceness} ({self.nice_refused})")
        return "; ".join(parts)

"""Timing windows and their statistics, shared by every trainable.

A window runs a step function until it has done at least ``min_steps`` steps and at
least ``min_seconds`` have passed, then syncs the device once. The host clock is read
after every step (a clock read, not a device sync): on synchronous devices those reads
are real step times; on asynchronous ones only the window total is trusted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["Window", "WindowStats", "coefficient_of_variation", "matmul_probe_gflops", "percentile", "time_window",
           "torch_compile_seconds"]

# torch.compile's own timers (torch._dynamo.utils.compilation_time_metrics): the
# forward graph compile and the backward graph compile, which runs on first backward.
_DYNAMO_COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Window:
    steps: int
    seconds: float
    step_seconds: list[float]  # host-clock time of each step (see module docstring)

    @property
    def mean_step_s(self) -> float:
        return self.seconds / self.steps


def time_window(step: Callable[[], object], sync: Callable[[], None], min_steps: int,
                min_seconds: float, clock: Callable[[], float] = time.perf_counter,
                step_multiple: int = 1) -> Window:
    """``step_multiple``: end only after a whole number of groups of this many steps
    (XLA's batches_per_execution: a shorter tail would be a graph of its own)."""
    sync()  # nothing queued before the window may be billed to it
    start = previous = clock()
    step_seconds = []
    while (len(step_seconds) < min_steps or previous - start < min_seconds
           or len(step_seconds) % step_multiple):
        step()
        now = clock()
        step_seconds.append(now - previous)
        previous = now
    sync()
    return Window(steps=len(step_seconds), seconds=clock() - start, step_seconds=step_seconds)


@dataclass
class WindowStats:
    """Everything measured so far in a trial's steady state."""

    samples_per_step: int
    host_clock_times_steps: bool
    windows: list[Window] = field(default_factory=list)

    def add(self, window: Window) -> None:
        self.windows.append(window)

    @property
    def steps(self) -> int:
        return sum(w.steps for w in self.windows)

    @property
    def seconds(self) -> float:
        return sum(w.seconds for w in self.windows)

    @property
    def throughput(self) -> float:
        return self.steps * self.samples_per_step / self.seconds if self.seconds > 0 else float("nan")

    @property
    def step_times(self) -> list[float]:
        if self.host_clock_times_steps:
            return [s for w in self.windows for s in w.step_seconds]
        return [w.mean_step_s for w in self.windows]

    @property
    def step_time_source(self) -> str:
        return "per-step host clock" if self.host_clock_times_steps else "per-window mean (async device)"

    def step_time(self, q: float) -> float:
        return percentile(self.step_times, q)


def torch_compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process so far (its own timers):
    the difference across a trial's first steps is its compile time (``compile_s``)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(name, ())) for name in _DYNAMO_COMPILE_TIMERS)


def fixed_cpu_work() -> int:
    """About a millisecond of pure-Python arithmetic: no allocation, no library, no I/O,
    so its time changes only when the machine's own speed does."""
    total = 0
    for i in range(20_000):
        total += i * i
    return total


# A figure taken while the host's speed probe ran this much slower than the sweep's
# typical (median) was measured on a loaded machine: flagged, not trusted, not used to reject.
HOST_LOADED = 0.25


def host_probe_s(seconds: float = 0.02) -> float:
    """Median time of ``fixed_cpu_work`` over a short window. Taken between a benchmark's
    windows, the probes' spread tells a kernel's own noise from the machine's: on a shared
    VM the host's speed can change within a second, and every timing with it."""
    return percentile(time_window(fixed_cpu_work, lambda: None, 5, seconds).step_seconds, 50)


def matmul_probe_gflops(dtype: str, seconds: float = 0.02, size: int = 512) -> float:
    """The machine's speed at the math a trial runs: GFLOP/s of a fixed ``size`` square
    matmul in ``dtype`` (a torch dtype name), the median call over ``seconds``, on this
    process's threads. On a shared VM a bf16 config's throughput drifts with the host over
    tens of seconds, and a bf16 matmul moves with it where the Python probe
    (``host_probe_s``) does not (benchmarks/host_drift.py): a trial's figure over this
    probe ranks configs measured minutes apart on one footing."""
    import torch

    generator = torch.Generator().manual_seed(0)
    left = torch.randn(size, size, generator=generator).to(getattr(torch, dtype))
    right = torch.randn(size, size, generator=generator).to(getattr(torch, dtype))
    left @ right  # first call: the kernel's own set-up, not timed
    window = time_window(lambda: left @ right, lambda: None, 5, seconds)
    return 2 * size ** 3 / percentile(window.step_seconds, 50) / 1e9


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population stdev / mean; NaN for fewer than two values."""
    if len(values) < 2:
        return float("nan")
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean

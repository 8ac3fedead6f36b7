"""Slow configs rejected in seconds, and compiles cut at a limit.

A sweep's early stopping (ASHA) can stop a trial only after its first window: warm-up,
compile and a whole window later. A config ten times slower than the best so far has
shown that in its first steps. So the training loop projects the sweep's objective from
every step it times (``project``) and stops the trial as soon as that projection is
worse than the best value so far by more than ``ratio`` (``TrialLimits.verdict``); a step
that runs past the time at which it could no longer meet that is abandoned mid-step
(trainables/watchdog.py). The stopped trial reports its projection, marked ``rejected``:
the searcher learns the region is slow, the sweep never ranks a projection.

The best so far lives in a small Ray actor (``SweepBoard``) the driver starts for each
sweep and updates from every measured result; a trial reads it once, when it starts.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Optional

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.watchdog import TrialAborted, Watchdog

# The driver's side (SweepBoard, BoardLimits, trial_limits) is not a user's: not listed.
__all__ = ["CompileTimeout", "REJECT_RATIO", "SlowTrial", "StepGuard", "TrialLimits", "current_limits"]

# Reject when the projection is worse than the best so far by more than this factor.
# From the recorded grid (benchmarks/search_efficiency.py, README "Rejecting slow
# configs"): see there for the measurements it was chosen from.
REJECT_RATIO = 3.0
# The first step also pays for first-touch allocation and lazy initialisation: it may run
# this many times the rejection deadline of a later step before it is abandoned.
FIRST_STEP_ALLOWANCE = 3.0


class SlowTrial(TrialAborted):
    """The trial's projected objective is hopeless against the best so far."""


class CompileTimeout(TrialAborted):
    """The trial's compile (its first steps) ran past the sweep's --max-compile-s."""


@dataclass(frozen=True)
class TrialLimits:
    """What a trial of a sweep may cost before it stops itself. ``metric``/``mode``: the
    sweep's first objective; ``best``: its best value measured so far (NaN: none yet, so
    nothing is rejected); ``max_compile_s``: the compile limit (None: none)."""

    metric: str
    mode: str = "max"
    best: float = float("nan")
    ratio: float = REJECT_RATIO
    max_compile_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and self.ratio > 1):
            raise ConfigError("reject_ratio", "a number > 1 (how many times worse than the best a projection may be)",
                              self.ratio)
        if self.max_compile_s is not None and not (self.max_compile_s > 0 and math.isfinite(self.max_compile_s)):
            raise ConfigError("max_compile_s", "seconds > 0, or None for no limit", self.max_compile_s)

    @property
    def rejects(self) -> bool:
        return math.isfinite(self.best) and self.best != 0

    def verdict(self, projected: Mapping[str, float]) -> Optional[str]:
        """Why a trial with these projected figures is hopeless, or None."""
        value = projected.get(self.metric)
        if not self.rejects or value is None or not math.isfinite(value):
            return None
        hopeless = value < self.best / self.ratio if self.mode == "max" else value > self.best * self.ratio
        if not hopeless:
            return None
        return (f"projected {value:.4g} {self.metric}, best so far {self.best:.4g}: "
                f"more than {self.ratio:g}x worse")

    def step_deadline_s(self, project: Callable[[float], Mapping[str, float]]) -> Optional[float]:
        """The step time past which a step's projection (``project(step_s)``) is hopeless;
        None when no step time is (the objective is not one the loop projects). The
        projections are monotonic in the step time: found by bisection."""
        if not self.rejects:
            return None
        low, high = 1e-7, 1e6
        if self.verdict(project(high)) is None or self.verdict(project(low)) is not None:
            return None
        for _ in range(80):
            middle = math.sqrt(low * high)
            low, high = (low, middle) if self.verdict(project(middle)) else (middle, high)
        return high

    def with_best(self, best: Optional[float]) -> "TrialLimits":
        return replace(self, best=float("nan") if best is None else float(best))


class SweepBoard:
    """The best value of the sweep's first objective so far. Run as a Ray actor (``actor``):
    the driver offers every measured result, a trial reads it when it starts."""

    def __init__(self, mode: str):
        self.mode = mode
        self.value: Optional[float] = None

    def offer(self, value: float) -> None:
        if not math.isfinite(value):
            return
        if self.value is None or (value > self.value if self.mode == "max" else value < self.value):
            self.value = value

    def best(self) -> Optional[float]:
        return self.value

    @classmethod
    def start(cls, name: str, mode: str, best: Optional[float] = None) -> Any:
        """The sweep's board as a named Ray actor (no CPU: it holds one float)."""
        import ray

        board = ray.remote(num_cpus=0)(cls).options(name=name, get_if_exists=True).remote(mode)
        if best is not None:
            board.offer.remote(best)
        return board


@dataclass(frozen=True)
class BoardLimits:
    """The sweep's limits as they travel to its trials: its board's actor name, read
    when a trial starts (``for_trial``)."""

    board_name: str
    limits: TrialLimits

    def for_trial(self) -> TrialLimits:
        import ray

        try:
            board = ray.get_actor(self.board_name)
            return self.limits.with_best(ray.get(board.best.remote(), timeout=10))
        except Exception:  # noqa: BLE001 - no board (it died, a stale name): the trial runs unlimited by it
            return self.limits


_current: Optional[TrialLimits] = None


@contextlib.contextmanager
def trial_limits(limits: Optional[TrialLimits]) -> Iterator[None]:
    """The limits of the trial this process runs now (the sweep's trainable wrapper sets
    them; the training loop reads them with ``current_limits``)."""
    global _current
    saved, _current = _current, limits
    try:
        yield
    finally:
        _current = saved


def current_limits() -> Optional[TrialLimits]:
    return _current


class StepGuard:
    """A trial's limits applied to its first steps (the training loop's warm-up and first
    window): the compile limit on the first step of a compiling config, a deadline on each
    later warm-up step, and the projection judged after every timed step.

    ``samples_per_step``: the batch; ``units_per_step()``: the workload's units per step so
    far (NaN before the first); ``usd_per_hour``: the trial's price (NaN: none)."""

    def __init__(self, limits: Optional[TrialLimits], *, samples_per_step: int, units_per_step: Callable[[], float],
                 unit: str, usd_per_hour: float, compiling: bool):
        self.limits = limits
        self.samples_per_step, self.units_per_step = samples_per_step, units_per_step
        self.unit, self.usd_per_hour, self.compiling = unit, usd_per_hour, compiling
        self.step_times: list[float] = []  # timed steps after the first
        self.projected: dict[str, float] = {}  # the latest projection judged
        self.deadline_s: Optional[float] = None
        self.first_step_s = float("nan")
        self._abandoned_after_s: Optional[float] = None
        watching = limits is not None and (limits.rejects or (compiling and limits.max_compile_s is not None))
        self._dog = Watchdog() if watching else None

    def __enter__(self) -> "StepGuard":
        if self._dog is not None:
            self._dog.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._dog is not None:
            self._dog.__exit__(*exc_info)

    def project(self, step_s: float) -> dict[str, float]:
        """The loop's figures for a trial whose every step took ``step_s``."""
        from accelsweep.trainables.cost import usd_per_1m_samples

        samples = self.samples_per_step / step_s
        figures = {"throughput_samples_per_s": samples, "step_time_p50_s": step_s, "step_time_p90_s": step_s,
                   "usd_per_1m_samples": usd_per_1m_samples(self.usd_per_hour, samples)}
        if self.unit != "samples":
            units = self.units_per_step() / step_s
            figures[f"throughput_{self.unit}_per_s"] = units
            figures[f"usd_per_1m_{self.unit}"] = usd_per_1m_samples(self.usd_per_hour, units)
        return figures

    def _past_deadline(self, seconds: float) -> str:
        self._abandoned_after_s = seconds  # what a step abandoned now projects at best
        return f"a step still ran after {seconds:.3g} s, so at best {self.limits.verdict(self.project(seconds))}"

    def expect_first_step(self) -> None:
        if self._dog is None:
            return
        if self.compiling and self.limits.max_compile_s is not None:
            self._dog.expect(self.limits.max_compile_s, CompileTimeout,
                             f"compile (the first step) ran past the limit of {self.limits.max_compile_s:g} s "
                             "(--max-compile-s)")
            return
        # Samples-based objectives have a deadline before any step; a unit's need its count.
        deadline = self.limits.step_deadline_s(self.project)
        if deadline is not None and not self.compiling:
            self._dog.expect(FIRST_STEP_ALLOWANCE * deadline, SlowTrial,
                             self._past_deadline(FIRST_STEP_ALLOWANCE * deadline))

    def reason_of(self, error: TrialAborted) -> str:
        """An abort's reason: its message, or (raised by the watchdog, with none) the watchdog's."""
        return str(error) or (self._dog.reason if self._dog is not None else "") or type(error).__name__

    def clear(self) -> None:
        if self._dog is not None:
            self._dog.clear()

    def first_step_done(self, seconds: float) -> None:
        self.first_step_s = seconds
        if self.limits is not None:
            self.deadline_s = self.limits.step_deadline_s(self.project)

    def watching(self, step: Callable[[], None], abandon: bool = False) -> Callable[[], None]:
        """``step``, judged as it ends; with ``abandon`` (the warm-up's steps), abandoned
        past the deadline too. The watchdog stays out of measured windows: it would cost
        each of their steps a wake-up of its thread."""
        if self.deadline_s is None:
            return step

        def judged() -> None:
            start = time.perf_counter()
            if abandon and self._dog is not None:
                self._dog.expect(self.deadline_s, SlowTrial, self._past_deadline(self.deadline_s))
                step()
                self._dog.clear()
            else:
                step()
            self.judge_step(time.perf_counter() - start)

        return judged

    def expect_steps(self, count: int) -> None:
        """A run of ``count`` steps on an asynchronous device, judged as a whole at its sync."""
        if self._dog is not None and self.deadline_s is not None and count:
            allowance = FIRST_STEP_ALLOWANCE if self.compiling else 1.0  # XLA compiles a k-step graph here
            self._dog.expect(allowance * self.deadline_s * count, SlowTrial,
                             self._past_deadline(allowance * self.deadline_s))

    def judge_step(self, seconds: float) -> None:
        self.step_times.append(seconds)
        self.judge(sum(self.step_times) / len(self.step_times))

    def judge(self, step_s: float) -> None:
        """Raise SlowTrial when a trial stepping at ``step_s`` is hopeless."""
        if self.limits is None:
            return
        self.projected = self.project(step_s)
        reason = self.limits.verdict(self.projected)
        if reason is not None:
            raise SlowTrial(reason)

    def rejected_result(self, reason: str, **fields: Any) -> dict[str, Any]:
        """What a rejected trial reports: its projection (the searcher learns the region is
        slow), marked rejected with the reason, and the times it did measure."""
        if not self.projected and self._abandoned_after_s is not None:
            self.projected = self.project(self._abandoned_after_s)  # stopped mid-step: at best this
        return {**self.projected, "rejected": 1, "rejection": reason, "first_step_s": self.first_step_s,
                "windows_done": 0, "measured_steps": 0, "unit": self.unit, "usd_per_hour": self.usd_per_hour,
                **fields}

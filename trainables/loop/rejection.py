"""Slow configs rejected in seconds, and compiles cut at a limit.

A sweep's early stopping (ASHA) can stop a trial only after its first window: warm-up,
compile and a whole window later. A config ten times slower than the best so far has
shown that in its first steps. So the training loop projects the sweep's objective from
every step it times (``project``) and stops the trial as soon as that projection is
worse than the best value so far by more than ``ratio`` (``TrialLimits.verdict``); a step
that runs past the time at which it could no longer meet that is abandoned mid-step
(trainables/loop/watchdog.py). The stopped trial reports its projection, marked ``rejected``:
the searcher learns the region is slow, the sweep never ranks a projection.

The best so far lives in a small Ray actor (``SweepBoard``) the driver starts for each
sweep and updates from every measured result; a trial reads it once, when it starts.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Optional

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.contention import ContentionMeter
from accelsweep.trainables.cost import usd_per_1m_samples
from accelsweep.trainables.timing.windows import host_probe_s
from accelsweep.trainables.loop.watchdog import TrialAborted, Watchdog
from accelsweep.trainables.ray_adapter import on_this_node

# The driver's side (SweepBoard, BoardLimits, trial_limits) is not a user's: not listed.
__all__ = ["CompileTimeout", "REJECT_RATIO", "SlowTrial", "StepGuard", "TrialLimits", "current_limits"]

# Reject when the projection is worse than the best so far by more than this factor. Its
# floor is measured: a ratio must exceed best / projection for every config within 5% of
# the best, 1.07-1.10 on each recorded grid (a warm-up's projection is 0.81-1.15 of the full
# run), times the best-so-far's own noise (the near-best margin, reporting/noise.py). Above
# it, the ratio buys saved time against risk: 3 is about twice the floor with that noise,
# and below how far a config falls whose dtype the CPU emulates (bf16 without bf16
# instructions: 5-22x). Each recorded grid's figures, its CPU named:
# benchmarks/results/host_rules.md (benchmarks/host_rules.py).
REJECT_RATIO = 3.0
# A host whose speed probe runs this much slower than the sweep's typical (half speed) is
# too loaded to judge a trial by: laxer than HOST_LOADED, which flags a figure as not
# trusted, because a rejection needs a projection several times worse anyway.
LOADED_FOR_REJECTION = 1.0
# A step is abandoned mid-way only past this many times the step time at which its
# projection turns hopeless: the first step also pays for first-touch allocation and lazy
# initialisation (under twice a steady step over the recorded grid), and any one step can
# be slowed by the host. Steps that end are judged by their mean instead.
FIRST_STEP_ALLOWANCE = 3.0
# Deadlines shorter than this are not watched: such a step ends soon anyway, and on a
# shared VM one step of a few milliseconds can take several times its usual time.
MIN_WATCHED_S = 0.05
# Timed steps (after the first), and seconds of them, a mean must cover before it can
# reject a trial: one step alone, or a few of a millisecond, can be a hiccup of the host.
# A hopeless config's steps are slow: it collects this much evidence within a few steps.
MIN_JUDGED_STEPS = 2
MIN_JUDGED_S = 0.05


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
    # The sweep's typical (median) host speed probe so far (trainables/timing/windows.py host_probe_s):
    # a trial on a host slower than it by LOADED_FOR_REJECTION is not judged. NaN: none yet.
    typical_probe_s: float = float("nan")

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

    def with_board(self, best: Optional[float], typical_probe_s: Optional[float]) -> "TrialLimits":
        """These limits with what the sweep's board holds now (None: nothing yet)."""
        nan = float("nan")
        return replace(self, best=nan if best is None else float(best),
                       typical_probe_s=nan if typical_probe_s is None else float(typical_probe_s))


class SweepBoard:
    """The best value of the sweep's first objective so far, and the typical (median) host
    speed probe of its trials. Run as a Ray actor (``start``): the driver offers every measured
    result, a trial reads both when it starts."""

    def __init__(self, mode: str):
        self.mode = mode
        self.value: Optional[float] = None
        self.probes: list[float] = []

    def offer(self, value: float, probe_s: float = float("nan")) -> None:
        if math.isfinite(value) and (self.value is None or (value > self.value if self.mode == "max"
                                                             else value < self.value)):
            self.value = value
        if probe_s > 0:
            self.probes.append(probe_s)

    def best(self) -> tuple[Optional[float], Optional[float]]:
        return self.value, statistics.median(self.probes) if self.probes else None

    @classmethod
    def start(cls, name: str, mode: str) -> Any:
        """The sweep's board as a named Ray actor (no CPU: it holds two numbers). Ray ends
        a named actor with its last handle: the caller keeps this one for the sweep."""
        import ray

        return ray.remote(num_cpus=0)(cls).options(name=name, get_if_exists=True, **on_this_node()).remote(mode)


@dataclass(frozen=True)
class BoardLimits:
    """The sweep's limits as they travel to its trials: its board's actor name, read
    when a trial starts (``for_trial``)."""

    board_name: Optional[str]  # None: no rejection, only the compile limit
    limits: TrialLimits

    def for_trial(self) -> TrialLimits:
        import ray

        if self.board_name is None:
            return self.limits
        try:
            board = ray.get_actor(self.board_name)
            return self.limits.with_board(*ray.get(board.best.remote(), timeout=10))
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
        self.samples_per_step, self.units_per_step = samples_per_step, units_per_step
        self.unit, self.usd_per_hour, self.compiling = unit, usd_per_hour, compiling
        self.note = ""  # why rejection is off for this trial, when it is
        self.limits = self._unless_loaded(limits)
        self.deadline_s: Optional[float] = None  # a step slower than this is hopeless
        self.first_step_s = float("nan")
        self._timed_s, self._timed_steps = 0.0, 0  # steps after the first
        self._abandoned_after_s: Optional[float] = None  # a step the watchdog abandoned ran at least this
        watching = self.limits is not None and (self.limits.rejects or (compiling and self.limits.max_compile_s))
        self._dog = Watchdog() if watching else None
        # Other processes' CPU while the judged steps ran: a projection made while they
        # took the trial's cores is the neighbours', and rejects nothing (trainables/contention.py).
        self._contention = ContentionMeter() if self.limits is not None and self.limits.rejects else None
        if self._contention is not None:
            self._contention.start()

    def _unless_loaded(self, limits: Optional[TrialLimits]) -> Optional[TrialLimits]:
        """No rejection on a loaded host: the best so far was measured on a quiet one, and a
        good config measured now would project slow (on a shared host, many times slower
        under load). Told by the machine's speed probe against the sweep's typical one."""
        if limits is None or not limits.rejects or not limits.typical_probe_s > 0:
            return limits
        # The best of two probes: a process just started (this trial's) probes slow once.
        slowdown = min(host_probe_s(), host_probe_s()) / limits.typical_probe_s - 1
        if slowdown <= LOADED_FOR_REJECTION:
            return limits
        self.note = (f"not judged for rejection: the host's speed probe ran {slowdown:.0%} slower than the sweep's "
                     "typical (a loaded host)")
        return replace(limits, best=float("nan"))

    def __enter__(self) -> "StepGuard":
        if self._dog is not None:
            self._dog.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._dog is not None:
            self._dog.__exit__(*exc_info)

    def project(self, step_s: float) -> dict[str, float]:
        """The loop's figures for a trial whose every step took ``step_s``."""
        samples = self.samples_per_step / step_s
        figures = {"throughput_samples_per_s": samples, "step_time_p50_s": step_s, "step_time_p90_s": step_s,
                   "usd_per_1m_samples": usd_per_1m_samples(self.usd_per_hour, samples)}
        if self.unit != "samples":
            units = self.units_per_step() / step_s
            figures[f"throughput_{self.unit}_per_s"] = units
            figures[f"usd_per_1m_{self.unit}"] = usd_per_1m_samples(self.usd_per_hour, units)
        return figures

    @contextlib.contextmanager
    def _deadline(self, seconds: Optional[float], exception: type[TrialAborted], reason: str) -> Iterator[None]:
        """The stretch inside is abandoned with ``exception`` past ``seconds`` (None: no deadline)."""
        if self._dog is None or seconds is None or (exception is SlowTrial and seconds < MIN_WATCHED_S):
            yield
            return
        self._dog.expect(seconds, exception, reason)
        try:
            yield
        except BaseException:
            self._dog.disarm()  # the stretch's own error (an OOM, a NaN) is what the trial ends with
            raise
        self._dog.clear()

    def _abandon_after(self, seconds: float) -> str:
        self._abandoned_after_s = seconds
        return f"a step still ran after {seconds:.3g} s, so at best {self.limits.verdict(self.project(seconds))}"

    def first_step(self):
        """The first step: on a compiling config, the compile limit; else a deadline of
        FIRST_STEP_ALLOWANCE later steps' (where the objective's deadline is known yet)."""
        if self._dog is None:
            return self._deadline(None, SlowTrial, "")
        if self.compiling:  # its first step is the compile: only the compile limit bounds it
            limit = self.limits.max_compile_s
            if limit is None:
                return self._deadline(None, CompileTimeout, "")
            return self._deadline(limit, CompileTimeout,
                                  f"compile (the first step) ran past the limit of {limit:g} s (--max-compile-s)")
        deadline = self.limits.step_deadline_s(self.project)  # a unit's objective needs a step's count first
        if deadline is None:
            return self._deadline(None, SlowTrial, "")
        return self._deadline(FIRST_STEP_ALLOWANCE * deadline, SlowTrial,
                              self._abandon_after(FIRST_STEP_ALLOWANCE * deadline))

    def first_step_done(self, seconds: float) -> None:
        self.first_step_s = seconds
        if self.limits is not None:
            self.deadline_s = self.limits.step_deadline_s(self.project)

    def steps(self, count: int):
        """A run of ``count`` steps on an asynchronous device, judged as a whole at its sync."""
        if self.deadline_s is None or not count:
            return self._deadline(None, SlowTrial, "")
        limit = FIRST_STEP_ALLOWANCE * self.deadline_s * count  # XLA may compile a k-step graph here too
        return self._deadline(limit, SlowTrial, self._abandon_after(limit / count))

    def watching(self, step: Callable[[], None], abandon: bool = False) -> Callable[[], None]:
        """``step``, judged as it ends; with ``abandon`` (the warm-up's steps), abandoned
        past the deadline too. The watchdog stays out of measured windows: it would cost
        each of their steps a wake-up of its thread; there the judgement is a comparison."""
        if self.deadline_s is None:
            return step

        def judged() -> None:
            start = time.perf_counter()
            if abandon:
                limit = FIRST_STEP_ALLOWANCE * self.deadline_s
                with self._deadline(limit, SlowTrial, self._abandon_after(limit)):
                    step()
            else:
                step()
            self.judge_steps(time.perf_counter() - start)

        return judged

    def judge_steps(self, seconds: float, count: int = 1) -> None:
        """``count`` more timed steps took ``seconds``: SlowTrial when their mean so far is
        past the deadline (the projection is monotonic in it: one comparison per step)."""
        self._timed_s += seconds
        self._timed_steps += count
        mean = self._timed_s / self._timed_steps
        enough = self._timed_steps >= MIN_JUDGED_STEPS and self._timed_s >= MIN_JUDGED_S
        if self.deadline_s is not None and enough and mean > self.deadline_s:
            if self._contended():
                return
            raise SlowTrial(self.limits.verdict(self.project(mean)))

    def _contended(self) -> bool:
        """Whether other processes took the trial's cores while its judged steps ran; if so,
        judging ends here (said in ``note``): the trial is measured and kept, not rejected."""
        contention = self._contention.stop() if self._contention is not None else None
        if contention is None or not contention.contended:
            return False
        self.deadline_s = None
        self.note = (f"not judged for rejection: other processes used {contention.other_cpus:.2f} CPUs while its "
                     f"first steps ran ({contention.excess_cpus:.2f} beyond the cores it left free: contended)")
        return True

    def reason_of(self, error: TrialAborted) -> str:
        """An abort's reason: its message, or (raised by the watchdog, with none) the watchdog's."""
        return str(error) or (self._dog.reason if self._dog is not None else "") or type(error).__name__

    def rejected_result(self, error: SlowTrial, **fields: Any) -> dict[str, Any]:
        """What a rejected trial reports: its projection (the searcher learns the region is
        slow), marked rejected with the reason, and the times it did measure."""
        timed_s, timed_steps = self._timed_s, self._timed_steps
        if not str(error) and self._abandoned_after_s is not None:  # the watchdog abandoned a step
            timed_s, timed_steps = timed_s + self._abandoned_after_s, timed_steps + 1
        projected = self.project(timed_s / timed_steps) if timed_steps else {}
        return {**projected, "rejected": 1, "rejection": self.reason_of(error), "first_step_s": self.first_step_s,
                "windows_done": 0, "measured_steps": 0, "unit": self.unit, "usd_per_hour": self.usd_per_hour,
                **fields}

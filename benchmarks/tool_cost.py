"""The tool's own cost, measured: what running a config through accelsweep (Ray, Tune,
MLflow) costs over running its loop by hand, each figure against its target.

    .venv/bin/python benchmarks/tool_cost.py                  # every figure, ~10 min on 2 cores
    .venv/bin/python benchmarks/tool_cost.py --quick          # every count shrunk: a couple of minutes
    .venv/bin/python benchmarks/tool_cost.py --out benchmarks/data/tool_cost_<machine>.json

It prints a table (figure, measured, target, pass/fail, and the machine and date) and
writes the same figures, with what each is made of, to a JSON file. Every figure is a
ratio or a count taken within this one run, and the things each compares run
interleaved (a, b, a, b, ...) so that a drift of the machine's speed falls on both sides.
A neighbour's work does not cancel out: on 2 cores one busy thread of another process
slows a 2-thread trial several times over. So each figure records the CPU other
processes used while it was measured (``others_cpu``), and the table says BUSY when they
used more than a tenth of a core: run it on a quiet machine (`uptime` load < 0.5).

The figures (issue 16):
1. Measurement overhead: the main job's CPU config (vit-tiny; windows of 6 s, not 2, so
   that a run's own spread is below the 2% looked for) through the full trial path
   (a one-trial sweep that starts its own Ray; Tune, MLflow; rejection, early stopping,
   the report and NaN capture off) against the same loop in a plain process
   (trainables/fresh_process.py: a child process, no Ray), in pairs of alternating order.
   Measured: the median over pairs of how much lower the trial path's throughput is; and,
   beside each loop, the CPU our other processes used (Tune's driver, Ray's daemons).
2. Repeatability: the same config as trials of one sweep (``remeasure``, the API users
   have for it): trial-to-trial CV of throughput, beside the windows' own CV and the
   machine-speed probe's. Where the default windows miss, longer ones are measured too.
3. Per-trial overhead, first and later trials apart: a trial's time outside its loop as
   the user meets it. The first: from the sweep's start of its trials (after Ray is up)
   to the first trial's end, less its loop; split into the driver's set-up, Tune and the
   trial process's start, imports, the model's build and the rest. Later: from the end of
   the trial before to this one's end, less its loop (one trial at a time).
4. Driver at scale: many trivial trials (no torch) through the real driver (TPE, ASHA,
   the MLflow callback into sqlite, the report): slot-seconds of overhead per trial =
   (sweep wall time x concurrent slots - the trials' loop time) / trials; and MLflow
   write errors (runs missing or not finished, errors logged).
5. Real concurrency: sleeping trials that hold one CPU each on 2 CPUs: the trials' time
   over the wall time they took (2: two ran at once all along).
6. Compile reuse: the same torch.compile sweep twice with a fresh compile cache: the
   second's compile time over the first's.

One Ray instance (ray.init(num_cpus=2)) serves figures 2, 4, 5 and 6; figure 1's sweeps
start their own, as a user's sweep does, so that the plain process it is compared with
runs with no Ray at all, and so that figure 3's first trials are met as a user meets them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accelsweep import Objective, Sweep, SweepConfig, remeasure
from accelsweep.sweeps.driver.define.cli import main_guard
from accelsweep.sweeps.driver.record.tracking import mlflow_client
from accelsweep.sweeps.driver.record.trial_record import FINISHED, REUSED, STOPPED_EARLY
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.timing.windows import coefficient_of_variation as cv
from accelsweep.trainables.metrics import Metric, MetricSet
from accelsweep.trainables.platforms.cpu import cpu_model_name
from accelsweep.trainables.processes import ProcessStat, descendants, process_table, stat_of

FORMAT = 1
SLOTS = 2  # the machine the targets are set for: 2 CPUs, so two one-CPU trials at once
# Other processes' mean CPU use (cores) over a figure above which the table says the run
# was not on a quiet machine: a tenth of a core already costs a 2-thread trial percents.
BUSY_CORES = 0.1

# --------------------------------------------------------------------------- figures and targets


# Each figure's name, unit ("fraction" shows as %), comparison and target (issue 16).
TARGETS = {
    "1": ("measurement overhead", "fraction", "<=", 0.02),
    "2": ("repeatability: trial-to-trial CV", "fraction", "<=", 0.03),
    "3a": ("first trial outside its loop", "s", "<=", 3.0),
    "3b": ("later trials outside their loop", "s", "<=", 0.5),
    "4a": ("driver at scale: slot-s of overhead per trial", "slot-s", "<=", 0.3),
    "4b": ("driver at scale: MLflow write errors", "count", "<=", 0),
    "5": ("real concurrency (trials at once)", "x", ">=", 1.8),
    "6": ("compile reuse: sweep 2 / sweep 1 compile time", "fraction", "<=", 0.20),
}


@dataclass
class Figure:
    """One figure of the table: what was measured against its target. ``op``: "<=" or
    ">=" (measured op target passes). ``measured`` NaN with ``error``: not measured."""

    key: str  # "1", "2", "3a", ...
    name: str
    measured: float
    unit: str  # "fraction" (shown as %), "s", "slot-s", "count", "x"
    op: str
    target: float
    note: str = ""  # one line: what the number is
    detail: dict = field(default_factory=dict)
    error: Optional[str] = None
    others_cpu: dict = field(default_factory=dict)  # NeighbourWatch.summary() while it was measured

    @property
    def passed(self) -> Optional[bool]:
        return judge(self.measured, self.op, self.target)

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "not measured"}[self.passed]

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "measured": _finite_or_none(self.measured), "unit": self.unit,
                "target": f"{self.op} {show(self.target, self.unit)}", "target_value": self.target, "op": self.op,
                "passed": self.passed, "verdict": self.verdict, "note": self.note, "detail": json_safe(self.detail),
                "error": self.error, "others_cpu": json_safe(self.others_cpu)}


def figure(key: str, measured: float, **fields: Any) -> Figure:
    """Figure ``key`` of TARGETS, as measured."""
    name, unit, op, target = TARGETS[key]
    return Figure(key, name, measured, unit, op, target, **fields)


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity as None (strict JSON has neither)."""
    if isinstance(value, float):
        return _finite_or_none(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def judge(measured: float, op: str, target: float) -> Optional[bool]:
    """Whether ``measured`` meets ``op target``; None when it was not measured (NaN)."""
    if op not in ("<=", ">="):
        raise ConfigError("op", "'<=' or '>='", op)
    if measured is None or not math.isfinite(measured):
        return None
    return measured <= target if op == "<=" else measured >= target


def show(value: Optional[float], unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit == "count":
        return f"{value:.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.2f} {unit}"


def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def coefficient_of_variation(values: Sequence[float]) -> float:
    """The training loop's own definition (population stdev / mean), so that the
    trial-to-trial figure reads like the windows' ``throughput_cv`` beside it."""
    return cv(list(values))


def paired_slowdown(pairs: Sequence[tuple[float, float]]) -> float:
    """How much lower the trial path measures than the bare loop: the median over pairs
    of 1 - path / bare (throughputs; negative: the trial path measured higher). A median
    of pairs, so that one pair taken while the machine was loaded does not decide it."""
    ratios = [1 - path / bare for bare, path in pairs if bare > 0 and math.isfinite(path)]
    return statistics.median(ratios) if ratios else float("nan")


def slot_seconds_per_trial(wall_s: float, slots: int, loop_s: Sequence[float], trials: int) -> float:
    """Slot-seconds of overhead per trial: the slots the sweep held over its wall time,
    less what the trials spent in their loops, spread over the trials."""
    if trials <= 0:
        return float("nan")
    return (wall_s * slots - sum(loop_s)) / trials


def effective_concurrency(intervals: Sequence[tuple[float, float]]) -> float:
    """The trials' time over the wall time from the first start to the last end: 2 when
    two ran at once all along, 1 when one ran at a time."""
    if not intervals:
        return float("nan")
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return sum(end - start for start, end in intervals) / span if span > 0 else float("nan")


def peak_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end before a start at the same time)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda event: (event[0], event[1]))
    peak = running = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def outside_loop_parts(start: float, created: float, end: float, loop_s: float, setup_s: float,
                       marks: Optional[Mapping[str, float]] = None, fit_started: Optional[float] = None) -> dict:
    """A trial's time outside its loop, from ``start`` (the sweep's start of its trials,
    for a first trial; the end of the trial before, for a later one) to its ``end``, in
    parts that add up to ``total_s``. ``created``: when the driver's clock for it started
    (Tune's on_trial_start, after its process is up); ``marks``: when the trainable was
    entered, its imports done and it returned (the trial's monotonic clock, the same
    clock as the driver's on one machine); ``fit_started``: when Tune's fit began."""
    parts: dict[str, float] = {"total_s": end - start - loop_s}
    if fit_started is not None:
        parts["driver_before_tune_s"] = fit_started - start  # MLflow parent run, study, board
        parts["tune_start_s"] = created - fit_started  # Tune's start, first proposal, the actor asked for
    else:
        parts["between_trials_s"] = created - start  # last trial's records, next proposal, actor reset
    if marks:
        # Measured (Ray 2.60): on_trial_start comes ~0.1 s after the trial's process is forked;
        # the process then starts Ray's worker, imports Ray Tune and unpickles the trainable.
        parts["trial_process_start_s"] = marks["entered"] - created
        parts["imports_s"] = marks["imported"] - marks["entered"]
        parts["model_and_data_build_s"] = setup_s
        parts["in_trainable_other_s"] = marks["left"] - marks["imported"] - setup_s - loop_s
        parts["trial_end_s"] = end - marks["left"]  # the last report, Tune seeing the trial end
    else:
        parts["model_and_data_build_s"] = setup_s
        parts["trial_other_s"] = end - created - setup_s - loop_s
    return parts


def median_parts(samples: Sequence[Mapping[str, float]]) -> dict:
    """Each part's median over ``samples`` (the parts of one median need not add up)."""
    names = [name for name in samples[0]] if samples else []
    return {name: statistics.median(s[name] for s in samples if name in s) for name in names}


def format_table(report: Mapping[str, Any]) -> str:
    """The figures as the README quotes them: figure, measured, target, pass/fail, then
    the machine and date, then one line on what each figure is made of."""
    machine = report.get("machine", {})
    rows = [(f"{f['key']}. {f['name']}", show(f["measured"], f["unit"]), f["target"], f["verdict"])
            for f in report["figures"]]
    header = ("figure", "measured", "target", "pass/fail")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]
    lines = [" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in [header, tuple("-" * w for w in widths), *rows]]
    lines.append("")
    versions = machine.get("versions", {})
    lines.append(f"Machine: {machine.get('cpu_model', '?')}, {machine.get('usable_cpus', '?')} CPUs; "
                 f"torch {versions.get('torch', '?')}, ray {versions.get('ray', '?')}, mlflow "
                 f"{versions.get('mlflow', '?')}; {report.get('started_utc', '?')} UTC; load "
                 f"{machine.get('load_average_1m_before', math.nan):.2f} before, "
                 f"{machine.get('load_average_1m_after', math.nan):.2f} after; "
                 f"{'--quick, ' if report.get('quick') else ''}{report.get('elapsed_s', math.nan):.0f} s in all.")
    busiest = max((f["others_cpu"].get("others_cores_mean") or 0.0 for f in report["figures"]
                   if f.get("others_cpu")), default=0.0)
    if busiest > BUSY_CORES:
        lines.append(f"BUSY: other processes used up to {busiest:.2f} cores (mean over a figure) while it ran: the "
                     "timings beside them are noise (a quiet machine's are not); run it again when it is quiet.")
    for made in report["figures"]:
        said = made["error"] or made["note"]
        others = made.get("others_cpu") or {}
        if others.get("others_cores_mean") is not None:
            said += (f" [other processes: {others['others_cores_mean']:.2f} cores mean, "
                     f"{others['others_cores_max_1s']:.2f} at most]")
        if said:
            lines.append(f"  {made['key']}: {said}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- what the trials run
# These run in Ray's trial processes. Run as a script, this module is __main__ and Ray
# ships them by value: they may name only the standard library and accelsweep.


def stopwatch_trainable(searched, base, cost=None, marks_dir: str = "") -> None:
    """``train_trainable``, with when its process entered it, when the heavy imports
    were done and when it returned written to ``marks_dir`` (three clock reads: the
    measurement is the real trainable's)."""
    entered = time.monotonic()
    cpu_before = time.process_time()  # what this process burnt before (its start, Ray's imports, unpickling)
    import importlib

    from ray import tune

    # Imported here, in the trial's process, where the marks time them: the trial's own imports
    from accelsweep.trainables.workloads.base import load_workload

    for module in ("torch", *load_workload(base.get("workload", "image-classification")).imports,
                   "accelsweep.trainables.loop.train_loop"):
        importlib.import_module(module)
    imported = time.monotonic()
    from accelsweep.trainables.trainable import train_trainable  # the real trainable, after the marks' imports

    try:
        train_trainable(searched, base=base, cost=cost)
    finally:
        left = time.monotonic()
        marks = {"entered": entered, "imported": imported, "left": left, "pid": os.getpid(),
                 "process_started": _process_started(), "cpu_s_before_entry": cpu_before}
        with open(os.path.join(marks_dir, f"{tune.get_context().get_trial_id()}.json"), "w") as out:
            json.dump(marks, out)


def _process_started() -> float:
    """When this process started, on time.monotonic's clock: /proc/self/stat's starttime
    (clock ticks since boot, proc(5)) against CLOCK_BOOTTIME; NaN where there is no /proc."""
    try:
        ticks = stat_of(os.getpid()).started
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return math.nan


def sleeping_trainable(searched, base, cost=None) -> None:
    """Holds its CPU asleep for ``seconds``: a trial whose loop costs nothing but time."""
    from ray import tune

    seconds = {**base, **searched}["seconds"]
    started = time.perf_counter()
    time.sleep(seconds)
    tune.report({"slept_s": seconds, "loop_s": time.perf_counter() - started})


def trivial_trainable(searched, base, cost=None) -> None:
    """Reports ``windows`` results at once: a trial that is all overhead."""
    from ray import tune

    values = {**base, **searched}
    started = time.perf_counter()
    for window in range(1, values["windows"] + 1):
        tune.report({"score": values["x"] * window, "loop_s": time.perf_counter() - started})


@dataclass(frozen=True)
class TrivialConfig(SweepConfig):
    x: float = 0.5
    windows: int = 2  # ASHA gets a rung to stop trials at


@dataclass(frozen=True)
class SleepConfig(SweepConfig):
    seconds: float = 1.0
    cpus_per_worker: int = 1


def _small_metrics(name: str, unit: str):
    return MetricSet(metrics=(Metric(name, unit, "max", label=name, progress=f"{name} {{:.3g}}"),),
                     headline=(name,))


# --------------------------------------------------------------------------- running a sweep with clocks


@dataclass
class SweepClock:
    """A sweep run with the driver's clocks read around it (time.monotonic)."""

    called: float = math.nan  # run_sweep called
    returned: float = math.nan
    fit_started: float = math.nan  # Tune's fit began (after the parent run, study, board)
    fit_ended: float = math.nan
    lines: list = field(default_factory=list)  # (time, line) the driver said
    result: Any = None  # SweepResult
    marks: dict = field(default_factory=dict)  # trial id -> stopwatch_trainable's marks
    error: Optional[str] = None

    @property
    def wall_s(self) -> float:
        return self.returned - self.called

    @property
    def ray_ready(self) -> float:
        """Its first line is said once Ray is connected (started, when it starts it)."""
        return self.lines[0][0] if self.lines else math.nan

    @property
    def announced(self) -> float:
        """When it said how many trials run at a time: Ray is up, the trials begin."""
        return next((t for t, line in self.lines if " at a time (" in line), math.nan)

    @property
    def slots(self) -> int:
        found = next((re.search(r"(\d+) at a time", line) for _, line in self.lines if " at a time (" in line), None)
        return int(found.group(1)) if found else 0

    @property
    def trials(self) -> list:
        return sorted((r for r in self.result.records if r.status != REUSED), key=lambda r: r.created_at) \
            if self.result else []


def trial_end(record) -> float:
    return record.created_at + record.wall_s


def run_timed(sweep, marks_dir: Optional[str] = None) -> SweepClock:
    """``run_sweep(sweep)`` with its clocks: when it was called, said each line, began
    Tune's fit, returned; and the stopwatch marks its trials left in ``marks_dir``."""
    from ray import tune

    from accelsweep import run_sweep  # Ray Tune and MLflow: not in the trials, which import this module

    clock = SweepClock()
    sweep = dataclasses.replace(sweep, print_line=lambda line: clock.lines.append((time.monotonic(), line)))
    original_fit = tune.Tuner.fit

    def timed_fit(tuner, *args, **kwargs):
        clock.fit_started = time.monotonic()
        try:
            return original_fit(tuner, *args, **kwargs)
        finally:
            clock.fit_ended = time.monotonic()

    tune.Tuner.fit = timed_fit  # this process only, for this sweep: the driver's code is not changed
    clock.called = time.monotonic()
    try:
        clock.result = run_sweep(sweep)
    finally:
        clock.returned = time.monotonic()
        tune.Tuner.fit = original_fit
    if marks_dir:
        for record in clock.trials:
            path = os.path.join(marks_dir, f"{record.trial_id}.json")
            if os.path.exists(path):
                with open(path) as marks:
                    clock.marks[record.trial_id] = json.load(marks)
    return clock


def first_trial_parts(clock: SweepClock) -> dict:
    first = clock.trials[0]
    return outside_loop_parts(clock.announced, first.created_at, trial_end(first), first.result["loop_s"],
                              first.result.get("setup_s", 0.0), clock.marks.get(first.trial_id), clock.fit_started)


def later_trial_parts(clock: SweepClock) -> list[dict]:
    """Trials after the first, one at a time: each from the end of the one before."""
    trials = clock.trials
    return [outside_loop_parts(trial_end(before), record.created_at, trial_end(record), record.result["loop_s"],
                               record.result.get("setup_s", 0.0), clock.marks.get(record.trial_id))
            for before, record in zip(trials, trials[1:])]


def failed_trials(clock: SweepClock) -> list[str]:
    return [f"trial {r.number}: {r.status} {r.error_class} {r.error}".strip() for r in clock.trials
            if r.status not in (FINISHED, STOPPED_EARLY)]


# --------------------------------------------------------------------------- the settings of a run


@dataclass(frozen=True)
class Counts:
    """How much each figure measures: the issue's minimums, or shrunk (--quick)."""

    pairs: int = 6  # figure 1 (an even number: as many pairs start with either side)
    # Figure 1's windows, over the default's: a 2% difference needs runs whose own spread
    # is about that (figure 2 measured 6% trial to trial at the default 2 s, 2% at 6 s).
    overhead_window_factor: float = 3.0
    repeats: int = 5  # figure 2
    longer_window_factor: float = 3.0  # figure 2: windows this much longer where the default misses
    driver_trials: int = 200  # figure 4
    sleepers: int = 8  # figure 5
    sleep_s: float = 4.0
    compile_batches: tuple = (8, 16)  # figure 6: one torch.compile config per batch size
    smoke_model: bool = False  # vit-micro and short windows for figures 1-3 (the main job's --smoke)


FULL = Counts()
QUICK = Counts(pairs=2, overhead_window_factor=1.0, repeats=2, longer_window_factor=0.0, driver_trials=12,
               sleepers=4, sleep_s=1.0, compile_batches=(8,), smoke_model=True)


def main_job_config(counts: Counts):
    """The main job's CPU baseline (sweeps/neuron_vit.py base_config): vit-tiny, batch 16,
    both CPUs in one trial, 3 warm-up steps, 3 windows of >= 5 steps and >= 2 s."""
    # The study script runs a sweep (Ray Tune, MLflow): not loaded in the trials, which import this module
    from accelsweep.sweeps.neuron_vit import base_config

    return base_config("cpu", smoke=counts.smoke_model, cpus=SLOTS, instance_type=None, seed=0)


def measuring_sweep(name: str, base, scratch: str, marks_dir: str, num_samples: int = 1):
    """A sweep of one config with every option off: no early stopping, no rejection, no
    report; the stopwatch around the real trainable."""
    from ray import tune

    # The training loop's import is a timed part of a trial (stopwatch_trainable): not loaded with this module
    from accelsweep.trainables.trainable import metrics_of

    return Sweep(name=name, trainable=functools.partial(stopwatch_trainable, marks_dir=marks_dir),
                 metrics=metrics_of, base=base, space={"batch_size": tune.choice([base.batch_size])},
                 num_samples=num_samples, scheduler="none", reject_ratio=None, report=False,
                 tracking_uri=f"sqlite:///{scratch}/mlflow.db", storage_path=os.path.join(scratch, "ray"))


# --------------------------------------------------------------------------- figure 1 (and 3's first trials)


def measure_overhead_pairs(counts: Counts, scratch: str, say: Callable[[str], None]) -> dict:
    """Pairs of (plain process, one-trial sweep that starts its own Ray), alternating
    which goes first. Needs no Ray initialised in this process."""
    import ray

    # The training loop's import is a timed part of a trial (stopwatch_trainable): not loaded with this module
    from accelsweep.trainables.fresh_process import run_in_fresh_process

    if ray.is_initialized():
        raise RuntimeError("figure 1 needs no Ray in this process: its sweeps start their own")
    config = main_job_config(counts)
    config = config.replace(window_min_s=config.window_min_s * counts.overhead_window_factor)
    marks_dir = os.path.join(scratch, "marks")
    os.makedirs(marks_dir, exist_ok=True)
    pairs, bare_runs, sweeps = [], [], []
    for index in range(counts.pairs):
        order = ("bare", "path") if index % 2 == 0 else ("path", "bare")
        got: dict[str, float] = {}
        for side in order:
            if side == "bare":
                started = time.monotonic()
                results = list(run_in_fresh_process(config))
                loop_ended = time.monotonic()  # the last window's result has just come
                wall_s = time.monotonic() - started
                last = results[-1]
                bare_runs.append({"wall_s": wall_s, "loop_s": last["loop_s"], "setup_s": last["setup_s"],
                                  "loop": (loop_ended - last["loop_s"], loop_ended),
                                  "throughput": last["throughput_samples_per_s"],
                                  "host_probe_s": last["host_probe_s"], "throughput_cv": last["throughput_cv"]})
                got["bare"] = last["throughput_samples_per_s"]
            else:
                clock = run_timed(measuring_sweep("tool-cost-path", config, scratch, marks_dir), marks_dir)
                if not clock.lines or not clock.lines[0][1].startswith("started a local Ray instance"):
                    # run_sweep with no address joins a cluster a `ray start` on this machine left running
                    raise RuntimeError(f"the trial path's sweep did not start its own Ray: "
                                       f"{clock.lines[0][1] if clock.lines else 'it said nothing'}")
                sweeps.append(clock)
                failed = failed_trials(clock)
                if failed:
                    raise RuntimeError("the trial path's trial: " + "; ".join(failed))
                trial = clock.trials[0]
                got["path"] = trial.result["throughput_samples_per_s"]
                time.sleep(1.0)  # Ray's processes are gone before the next measurement
        pairs.append((got["bare"], got["path"]))
        say(f"[1] pair {index + 1}/{counts.pairs} ({order[0]} first): plain process {got['bare']:.1f}, "
            f"trial path {got['path']:.1f} samples/s")
    return {"pairs": pairs, "bare_runs": bare_runs, "sweeps": sweeps, "config": config}


def path_loop(clock: SweepClock) -> tuple[float, float]:
    """When the trial path's trial ran its loop (its trainable returned just after)."""
    trial = clock.trials[0]
    marks = clock.marks.get(trial.trial_id)
    ended = marks["left"] if marks else trial_end(trial)
    return ended - trial.result["loop_s"], ended


def figure_overhead(measured: dict, watch: Optional["NeighbourWatch"] = None) -> Figure:
    """``watch``: what our processes used meanwhile: besides the training process, the
    tool's (Ray, Tune, MLflow) beside the trial path's loop, the idle driver beside the
    plain process's."""
    pairs = measured["pairs"]
    path_trials = [clock.trials[0] for clock in measured["sweeps"]]
    beside = {}
    if watch is not None:
        beside = {"plain_process": [tool_cores(watch.samples, *run["loop"], watch.hertz)
                                    for run in measured["bare_runs"]],
                  "trial_path": [tool_cores(watch.samples, *path_loop(clock), watch.hertz)
                                 for clock in measured["sweeps"]]}
    slowdown = paired_slowdown(pairs)
    per_pair = [1 - path / bare for bare, path in pairs]
    config = measured["config"].to_dict()
    return figure(
        "1", slowdown,
        note=f"median over {len(pairs)} interleaved pairs of 1 - throughput(trial path) / throughput(plain "
             f"process), each pair {min(per_pair):+.1%} to {max(per_pair):+.1%} (plain processes alone differ by "
             f"{coefficient_of_variation([bare for bare, _ in pairs]):.1%} CV); {config['model']} batch "
             f"{config['batch_size']}, threads {config['threads']}, {config['windows']} windows >= "
             f"{config['window_min_s']:g} s" + _beside_words(beside),
        detail={"pairs_samples_per_s": [{"plain_process": bare, "trial_path": path} for bare, path in pairs],
                "per_pair_slowdown": per_pair,
                "plain_process_host_probe_s": [run["host_probe_s"] for run in measured["bare_runs"]],
                "trial_path_host_probe_s": [t.result.get("host_probe_s") for t in path_trials],
                "plain_process_throughput_cv": [run["throughput_cv"] for run in measured["bare_runs"]],
                "trial_path_throughput_cv": [t.result.get("throughput_cv") for t in path_trials],
                "cores_beside_the_loop": beside, "config": config})


def _beside_words(beside: Mapping[str, list]) -> str:
    """The tool's processes' CPU beside the loops, in words (median over the pairs)."""
    if not beside or not beside.get("trial_path"):
        return ""
    path = [b["cores"] for b in beside["trial_path"] if math.isfinite(b["cores"])]
    bare = [b["cores"] for b in beside["plain_process"] if math.isfinite(b["cores"])]
    if not path or not bare:
        return ""
    names: dict[str, list[float]] = {}
    for measured in beside["trial_path"]:
        for name, cores in measured["by_process"].items():
            names.setdefault(name, []).append(cores)
    top = sorted(((statistics.median(v) * len(v) / len(path), name) for name, v in names.items()), reverse=True)[:3]
    return (f"; beside the loop, our other processes used {statistics.median(path):.3f} cores (trial path: "
            + ", ".join(f"{name} {cores:.3f}" for cores, name in top)
            + f") against {statistics.median(bare):.3f} (plain process)")


# --------------------------------------------------------------------------- figure 2


def measure_repeats(counts: Counts, scratch: str, say: Callable[[str], None], window_factor: float = 1.0) -> dict:
    """The config as ``counts.repeats`` trials of one sweep (``remeasure``), on the Ray
    instance this process holds; ``window_factor`` scales its window length."""
    config = main_job_config(counts)
    if window_factor != 1.0:
        config = config.replace(window_min_s=config.window_min_s * window_factor)
    marks_dir = os.path.join(scratch, "marks")
    os.makedirs(marks_dir, exist_ok=True)
    sweep = measuring_sweep("tool-cost-repeat", config, scratch, marks_dir)
    clock = run_timed(remeasure(sweep, [{"batch_size": config.batch_size}], times=counts.repeats), marks_dir)
    failed = failed_trials(clock)
    if failed:
        raise RuntimeError("; ".join(failed))
    throughputs = [r.result["throughput_samples_per_s"] for r in clock.trials]
    say(f"[2] {len(throughputs)} trials, windows >= {config.window_min_s:g} s: "
        + ", ".join(f"{t:.1f}" for t in throughputs) + " samples/s")
    return {"clock": clock, "config": config}


def repeat_figures(clock: SweepClock) -> dict:
    trials = clock.trials
    throughputs = [r.result["throughput_samples_per_s"] for r in trials]
    probes = [r.result["host_probe_s"] for r in trials]
    return {"trial_to_trial_cv": coefficient_of_variation(throughputs),
            "window_to_window_cv_median": statistics.median(r.result["throughput_cv"] for r in trials),
            "host_cv_median": statistics.median(r.result["host_cv"] for r in trials),
            "host_probe_s_median": statistics.median(probes),
            "host_probe_trial_to_trial_cv": coefficient_of_variation(probes),
            "throughputs_samples_per_s": throughputs, "trials": len(trials)}


def figure_repeatability(default: dict, longer: Optional[dict]) -> Figure:
    figures = repeat_figures(default["clock"])
    config = default["config"]
    detail = {"default_windows": {**figures, "windows": config.windows, "window_min_s": config.window_min_s,
                                  "window_min_steps": config.window_min_steps}}
    note = (f"CV of throughput over {figures['trials']} trials of one remeasure sweep; windows' own CV "
            f"{figures['window_to_window_cv_median']:.1%} (median), host probe "
            f"{figures['host_probe_s_median'] * 1e3:.2f} ms, its CV within trials {figures['host_cv_median']:.1%}, "
            f"across trials {figures['host_probe_trial_to_trial_cv']:.1%}")
    if longer is not None:
        longer_figures = repeat_figures(longer["clock"])
        detail["longer_windows"] = {**longer_figures, "window_min_s": longer["config"].window_min_s}
        meets = longer_figures["trial_to_trial_cv"] <= 0.03
        note += (f"; with windows >= {longer['config'].window_min_s:g} s: trial-to-trial CV "
                 f"{longer_figures['trial_to_trial_cv']:.1%} ({'meets' if meets else 'still misses'} 3%)")
    return figure("2", figures["trial_to_trial_cv"], note=note, detail=detail)


# --------------------------------------------------------------------------- figure 3


def figures_per_trial(overhead: Optional[dict], repeats: Optional[dict]) -> list[Figure]:
    """The first trial as a user meets it (figure 1's sweeps, each starting its own Ray;
    the first trial after ray.init: figure 2's), and later trials (figure 2's)."""
    found = []
    firsts = [first_trial_parts(clock) for clock in overhead["sweeps"]] if overhead else []
    after_init = first_trial_parts(repeats["clock"]) if repeats else None
    samples = firsts or ([after_init] if after_init else [])
    if samples:
        parts = median_parts(samples)
        detail = {"median_parts_s": parts, "samples": samples,
                  "overhead_s_metric": [c.trials[0].result.get("overhead_s") for c in overhead["sweeps"]]
                  if overhead else []}
        if overhead:
            # run_sweep's checks, its MLflow store and Ray's start: once per sweep, before any trial
            detail["sweep_start_before_trials_s"] = [c.announced - c.called for c in overhead["sweeps"]]
            detail["of_which_until_ray_is_up_s"] = [c.ray_ready - c.called for c in overhead["sweeps"]]
            bare = overhead["bare_runs"]
            detail["plain_process_outside_loop_s"] = [run["wall_s"] - run["loop_s"] for run in bare]
            detail["plain_process_start_and_imports_s"] = [run["wall_s"] - run["loop_s"] - run["setup_s"]
                                                           for run in bare]
        if after_init:
            detail["first_trial_after_ray_init"] = after_init
        # What the trial's process did before it entered the trainable: when it was forked
        # (against the driver's start of the trial's clock) and the CPU time it burnt.
        detail["trial_process"] = [
            {"forked_after_trial_clock_s": marks["process_started"] - clock.trials[0].created_at,
             "cpu_s_before_trainable": marks["cpu_s_before_entry"]}
            for clock in (overhead["sweeps"] if overhead else [repeats["clock"]])
            if (marks := clock.marks.get(clock.trials[0].trial_id))]
        where = "sweeps that start their own Ray" if firsts else "the first trial after ray.init"
        note = (f"median of {len(samples)} ({where}), from the trials' start (Ray up) to its end, less its loop: "
                + ", ".join(f"{name[:-2].replace('_', ' ')} {value:.2f}" for name, value in parts.items()
                            if name != "total_s") + " s")
        if overhead:
            note += (f"; before it, the sweep's checks, store and Ray's start "
                     f"{statistics.median(detail['sweep_start_before_trials_s']):.1f} s; a plain "
                     f"process needs {statistics.median(detail['plain_process_outside_loop_s']):.1f} s outside "
                     "its loop")
        found.append(figure("3a", parts["total_s"], note=note, detail=detail))
    if repeats and len(repeats["clock"].trials) > 1:
        later = later_trial_parts(repeats["clock"])
        parts = median_parts(later)
        note = (f"median of {len(later)} later trials (process reused), from the end of the trial before: "
                + ", ".join(f"{name[:-2].replace('_', ' ')} {value:.2f}" for name, value in parts.items()
                            if name != "total_s") + " s")
        found.append(figure("3b", parts["total_s"], note=note,
                            detail={"median_parts_s": parts, "samples": later,
                                    "overhead_s_metric": [r.result.get("overhead_s")
                                                          for r in repeats["clock"].trials[1:]]}))
    return found


# --------------------------------------------------------------------------- figure 4


@contextlib.contextmanager
def counted_errors(names: Sequence[str]):
    """Counts the ERROR (and worse) records the named loggers emit meanwhile."""
    seen: list[str] = []

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.name}: {record.getMessage()[:200]}")

    handler = Counter(level=logging.ERROR)
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield seen
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def measure_driver(counts: Counts, scratch: str, say: Callable[[str], None]) -> dict:
    """``counts.driver_trials`` trivial trials through the real driver: TPE over a float
    knob (every proposal new), ASHA over 2 windows, MLflow into sqlite, the report."""
    from ray import tune

    uri = f"sqlite:///{scratch}/mlflow.db"
    sweep = Sweep(name="tool-cost-driver", trainable=trivial_trainable, base=TrivialConfig(),
                  metrics=_small_metrics("score", ""), space={"x": tune.uniform(0.0, 1.0)},
                  objectives=[Objective("score", "max")], num_samples=counts.driver_trials, tracking_uri=uri,
                  storage_path=os.path.join(scratch, "ray"))
    with counted_errors(("mlflow", "sqlalchemy", "alembic", "accelsweep")) as logged:
        clock = run_timed(sweep)
    trials = clock.trials
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(sweep.name)
    runs = client.search_runs([experiment.experiment_id], max_results=10 * counts.driver_trials + 10)
    children = {r.info.run_id: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    unwritten = [r.number for r in trials
                 if r.run_id not in children or children[r.run_id].info.status != "FINISHED"
                 or "wall_s" not in children[r.run_id].data.metrics]
    say(f"[4] {len(trials)} trials in {clock.wall_s:.1f} s, {clock.slots} at a time")
    return {"clock": clock, "logged_errors": list(logged), "unwritten_runs": unwritten}


def figures_driver(measured: dict) -> list[Figure]:
    clock = measured["clock"]
    trials = clock.trials
    loop_s = [r.result.get("loop_s", 0.0) for r in trials]
    per_trial = slot_seconds_per_trial(clock.wall_s, clock.slots, loop_s, len(trials))
    first_start = trials[0].created_at if trials else math.nan
    last_end = max(trial_end(r) for r in trials) if trials else math.nan
    split = {"before_first_trial_s": first_start - clock.called, "trials_phase_s": last_end - first_start,
             "after_last_trial_s": clock.returned - last_end,
             "mean_overhead_s_metric": statistics.mean(r.result.get("overhead_s", math.nan) for r in trials)}
    phase_per_trial = slot_seconds_per_trial(split["trials_phase_s"], clock.slots, loop_s, len(trials))
    statuses = {status: sum(r.status == status for r in trials) for status in {r.status for r in trials}}
    errors = len(measured["unwritten_runs"]) + len(measured["logged_errors"])
    return [
        figure("4a", per_trial,
               note=f"{len(trials)} trivial trials, {clock.slots} slots, sweep wall {clock.wall_s:.1f} s: "
                    f"{split['before_first_trial_s']:.1f} s before the first trial, {split['trials_phase_s']:.1f} s "
                    f"of trials ({phase_per_trial:.2f} slot-s per trial), {split['after_last_trial_s']:.1f} s after "
                    f"the last (summary, report); trials' own overhead_s {split['mean_overhead_s_metric']:.2f} s mean",
               detail={**split, "wall_s": clock.wall_s, "slots": clock.slots, "trials": len(trials),
                       "statuses": statuses, "trials_phase_slot_s_per_trial": phase_per_trial}),
        figure("4b", errors,
               note=f"{len(measured['unwritten_runs'])} trial runs missing or not FINISHED with wall_s, "
                    f"{len(measured['logged_errors'])} errors logged",
               detail={"unwritten_runs": measured["unwritten_runs"], "logged_errors": measured["logged_errors"][:20]}),
    ]


# --------------------------------------------------------------------------- figure 5


def measure_concurrency(counts: Counts, scratch: str, say: Callable[[str], None]) -> dict:
    from ray import tune

    sweep = Sweep(name="tool-cost-sleep", trainable=sleeping_trainable, base=SleepConfig(seconds=counts.sleep_s),
                  metrics=_small_metrics("slept_s", "s"), space={"seconds": tune.choice([counts.sleep_s])},
                  objectives=[Objective("slept_s", "max")], report=False,
                  tracking_uri=f"sqlite:///{scratch}/mlflow.db", storage_path=os.path.join(scratch, "ray"))
    clock = run_timed(remeasure(sweep, [{"seconds": counts.sleep_s}], times=counts.sleepers))
    failed = failed_trials(clock)
    if failed:
        raise RuntimeError("; ".join(failed))
    say(f"[5] {len(clock.trials)} sleeping trials in {clock.wall_s:.1f} s")
    return {"clock": clock}


def figure_concurrency(measured: dict) -> Figure:
    trials = measured["clock"].trials
    intervals = [(r.created_at, trial_end(r)) for r in trials]
    concurrency = effective_concurrency(intervals)
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    slept = sum(r.result["loop_s"] for r in trials)
    return figure("5", concurrency,
                  note=f"{len(trials)} trials sleeping {trials[0].result['slept_s']:g} s, 1 CPU each, on "
                       f"{SLOTS} CPUs: their wall times sum to {sum(e - s for s, e in intervals):.1f} s, taken in "
                       f"{span:.1f} s (their sleep alone {slept:.1f} s: {slept / span:.2f} at once); at most "
                       f"{peak_overlap(intervals)} ran at one moment",
                  detail={"trials": len(trials), "span_s": span, "sum_wall_s": sum(e - s for s, e in intervals),
                          "sum_sleep_s": slept, "sleep_over_span": slept / span,
                          "peak_overlap": peak_overlap(intervals), "slots": measured["clock"].slots})


# --------------------------------------------------------------------------- figure 6


def compile_cache_use(cache_dir: str) -> tuple[dict, Optional[str], str]:
    """How figure 6's sweeps point their compile cache at ``cache_dir``: (config changes,
    a variable to set before Ray starts, the words for it). The sweep's own cache is the
    config's ``compile_cache`` field (trainables/compile_cache.py); without that field,
    inductor's own directory variable (torch/_inductor/runtime/cache_dir_utils.py:
    cache_dir() reads TORCHINDUCTOR_CACHE_DIR), which Ray's trial processes inherit when
    it is set before ray.init."""
    if "compile_cache" in TrialConfig.generic_fields():
        return {"compile_cache": cache_dir}, None, "the sweep's (TrialConfig.compile_cache), empty before sweep 1"
    return {}, "TORCHINDUCTOR_CACHE_DIR", "inductor's (TORCHINDUCTOR_CACHE_DIR), empty before sweep 1"


def measure_compile(counts: Counts, scratch: str, say: Callable[[str], None], cache_changes: Mapping) -> dict:
    """The same torch.compile sweep twice (same store, same storage path), its trials in
    new processes each time (Tune ends a sweep's trial processes with it); the cache was
    empty before the first."""
    from ray import tune

    config = main_job_config(QUICK).replace(torch_compile="inductor", batch_size=counts.compile_batches[0],
                                            **cache_changes)
    marks_dir = os.path.join(scratch, "marks")
    os.makedirs(marks_dir, exist_ok=True)
    runs = []
    for index in (1, 2):
        sweep = dataclasses.replace(measuring_sweep("tool-cost-compile", config, scratch, marks_dir),
                                    space={"batch_size": tune.choice(list(counts.compile_batches))})
        clock = run_timed(remeasure(sweep, [{"batch_size": b} for b in counts.compile_batches], times=1,
                                    name="tool-cost-compile"), marks_dir)
        failed = failed_trials(clock)
        if failed:
            raise RuntimeError(f"sweep {index}: " + "; ".join(failed))
        runs.append(clock)
        say(f"[6] sweep {index}: compile " + ", ".join(f"{r.result['compile_s']:.1f}" for r in clock.trials) + " s")
    return {"runs": runs, "config": config, "batches": list(counts.compile_batches)}


def figure_compile(measured: dict, cache: str) -> Figure:
    first, second = ([r.result for r in clock.trials] for clock in measured["runs"])
    compile_1, compile_2 = sum(r["compile_s"] for r in first), sum(r["compile_s"] for r in second)
    cache_figures = [{k: v for k, v in r.items() if "cache" in k and isinstance(v, (int, float))}
                     for r in first + second]

    def graphs(results, what):  # the FX graph cache's hits or misses over a sweep's trials
        counts = [r.get(f"fxgraph_cache_{what}", math.nan) for r in results]
        return sum(count for count in counts if math.isfinite(count))

    hits = (f"; FX graph cache hits/misses: sweep 1 {graphs(first, 'hits'):.0f}/{graphs(first, 'misses'):.0f}, "
            f"sweep 2 {graphs(second, 'hits'):.0f}/{graphs(second, 'misses'):.0f}"
            if any("fxgraph_cache_hits" in r for r in first + second) else "")
    return figure("6", compile_2 / compile_1 if compile_1 else math.nan,
                  note=f"{measured['config'].to_dict()['model']}, torch.compile inductor, batch "
                       f"{', '.join(str(b) for b in measured['batches'])}: compile "
                       f"{compile_1:.1f} s then {compile_2:.1f} s; cache: {cache}{hits}",
                  detail={"compile_s_sweep_1": [r["compile_s"] for r in first],
                          "compile_s_sweep_2": [r["compile_s"] for r in second],
                          "first_step_s_sweep_1": [r.get("first_step_s") for r in first],
                          "first_step_s_sweep_2": [r.get("first_step_s") for r in second],
                          "cache_metrics": cache_figures, "cache": cache})


# --------------------------------------------------------------------------- the machine's other work


def cpu_ticks(before: Mapping[int, ProcessStat], after: Mapping[int, ProcessStat], pids) -> dict[int, int]:
    """CPU ticks each of ``pids`` used between two tables (those alive in both)."""
    return {pid: max(0, after[pid].cpu_ticks - before[pid].cpu_ticks) for pid in pids if pid in before and pid in after}


def others_cpu_ticks(before: Mapping[int, ProcessStat], after: Mapping[int, ProcessStat], ours: set[int]) -> int:
    """CPU ticks processes not ours used between two tables (those alive in both)."""
    return sum(cpu_ticks(before, after, set(after) - ours).values())


def tool_cores(samples: Sequence[tuple], start: float, end: float, hertz: float) -> dict:
    """What our own processes used (cores) between ``start`` and ``end``, less the
    busiest one (the training process): the tool's processes beside a trial's loop (Ray's
    daemons, Tune's driver, MLflow writes) or, beside a plain process, the idle driver.
    ``samples``: NeighbourWatch's (from, to, {pid: (name, ticks)}), each counted by its
    overlap with the interval."""
    by_pid: dict[int, float] = {}
    names: dict[int, str] = {}
    for begin, finish, ticks in samples:
        overlap = min(finish, end) - max(begin, start)
        if overlap <= 0 or finish <= begin:
            continue
        for pid, (name, used) in ticks.items():
            by_pid[pid] = by_pid.get(pid, 0.0) + used * overlap / (finish - begin)
            names[pid] = name
    if not by_pid or end <= start:
        return {"cores": math.nan, "by_process": {}}
    busiest = max(by_pid, key=by_pid.get)
    by_name: dict[str, float] = {}
    for pid, used in by_pid.items():
        if pid != busiest:
            by_name[names[pid]] = by_name.get(names[pid], 0.0) + used / hertz / (end - start)
    return {"cores": sum(by_name.values()), "training_process": names[busiest],
            "by_process": dict(sorted(by_name.items(), key=lambda item: -item[1])[:6])}


class NeighbourWatch:
    """What other processes (another session's tests, a CI run) used of the CPUs while a
    figure was measured, sampled each second: on 2 cores a neighbour's one busy thread
    slows a 2-thread trial several times over (its threads wait for each other), so a
    figure taken beside one is noise. The load average cannot say it: it counts ours.
    It keeps what our own processes used, second by second (``samples``, for tool_cores)."""

    def __init__(self, period_s: float = 1.0):
        import threading

        self.period_s, self.ticks, self.seconds = period_s, 0, 0.0
        self.busiest_cores = 0.0
        self.samples: list[tuple[float, float, dict]] = []
        self.hertz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        before, then = process_table(), time.monotonic()
        while not self._stop.wait(self.period_s):
            after, now = process_table(), time.monotonic()
            ours = descendants(after, [os.getpid()])  # Ray's processes (ray.init's) and the plain ones
            ticks = others_cpu_ticks(before, after, ours)
            self.samples.append((then, now, {pid: (after[pid].name, used)
                                             for pid, used in cpu_ticks(before, after, ours).items() if used}))
            self.ticks += ticks
            self.seconds += now - then
            self.busiest_cores = max(self.busiest_cores, ticks / self.hertz / (now - then))
            before, then = after, now

    def __enter__(self) -> "NeighbourWatch":
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict:
        """Cores other processes used: the mean over the figure, the most in one second."""
        mean = self.ticks / self.hertz / self.seconds if self.seconds else math.nan
        return {"others_cores_mean": mean, "others_cores_max_1s": self.busiest_cores, "seconds": self.seconds}


# --------------------------------------------------------------------------- the run


FIGURE_GROUPS = ("1", "2", "4", "5", "6")  # 3 comes from 1 and 2
FIGURES_OF_GROUP = {"1": ("1",), "2": ("2",), "4": ("4a", "4b"), "5": ("5",), "6": ("6",)}


def not_measured(key: str, error: BaseException) -> Figure:
    return figure(key, math.nan, error=f"not measured: {type(error).__name__}: {error}")


def run_benchmark(counts: Counts, groups: Sequence[str], scratch: str, say: Callable[[str], None]) -> list[Figure]:
    """Measure the figures of ``groups``, each beside a NeighbourWatch; a figure whose
    measurement fails is one not measured, with why, and the others still run."""
    import ray

    figures: list[Figure] = []

    def step(group: str, measure: Callable[[str], Any],
             build: Callable[[Any, NeighbourWatch], list[Figure]]) -> tuple[Any, dict]:
        if group not in groups:
            return None, {}
        with NeighbourWatch() as watch:
            try:
                folder = os.path.join(scratch, f"figure-{group}")  # its own MLflow store and Ray results
                os.makedirs(folder, exist_ok=True)
                data = measure(folder)
                made = build(data, watch)
            except Exception as error:  # noqa: BLE001 - a figure that fails is said; the others still run
                data, made = None, [not_measured(key, error) for key in FIGURES_OF_GROUP[group]]
        for made_figure in made:
            made_figure.others_cpu = watch.summary()
        figures.extend(made)
        return data, watch.summary()

    def repeated(folder: str) -> dict:
        found = measure_repeats(counts, folder, say)
        if repeat_figures(found["clock"])["trial_to_trial_cv"] > TARGETS["2"][3] and counts.longer_window_factor:
            found["longer"] = measure_repeats(counts, folder + "-longer", say, counts.longer_window_factor)
        return found

    overhead, overhead_busy = step("1", lambda folder: measure_overhead_pairs(counts, folder, say),
                                   lambda data, watch: [figure_overhead(data, watch)])
    cache_dir = os.path.join(scratch, "compile-cache")
    cache_changes, cache_variable, cache = compile_cache_use(cache_dir)
    if cache_variable:  # set before Ray starts: its trial processes inherit it
        os.environ[cache_variable] = cache_dir
    # "local": a new instance even where a `ray start` cluster runs (ray.init with no address joins it).
    ray.init(address="local", num_cpus=SLOTS, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        repeats, repeats_busy = step("2", repeated, lambda data, _: [figure_repeatability(data, data.get("longer"))])
        for per_trial in figures_per_trial(overhead, repeats):
            per_trial.others_cpu = overhead_busy if per_trial.key == "3a" and overhead else repeats_busy
            figures.append(per_trial)
        step("5", lambda folder: measure_concurrency(counts, folder, say), lambda data, _: [figure_concurrency(data)])
        step("4", lambda folder: measure_driver(counts, folder, say), lambda data, _: figures_driver(data))
        step("6", lambda folder: measure_compile(counts, folder, say, cache_changes),
             lambda data, _: [figure_compile(data, cache)])
    finally:
        ray.shutdown()
    return sorted(figures, key=lambda f: f.key)


def default_out(quick: bool) -> str:
    """benchmarks/data/tool_cost_<cpu model>_<cpus>cpu.json; a --quick run's goes to the
    temporary directory (it is not a figure to quote)."""
    words = re.sub(r"\((r|tm)\)|processor|cpu|\d+-core|@.*", "", cpu_model_name().lower())
    name = "_".join(re.findall(r"[a-z0-9]+", words)[:3]) or "machine"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    file = f"tool_cost_{name}_{cpus}cpu{'_quick' if quick else ''}.json"
    if quick:
        return os.path.join(tempfile.gettempdir(), file)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", file)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    # search_efficiency loads Ray Tune and Optuna: not in the trials, which import this module
    from benchmarks.search_efficiency import _write_json, describe_machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every count shrunk (vit-micro): a test, not a figure")
    parser.add_argument("--out", default=None, help="the JSON file (default benchmarks/data/tool_cost_<machine>.json; "
                                                    "--quick: in the temporary directory)")
    parser.add_argument("--figures", default=",".join(FIGURE_GROUPS),
                        help="which to measure, of 1,2,4,5,6 (3 comes with 1 and 2; default all)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (MLflow stores, Ray results)")
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.figures.split(",") if g.strip()]
    for group in groups:
        if group not in FIGURE_GROUPS:
            raise ConfigError("--figures", f"a comma-separated list of {', '.join(FIGURE_GROUPS)}", args.figures)
    counts = QUICK if args.quick else FULL
    out = args.out or default_out(args.quick)
    say = lambda line: print(line, flush=True)  # noqa: E731
    started = time.monotonic()
    machine = describe_machine()
    report: dict[str, Any] = {"format": FORMAT, "command": " ".join(["benchmarks/tool_cost.py", *(argv or [])]),
                              "quick": args.quick, "counts": dataclasses.asdict(counts), "machine": machine,
                              "started_utc": machine["date_utc"]}
    scratch = tempfile.mkdtemp(prefix="tool_cost-")
    say(f"Measuring figures {', '.join(groups)} ({'quick' if args.quick else 'full'}); scratch {scratch}")
    try:
        figures = run_benchmark(counts, groups, scratch, say)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    machine["load_average_1m_after"] = os.getloadavg()[0]
    report["elapsed_s"] = time.monotonic() - started
    report["figures"] = [figure.to_dict() for figure in figures]
    _write_json(report, out)
    print(format_table(report))
    print(f"JSON: {out}")
    return report


if __name__ == "__main__":
    # Run as a script, the repository root is not on the path: benchmarks.search_efficiency
    # (describe_machine, _write_json) is imported from it.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    main_guard(lambda: main(sys.argv[1:]))

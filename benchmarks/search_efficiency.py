"""Search efficiency, measured: how many device-seconds a searcher spends before the
config it would name best is within 5% of the best config of the whole grid.

    # 1. Measure every config of a small CPU grid once (needs a quiet machine; ~48 configs)
    python benchmarks/search_efficiency.py record --out benchmarks/data/cpu_vit_tiny.json
    python benchmarks/search_efficiency.py record --tiny --out /tmp/tiny.json   # vit-micro, seconds
    # 2. Replay searchers against that table, each trial at its recorded cost
    python benchmarks/search_efficiency.py replay benchmarks/data/cpu_vit_tiny.json --seeds 20

Why a table and a replay: a searcher's cost is the trials it runs, and a trial's cost
is fixed by its config. Recording every config once and replaying the searchers
against the recording compares them on the same measurements, over many seeds, for
the price of one grid. A replayed trial costs what the recording says it cost: its
full wall time, or its time up to the window where ASHA stops it, or its time up to
its second step where the rejection rule stops it.

The recording runs the configs one after another in one process (as the tool reuses a
trial's process), in a seeded shuffled order, so drift of the machine (heat, a
neighbour's load) is not aligned with any knob.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform as host
import random
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

if __name__ == "__main__":  # run as a script: benchmarks.* is imported from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from accelsweep.sweeps.driver.define.cli import main_guard  # noqa: E402
from accelsweep.sweeps.driver.define.plan import startup_trials  # noqa: E402
from accelsweep.sweeps.driver.run.searchers import MAX_REPEATED_PROPOSALS  # noqa: E402
from accelsweep.sweeps.neuron_vit import DEFAULT_SAMPLES, base_config, batch_sizes  # noqa: E402
from accelsweep.trainables.environment import package_versions  # noqa: E402
from accelsweep.trainables.errors import ConfigError, positive_float, positive_int  # noqa: E402
from accelsweep.trainables.loop.rejection import FIRST_STEP_ALLOWANCE, REJECT_RATIO  # noqa: E402
from accelsweep.trainables.loop.train_loop import run_training  # noqa: E402
from accelsweep.trainables.platforms.cpu import cpu_model_name  # noqa: E402
from accelsweep.trainables.workloads.base import load_workload  # noqa: E402
from benchmarks.concurrent_replay import (CONCURRENT_POLICIES, TOOL_POLICY, compare_at,  # noqa: E402
                                          concurrency_json, format_concurrency_report)
from benchmarks.guess_replay import compare_guess, format_guess_report, table_guess  # noqa: E402
from benchmarks.recorded_grid import (METRIC, TOLERANCE, Policy, Row, Searcher, Table, make_asha,  # noqa: E402
                                      make_searcher, rejection)
from benchmarks.warm_replay import compare_warm, format_warm_report, plan_warm, warm_json  # noqa: E402

TARGET_FRACTION = 0.30  # issue 14: TPE + early stopping reaches it in <= 30% of the grid's device-seconds
# Each trial holds this many CPUs (threads 1 or 2 within them): the main job's CPU trial
# owns the 2-core node it runs on (sweeps/neuron_vit.py: cpus_per_worker = cpus).
CPUS = 2
# /proc/cpuinfo names (x86 "flags", aarch64 "Features") of the vector and matrix
# extensions bf16 and fp32 training speed depends on; the file records which are present.
RELEVANT_CPU_FLAGS = ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                      "amx_bf16", "amx_int8", "asimd", "bf16", "sve", "sve2", "i8mm")


# --------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Grid:
    """The configs a recording measures: the main job's base config with every
    combination of ``space``'s choices."""

    name: str
    base: Any  # TrialConfig: model, measurement settings, everything not searched
    space: Mapping[str, tuple]  # knob -> choices, in order

    def points(self) -> list[dict]:
        names = list(self.space)
        return [dict(zip(names, values)) for values in itertools.product(*self.space.values())]

    def baseline(self) -> dict:
        """The base config's own values of the searched knobs (TPE runs it first)."""
        flat = self.base.to_dict()
        return {name: flat[name] for name in self.space}

    def config(self, point: Mapping[str, Any]):
        return self.base.replace(**point)


GRIDS = ("main", "large", "tiny")


def main_job_grid(tiny: bool = False, name: str = "main") -> Grid:
    """The main job's knobs (sweeps/neuron_vit.py's make_space on a CPU, less the loader
    workers, channels_last and torch.compile) at its measurement settings (base_config:
    vit-tiny, 3 warm-up steps, 3 windows of >= 5 steps and >= 2 s): 48 configs. ``large``:
    with the loader workers (0 or 2) and channels_last too, 192 configs (issue 31's larger
    space; torch.compile and the allocator stay out: a compile's cost depends on the caches
    earlier configs of one recording process left, and an allocator is preloaded into a
    process at its start). ``tiny``: the smoke settings (vit-micro, short windows) and four
    configs, for tests and a quick try."""
    tiny = tiny or name == "tiny"
    if (os.cpu_count() or 1) < CPUS:
        raise ConfigError("CPUs of this machine", f">= {CPUS} (each trial holds {CPUS})", os.cpu_count())
    base = base_config("cpu", smoke=tiny, cpus=CPUS, instance_type=None, seed=0)
    if tiny:
        return Grid("tiny", base, {"batch_size": (8, 16), "precision": ("fp32", "bf16"), "threads": (CPUS,),
                                   "patch_embed": ("conv",)})
    space = {"batch_size": tuple(batch_sizes("cpu", smoke=False)), "precision": ("fp32", "bf16-autocast", "bf16"),
             "threads": (1, CPUS), "patch_embed": ("conv", "linear")}
    if name == "large":
        space.update({"num_workers": (0, 2), "channels_last": (False, True)})
    return Grid(name, base, space)


# --------------------------------------------------------------------------- record

def describe_machine() -> dict:
    """What the figures were measured on, without the host's name."""
    import torch

    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {
        "cpu_model": cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_flags": [flag for flag in RELEVANT_CPU_FLAGS if flag in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # oneDNN kept below the CPU's ISA (e.g. AVX2 on an AVX-512 bf16 CPU: bf16 emulated).
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "os": f"{host.system()} {host.release()}",
        "machine": host.machine(),
        "versions": package_versions(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        # A busy machine makes every figure slower and noisier: say how busy it was.
        "load_average_1m_before": os.getloadavg()[0],
    }


def measure_config(config) -> dict:
    """Train one config with the library's loop; its row of the table. A failure is a
    row with its error (and what it measured before it)."""
    windows: list[dict] = []
    last: dict = {}
    start = time.perf_counter()

    def report(result: dict) -> None:
        windows.append({"window": result["windows_done"], METRIC: result[METRIC],
                        "window_throughput_samples_per_s": result["window_throughput_samples_per_s"],
                        "since_start_s": time.perf_counter() - start,
                        "loop_s": result["loop_s"], "measured_s": result["measured_s"]})
        last.update(result)

    error = None
    try:
        # No limits given and none set (outside a sweep's trial): nothing is rejected, every
        # config runs to its end.
        run_training(config, report=report)
    except Exception as failure:  # a failed config is a result: its row says why
        error = f"{type(failure).__name__}: {failure}"
    wall_s = time.perf_counter() - start
    warmup_step_s, source = _warmup_step_s(last, windows, config.warmup_steps)
    complete = error is None and len(windows) == config.windows
    return {
        "batch_size": config.batch_size,
        METRIC: last[METRIC] if complete else None,
        "windows": windows,
        "setup_s": last.get("setup_s"),
        "first_step_s": last.get("first_step_s"),
        "warmup_step_s": warmup_step_s,
        "warmup_step_source": source,
        "compile_s": last.get("compile_s"),
        "step_time_p50_s": last.get("step_time_p50_s"),
        # How noisy the figure is: the windows' spread and the machine's own speed (probed
        # between windows) and its spread; a loaded machine shows here.
        "throughput_cv": last.get("throughput_cv"),
        "host_probe_s": last.get("host_probe_s"),
        "host_cv": last.get("host_cv"),
        "wall_s": wall_s,
        "device": last.get("device"),
        "error": error,
    }


def _warmup_step_s(result: Mapping, windows: Sequence[Mapping], warmup_steps: int) -> tuple[Optional[float], str]:
    """The mean warm-up step after the first: the loop's own figure when its result has
    one; else derived from the first window's report (the loop's time before that
    window's measured steps, less the first step, over the other warm-up steps)."""
    if result.get("warmup_step_s") is not None:
        return result["warmup_step_s"], "loop"
    if not windows or result.get("first_step_s") is None:
        return None, "none"
    if warmup_steps < 2:
        return result["first_step_s"], "first step (warmup_steps is 1)"
    first = windows[0]
    return (first["loop_s"] - first["measured_s"] - result["first_step_s"]) / (warmup_steps - 1), "derived"


def record(grid: Grid, out: str, order_seed: int = 0, progress: Callable[[str], None] = print) -> dict:
    """Measure every config of ``grid`` once, in one process, in a seeded shuffled
    order; write the table to ``out`` after each config (a stopped recording keeps what
    it measured) and return it."""
    import importlib

    # The modules every trial needs are loaded once, before the first trial, so their
    # import is not charged to whichever config happens to come first.
    started = time.perf_counter()
    for module in ("torch", *load_workload(grid.base.workload).imports):
        importlib.import_module(module)
    points = grid.points()
    random.Random(order_seed).shuffle(points)
    table = {
        "format": 1,
        "grid": grid.name,
        "machine": describe_machine(),
        "base_config": grid.base.to_dict(),
        "space": {name: list(choices) for name, choices in grid.space.items()},
        "baseline": grid.baseline(),
        "order_seed": order_seed,
        "imports_s": time.perf_counter() - started,
        "rows": [],
    }
    for index, point in enumerate(points, 1):
        row = {"point": point, "order": index, **measure_config(grid.config(point))}
        table["rows"].append(row)
        table["machine"]["load_average_1m_after"] = os.getloadavg()[0]
        _write_json(table, out)
        outcome = row["error"] or f"{row[METRIC]:.1f} samples/s"
        progress(f"[{index}/{len(points)}] {_describe_point(point)}: {outcome}, {row['wall_s']:.1f} s")
    return table


def _write_json(data: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w") as out:
        json.dump(data, out, indent=1)
    os.replace(partial, path)


def _describe_point(point: Mapping[str, Any]) -> str:
    return " ".join(f"{name}={value}" for name, value in point.items())


# --------------------------------------------------------------------------- replay

TARGET_POLICY = "tpe+es"
POLICIES = (
    Policy(TARGET_POLICY, "tpe", asha=True, reject=True),
    Policy("tpe+asha", "tpe", asha=True),
    Policy("tpe+reject", "tpe", reject=True),
    Policy("tpe", "tpe"),
    Policy("random", "random"),
    Policy("grid", "grid"),
)
POLICY_WORDS = {
    TARGET_POLICY: "TPE + early stopping (ASHA and the rejection rule)",
    "tpe+asha": "TPE + ASHA only",
    "tpe+reject": "TPE + rejection rule only",
    "tpe": "TPE, every trial to its end",
    "random": "random search (Optuna RandomSampler)",
    "grid": "the grid, in a seeded random order",
}


@dataclass(frozen=True)
class Trial:
    """One proposal and what it cost. ``outcome``: completed, failed, asha@<window>,
    rejected, or dedup (a config measured before: not run, not a trial)."""

    key: tuple
    outcome: str
    cost_s: float
    told: Optional[float]  # the value the searcher was told (None: a failure)


@dataclass(frozen=True)
class Replay:
    policy: str
    seed: int
    reached: bool  # False: never within the tolerance; reach_s is then the grid's total
    reach_s: float  # device-seconds when the named best was first within the tolerance
    reach_trials: int  # trials run by then
    spent_s: float  # device-seconds of every trial run
    trials: tuple[Trial, ...]

    @property
    def trials_run(self) -> int:
        return sum(trial.outcome != "dedup" for trial in self.trials)


def run_trial(row: Row, trial_id: str, asha, best_so_far: Optional[float], reject_ratio: Optional[float],
              windows: int, warmup_steps: int) -> tuple[str, float, Optional[float], bool]:
    """One trial of ``row`` (planned ``windows``) under the early stopping in force:
    (outcome, device-seconds, value told to the searcher, whether it measured a window).
    ``asha``: the scheduler, called as Tune calls it (tune_controller.py): each report
    goes to on_trial_result, and the last one, when the trial ends or is stopped, to
    on_trial_complete."""
    from ray.tune.schedulers import TrialScheduler

    trial = SimpleNamespace(trial_id=trial_id)
    if asha is not None:
        asha.on_trial_add(None, trial)
    rejected = rejection(row, best_so_far, reject_ratio, warmup_steps) if reject_ratio is not None else None
    if rejected is not None:
        stage, spent, projection = rejected
        if asha is not None:
            # The rejected trial reports its projection once, and Tune numbers every
            # report: plain ASHA records it at the first rung like any first window.
            result = {"training_iteration": 1, METRIC: projection}
            asha.on_trial_result(None, trial, result)
            asha.on_trial_complete(None, trial, result)
        return f"rejected ({stage})", spent, projection, False
    last = None
    for window in row.windows if asha is not None else ():
        last = {"training_iteration": window.index, METRIC: window.throughput}
        decision = asha.on_trial_result(None, trial, last)
        if decision == TrialScheduler.STOP and window.index < windows:  # at the last window it ends anyway
            asha.on_trial_complete(None, trial, last)
            return f"asha@{window.index}", window.since_start_s, window.throughput, True
    if last is not None and row.throughput is not None:
        asha.on_trial_complete(None, trial, last)
    if row.throughput is None:
        return "failed", row.wall_s, None, False
    return "completed", row.wall_s, row.throughput, True


def replay(table: Table, policy: Policy, seed: int, reject_ratio: Optional[float] = None, num_samples: int = 24,
           tolerance: float = TOLERANCE, until_reached: bool = True, searcher: Optional[Searcher] = None) -> Replay:
    """One search of ``table``, trials one at a time at their recorded costs, until the
    config it would name best (the best value it measured) is truly within ``tolerance``
    of the grid's best (``until_reached``), or the grid's worth of trials is run.
    ``reject_ratio``: the rejection rule's, when ``policy.reject`` (default REJECT_RATIO)."""
    if policy.reject and reject_ratio is None:
        reject_ratio = REJECT_RATIO
    searcher = searcher or make_searcher(policy.sampler, table, seed, num_samples)
    asha = make_asha(table.windows) if policy.asha and table.windows >= 2 else None
    told: dict[tuple, Optional[float]] = {}  # each config run so far -> the value its searcher was told
    measured: dict[tuple, float] = {}  # configs that measured a window -> their value
    trials: list[Trial] = []
    spent_s, run = 0.0, 0
    reach_s, reach_trials = None, 0
    repeated = 0  # proposals in a row of configs run before
    while run < table.size and not (until_reached and reach_s is not None):
        handle, point = searcher.ask()
        key = table.key(point)
        if key in told:  # the tool's dedup (FailureAwareOptunaSearch): the recorded value, no trial
            searcher.tell(handle, told[key])
            trials.append(Trial(key, "dedup", 0.0, told[key]))
            repeated += 1
            if repeated >= MAX_REPEATED_PROPOSALS:
                break  # the tool's searcher says the space is searched out: the sweep ends
            continue
        repeated = 0
        best_so_far = max(measured.values(), default=None)
        outcome, cost_s, value, has_window = run_trial(table.rows[key], str(run), asha, best_so_far,
                                                       reject_ratio if policy.reject else None, table.windows,
                                                       table.warmup_steps)
        run += 1
        spent_s += cost_s
        told[key] = value
        if has_window:
            measured[key] = value
        searcher.tell(handle, value)
        trials.append(Trial(key, outcome, cost_s, value))
        named = max(measured, key=measured.get) if measured else None
        if reach_s is None and named is not None and table.within_tolerance(named, tolerance):
            reach_s, reach_trials = spent_s, run
    reached = reach_s is not None
    return Replay(policy.name, seed, reached, reach_s if reached else table.total_s,
                  reach_trials if reached else run, spent_s, tuple(trials))


@dataclass(frozen=True)
class Summary:
    policy: str
    median_s: float
    p25_s: float
    p75_s: float
    fraction: float  # median_s over the grid's total
    median_trials: float
    not_reached: int
    seeds: int
    early_stops: float  # trials stopped early (ASHA or rejected) before reaching, mean per seed

    def position(self, random_median_s: float, grid_total_s: float) -> float:
        """Where the median lands between random search's median (0) and the full
        grid's cost (1); below 0 is cheaper than random search."""
        span = grid_total_s - random_median_s
        return (self.median_s - random_median_s) / span if span > 0 else float("nan")


def summarize(table: Table, replays: Sequence[Replay]) -> Summary:
    costs = np.array([r.reach_s for r in replays])
    stops = [sum(t.outcome.startswith(("asha", "rejected")) for t in r.trials) for r in replays]
    return Summary(replays[0].policy, float(np.median(costs)), float(np.percentile(costs, 25)),
                   float(np.percentile(costs, 75)), float(np.median(costs)) / table.total_s,
                   float(np.median([r.reach_trials for r in replays])), sum(not r.reached for r in replays),
                   len(replays), float(np.mean(stops)))


def compare(table: Table, seeds: int, reject_ratio: Optional[float] = None, num_samples: int = 24,
            policies: Sequence[Policy] = POLICIES) -> dict[str, Summary]:
    return {policy.name: summarize(table, [replay(table, policy, seed, reject_ratio, num_samples)
                                           for seed in range(seeds)])
            for policy in policies}


# --------------------------------------------------------------------------- the threshold

def rejection_evidence(table: Table, tolerance: float = TOLERANCE) -> dict[str, float]:
    """What REJECT_RATIO should be chosen from: how far each config's projection after its
    second step is from its full run, and how much slower than the best the configs are."""
    rows = [row for row in table.rows.values() if row.throughput is not None and row.projection is not None]
    if not rows:
        return {"configs": 0}
    ratios = np.array([row.projection / row.throughput for row in rows])
    # The first step against a steady one (the full run's mean step): what the first
    # step's allowance (FIRST_STEP_ALLOWANCE deadlines) must cover.
    first_steps = np.array([row.first_step_s * row.throughput / row.batch_size for row in rows])
    best = table.best
    near_best = [row for row in rows if row.throughput >= (1 - tolerance) * best]
    return {
        "configs": len(rows),
        "projection_over_final_min": float(ratios.min()),
        "projection_over_final_median": float(np.median(ratios)),
        "projection_over_final_max": float(ratios.max()),
        "first_step_over_steady_min": float(first_steps.min()),
        "first_step_over_steady_median": float(np.median(first_steps)),
        "first_step_over_steady_max": float(first_steps.max()),
        "slower_2x": sum(row.throughput * 2 <= best for row in rows),
        "slower_3x": sum(row.throughput * 3 <= best for row in rows),
        "slower_5x": sum(row.throughput * 5 <= best for row in rows),
        # With the true best as best-so-far (the strictest case), a ratio above this never
        # rejects a config within the tolerance of the best.
        "smallest_safe_ratio": max(best / row.projection for row in near_best),
    }


def rejected_once_best_known(table: Table, ratio: float) -> int:
    return sum(row.projection is not None and row.projection < table.best / ratio for row in table.rows.values())


# --------------------------------------------------------------------------- output

def format_report(table: Table, summaries: Mapping[str, Summary], reject_ratio: float, seeds: int,
                  num_samples: int) -> str:
    machine = table.machine
    lines = [f"Table: {table.size} configs, {sum(r.throughput is None for r in table.rows.values())} failed; "
             f"grid total {table.total_s:.1f} device-s; best {table.best:.1f} samples/s.",
             f"Machine: {machine.get('cpu_model', '?')}, {machine.get('usable_cpus', '?')} CPUs, "
             f"flags {' '.join(machine.get('cpu_flags', [])) or 'none listed'}, torch "
             f"{machine.get('versions', {}).get('torch', '?')}, recorded {machine.get('date_utc', '?')} UTC "
             f"(load {machine.get('load_average_1m_before', float('nan')):.2f} before, "
             f"{machine.get('load_average_1m_after', float('nan')):.2f} after).",
             f"Replays: {seeds} seeds each; trials one at a time at their recorded device-seconds; reject ratio "
             f"{reject_ratio:g}; a config proposed again is not re-run (told its value, no cost; "
             f"the search ends after {MAX_REPEATED_PROPOSALS} such proposals in a row, as the tool's does).",
             f"TPE: the baseline first, {startup_trials(SimpleNamespace(num_samples=num_samples))} random start-up "
             f"trials (num_samples {num_samples}). ASHA as the tool sets it (grace 1 window, reduction 2, max_t "
             f"{table.windows} windows). Rejection: trainables/loop/rejection.py's rule on the recorded step times (first "
             "step, warm-up, first window); a rejected trial's projection is told to TPE and recorded at ASHA's "
             "first rung.",
             f"Reached: the config the searcher would name best is within {TOLERANCE:.0%} of the grid's best "
             f"(its full-run throughput). A replay that never reaches it in a grid's worth of trials counts as "
             f"the grid total ('not reached').",
             "position: where the median lands between random search's median (0) and the full grid's cost "
             "(1); below 0 is cheaper than random search. Random search and the grid in random order are the "
             "same search in expectation (configs in random order, none twice): their gap is seed noise.", ""]
    header = (f"{'searcher':<12} {'median s':>9} {'of grid':>8} {'p25 s':>8} {'p75 s':>8} {'trials':>7} "
              f"{'ES stops':>8} {'position':>8} {'not reached':>11}")
    lines += [header, "-" * len(header)]
    random_median = summaries["random"].median_s if "random" in summaries else float("nan")
    for name, s in summaries.items():
        lines.append(f"{name:<12} {s.median_s:>9.1f} {s.fraction:>8.1%} {s.p25_s:>8.1f} {s.p75_s:>8.1f} "
                     f"{s.median_trials:>7.1f} {s.early_stops:>8.1f} "
                     f"{s.position(random_median, table.total_s):>8.2f} {s.not_reached:>5}/{s.seeds}")
    lines.append("")
    lines += [f"  {name:<12} {POLICY_WORDS.get(name, name)}" for name in summaries]
    lines.append("  trials: median trials run until reached; ES stops: trials stopped early by then, mean per seed")
    if TARGET_POLICY in summaries:
        s = summaries[TARGET_POLICY]
        verdict = "MET" if s.fraction <= TARGET_FRACTION else "NOT MET"
        lines += ["", f"Target (TPE + early stopping, median <= {TARGET_FRACTION:.0%} of the grid's device-seconds): "
                      f"{s.fraction:.1%}: {verdict}"]
    evidence = rejection_evidence(table)
    if evidence.get("configs"):
        lines += ["", "For REJECT_RATIO: projection from the warm-up (batch / warmup_step_s) over the full "
                      f"run's throughput, {evidence['configs']} configs: "
                      f"min {evidence['projection_over_final_min']:.2f}, "
                      f"median {evidence['projection_over_final_median']:.2f}, "
                      f"max {evidence['projection_over_final_max']:.2f}.",
                  f"First step over a steady step: min {evidence['first_step_over_steady_min']:.2f}, median "
                  f"{evidence['first_step_over_steady_median']:.2f}, max {evidence['first_step_over_steady_max']:.2f} "
                  f"(the rule allows the first step {FIRST_STEP_ALLOWANCE:g} deadlines).",
                  f"Configs slower than the best by >= 2x: {evidence['slower_2x']}, >= 3x: {evidence['slower_3x']}, "
                  f">= 5x: {evidence['slower_5x']}. Smallest ratio that never rejects a config within "
                  f"{TOLERANCE:.0%} of the best (best known): {evidence['smallest_safe_ratio']:.2f}; at "
                  f"{reject_ratio:g} the rule rejects {rejected_once_best_known(table, reject_ratio)} configs once "
                  "the best is known."]
    return "\n".join(lines)


def summary_json(table: Table, summaries: Mapping[str, Summary], reject_ratio: float) -> str:
    """One machine-readable line: the figures the table prints."""
    random_median = summaries["random"].median_s if "random" in summaries else float("nan")
    return json.dumps({
        "grid_total_s": table.total_s, "configs": table.size, "best_samples_per_s": table.best,
        "reject_ratio": reject_ratio, "cpu_model": table.machine.get("cpu_model"),
        "target_fraction": TARGET_FRACTION,
        "target_met": summaries[TARGET_POLICY].fraction <= TARGET_FRACTION if TARGET_POLICY in summaries else None,
        "searchers": {name: {**dataclasses.asdict(s), "position": s.position(random_median, table.total_s)}
                      for name, s in summaries.items()},
        "rejection_evidence": rejection_evidence(table),
    })


# --------------------------------------------------------------------------- command line

def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    record_parser = commands.add_parser("record", help="measure every config of the grid once")
    record_parser.add_argument("--out", required=True, help="the table's JSON file")
    record_parser.add_argument("--tiny", action="store_true",
                               help="vit-micro, short windows, 4 configs: seconds, for a quick try")
    record_parser.add_argument("--grid", choices=GRIDS, default="main",
                               help="main: the main job's 48 configs (~6 min); large: with loader workers and "
                                    "channels_last, 192 configs (~30 min); tiny: as --tiny")
    record_parser.add_argument("--order-seed", type=int, default=0, help="seed of the shuffled config order")
    replay_parser = commands.add_parser("replay", help="replay searchers against a recorded table")
    replay_parser.add_argument("table", help="a table written by record")
    replay_parser.add_argument("--seeds", type=int, default=20, help="seeds per searcher (default 20)")
    replay_parser.add_argument("--reject-ratio", type=float, default=REJECT_RATIO,
                               help=f"the rejection rule's ratio (default REJECT_RATIO, {REJECT_RATIO:g})")
    replay_parser.add_argument("--num-samples", type=int, default=DEFAULT_SAMPLES,
                               help="the sweep's num_samples, which sets TPE's start-up trials as the tool does "
                                    f"(default {DEFAULT_SAMPLES}, the main job's)")
    replay_parser.add_argument("--concurrency", default=None, metavar="N[,N...]",
                               help="replay on a virtual clock with N trials at once, for each N given (e.g. "
                                    "1,4,16,32): device- and wall-seconds until reached (concurrent_replay.py)")
    replay_parser.add_argument("--out", default=None,
                               help="with --concurrency or --warm-start: also write the figures to this JSON file")
    replay_parser.add_argument("--warm-start", default=None, metavar="SOURCE",
                               help="another recorded table: the tool's searcher, cold and warm-started from "
                                    "SOURCE's best configs (warm_replay.py), at each --concurrency (default 1)")
    replay_parser.add_argument("--first-guess", action="store_true",
                               help="the tool's searcher without and with the platform's first guess after the "
                                    "baseline (guess_replay.py), at each --concurrency (default 1)")
    args = parser.parse_args(argv)
    if args.command == "record":
        grid = main_job_grid(tiny=args.tiny, name=args.grid)
        print(f"Recording {len(grid.points())} configs ({grid.name} grid) into {args.out}", flush=True)
        record(grid, args.out, args.order_seed, progress=lambda line: print(line, flush=True))
        return
    positive_int("--seeds", args.seeds)
    positive_float("--reject-ratio", args.reject_ratio)
    positive_int("--num-samples", args.num_samples)
    if args.concurrency is not None:
        concurrencies(args.concurrency)  # bad input said before the table is read
    if not os.path.isfile(args.table):
        raise ConfigError("table", "a JSON file written by `search_efficiency.py record`", args.table)
    table = Table.load(args.table)
    if args.warm_start is not None:
        _replay_warm(table, args)
        return
    if args.first_guess:
        _replay_guess(table, args)
        return
    if args.concurrency is not None:
        _replay_at_concurrency(table, args)
        return
    summaries = compare(table, args.seeds, args.reject_ratio, args.num_samples)
    print(format_report(table, summaries, args.reject_ratio, args.seeds, args.num_samples))
    print(summary_json(table, summaries, args.reject_ratio))


def concurrencies(text: str) -> list[int]:
    """--concurrency's value: integers >= 1, comma-separated."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(value < 1 for value in values):
        raise ConfigError("--concurrency", "integers >= 1, comma-separated (e.g. 1,4,16,32)", text)
    return values


def _replay_warm(table: Table, args) -> None:
    if not os.path.isfile(args.warm_start):
        raise ConfigError("--warm-start", "a JSON file written by `search_efficiency.py record`", args.warm_start)
    plan = plan_warm(Table.load(args.warm_start), table)
    policy = next(p for p in CONCURRENT_POLICIES if p.name == TOOL_POLICY)
    results = compare_warm(table, plan, policy, args.seeds, concurrencies(args.concurrency or "1"),
                           args.reject_ratio, args.num_samples,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    source = os.path.basename(args.warm_start)
    print(format_warm_report(source, table, plan, policy, results))
    figures = {"table": os.path.basename(args.table), **warm_json(source, plan, policy, results)}
    if args.out:
        _write_json(figures, args.out)
    print(json.dumps(figures))


def _replay_guess(table: Table, args) -> None:
    guess = table_guess(table)
    if guess is None:
        raise ConfigError("--first-guess", "a recording whose space the CPU rules move from the baseline",
                          os.path.basename(args.table), "No rule moves a knob of its space.")
    policy = next(p for p in CONCURRENT_POLICIES if p.name == TOOL_POLICY)
    results = compare_guess(table, guess, policy, args.seeds, concurrencies(args.concurrency or "1"),
                            args.reject_ratio, args.num_samples,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_guess_report(table, guess, policy, results))
    figures = {"table": os.path.basename(args.table), "policy": policy.name, "guess": guess.point,
               "guess_throughput": guess.value, "grid_best": guess.best,
               "by_concurrency": {str(n): starts for n, starts in results.items()}}
    if args.out:
        _write_json(figures, args.out)
    print(json.dumps(figures))


def _replay_at_concurrency(table: Table, args) -> None:
    levels = concurrencies(args.concurrency)
    results = compare_at(table, args.seeds, levels, args.reject_ratio, args.num_samples,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_concurrency_report(table, results, args.seeds))
    figures = {"table": os.path.basename(args.table), "reject_ratio": args.reject_ratio,
               "num_samples": args.num_samples, **concurrency_json(table, results, args.seeds)}
    if args.out:
        _write_json(figures, args.out)
    print(json.dumps(figures))


if __name__ == "__main__":
    main_guard(lambda: main(sys.argv[1:]))

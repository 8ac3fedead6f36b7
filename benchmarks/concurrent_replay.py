"""The search-efficiency replay at concurrency N, on a virtual clock (issue 31 item 2).

    python benchmarks/search_efficiency.py replay benchmarks/data/cpu_vit_tiny_epyc_2core.json \\
        --concurrency 1,4,16,32 --seeds 50 --out benchmarks/data/concurrency_cpu_vit_tiny_epyc_2core.json

N slots. A proposal is made whenever a slot is free; the trial holds its slot for its
recorded cost (its full run, or up to where ASHA or the rejection rule stops it); its
window reports reach ASHA at their own times on the clock, and its result reaches the
searcher when it ends. So a proposal made while 15 trials run is made knowing only the
results that have ended by then, as in a sweep on a 16-slot cluster.

What it charges: device-seconds (the slots' busy time, a running trial counted up to the
moment) and wall-seconds (the clock) until the config the searcher would name best is
within the tolerance of the grid's best. The tool's dedup is replayed too: a proposal of a
measured config is answered with its value at no cost; one of a config running now is
withdrawn and the searcher asked again (at most MAX_RUNNING_REPEATS times, then the slot
waits for the next result), as FailureAwareOptunaSearch does.

Simplifications, each the tool's own behaviour where it has one: the rejection rule reads
the best value so far once, when a trial starts (SweepBoard: "a trial reads it once, when
it starts"), and the best so far is that of the trials ended by then; starting a trial
costs nothing beyond its recorded cost (no scheduling or process start-up on the clock).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from accelsweep.sweeps.driver.run.searchers import MAX_REPEATED_PROPOSALS, MAX_RUNNING_REPEATS
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.rejection import REJECT_RATIO
from benchmarks.recorded_grid import (METRIC, TOLERANCE, Policy, Row, Searcher, ShuffledGrid, Table, make_asha,
                                      make_searcher, rejection)

__all__ = ["BEFORE_POLICY", "CONCURRENCIES", "CONCURRENT_POLICIES", "ConcurrentReplay", "SlotTrial", "grid_wall_s",
           "replay_at", "summarize_at", "compare_at"]

CONCURRENCIES = (1, 4, 16, 32)
# Issue 31's targets at 16 slots: the tool's searcher within the tolerance in at most this
# share of the grid's device-seconds, and of the grid's wall time at that concurrency.
TARGET_CONCURRENCY = 16
TARGET_DEVICE_FRACTION = 0.40
TARGET_WALL_FRACTION = 1 / 6
TOOL_POLICY = "tpe+es"  # the tool's searcher: concurrency-aware TPE with ASHA and rejection
PLAIN_POLICY = "tpe-plain+es"  # the same without the constant liar: what it is measured against
BEFORE_POLICY = "before+es"  # the tool before issue 31 under Optuna 4: no liar, a slot waits at a repeat

CONCURRENT_POLICIES = (
    Policy(TOOL_POLICY, "tpe", asha=True, reject=True),
    Policy(PLAIN_POLICY, "tpe-plain", asha=True, reject=True),
    Policy(BEFORE_POLICY, "tpe-plain", asha=True, reject=True, running_repeats=1),
    Policy("tpe", "tpe"),
    Policy("tpe-plain", "tpe-plain"),
    Policy("random", "random"),
    Policy("grid", "grid"),
)
CONCURRENT_POLICY_WORDS = {
    TOOL_POLICY: "the tool's: TPE with the constant liar (running trials count), ASHA and rejection",
    PLAIN_POLICY: "TPE without the constant liar (a repeat of a running config asked again), ASHA and rejection",
    BEFORE_POLICY: "the tool before issue 31 (Optuna 4's TPE, no liar; a repeat of a running config: the slot waits)",
    "tpe": "TPE with the constant liar, every trial to its end",
    "tpe-plain": "TPE without the constant liar, every trial to its end",
    "random": "random search (Optuna RandomSampler)",
    "grid": "the grid, in a seeded random order",
}


@dataclass(frozen=True)
class SlotTrial:
    """One trial run on the clock: which slot held it, from when to when."""

    key: tuple
    slot: int
    start_s: float
    end_s: float
    outcome: str  # completed, failed, asha@<window>, rejected (<stage>)
    told: Optional[float]

    @property
    def cost_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class ConcurrentReplay:
    policy: str
    seed: int
    concurrency: int
    reached: bool
    reach_device_s: float  # device-seconds (busy slot time) when first within the tolerance
    reach_wall_s: float  # the clock then
    reach_trials: int  # trials started by then
    trials: tuple[SlotTrial, ...]  # in the order they ended
    dedups: int  # proposals answered from a measured config (no trial)
    withdrawn: int  # proposals of a config running at the time (withdrawn, asked again)


@dataclass
class _Running:
    """A trial holding a slot: its handle for the searcher and what ASHA calls it."""

    key: tuple
    slot: int
    start_s: float
    handle: Any
    row: Row
    tune_trial: Any
    rejected: Optional[tuple[str, float, float]]
    last_report: Optional[dict] = None
    ended: bool = False


def grid_wall_s(table: Table, concurrency: int, seed: int) -> float:
    """The whole grid's wall time on ``concurrency`` slots, its configs in the seeded
    random order of the grid searcher, each started as soon as a slot frees."""
    slots = [0.0] * concurrency
    for point in ShuffledGrid(table.space, seed).points:
        start = heapq.heappop(slots)
        heapq.heappush(slots, start + table.rows[table.key(point)].wall_s)
    return max(slots)


def replay_at(table: Table, policy: Policy, seed: int, concurrency: int, reject_ratio: Optional[float] = None,
              num_samples: int = 24, tolerance: float = TOLERANCE, until_reached: bool = True,
              searcher: Optional[Searcher] = None) -> ConcurrentReplay:
    """One search of ``table`` on ``concurrency`` slots (see the module's docstring),
    until the named best is within ``tolerance`` of the grid's best (``until_reached``),
    or a grid's worth of trials has run, or the searcher is searched out."""
    from ray.tune.schedulers import TrialScheduler

    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError("concurrency", "an integer >= 1 (trials running at once)", concurrency)
    if policy.reject and reject_ratio is None:
        reject_ratio = REJECT_RATIO
    searcher = searcher or make_searcher(policy.sampler, table, seed, num_samples)
    running_repeats_allowed = policy.running_repeats or MAX_RUNNING_REPEATS
    asha = make_asha(table.windows) if policy.asha and table.windows >= 2 else None

    events: list[tuple[float, int, str, int, Any]] = []  # (time, order, kind, trial number, payload)
    order = itertools.count()
    running: dict[int, _Running] = {}
    free = list(range(concurrency))  # free slots, lowest first
    told: dict[tuple, Optional[float]] = {}
    measured: dict[tuple, float] = {}
    ended: list[SlotTrial] = []
    busy_s = 0.0  # device-seconds of the trials ended so far
    started = dedups = withdrawn = repeated = 0
    searched_out = False
    reach: Optional[tuple[float, float, int]] = None

    def start(now: float, number: int, key: tuple, handle: Any) -> None:
        row = table.rows[key]
        best_so_far = max(measured.values(), default=None)
        rejected = (rejection(row, best_so_far, reject_ratio, table.warmup_steps)
                    if policy.reject and reject_ratio is not None else None)
        trial = _Running(key, heapq.heappop(free), now, handle, row, SimpleNamespace(trial_id=str(number)), rejected)
        running[number] = trial
        if asha is not None:
            asha.on_trial_add(None, trial.tune_trial)
        if rejected is not None:
            heapq.heappush(events, (now + rejected[1], next(order), "rejected", number, None))
            return
        for window in row.windows if asha is not None else ():
            heapq.heappush(events, (now + window.since_start_s, next(order), "window", number, window))
        heapq.heappush(events, (now + row.wall_s, next(order), "end", number, None))

    def propose(now: float) -> None:
        """Fill the free slots; a slot whose proposals keep repeating running configs waits."""
        nonlocal started, dedups, withdrawn, repeated, searched_out
        running_repeats = 0
        while free and not searched_out and started < table.size:
            handle, point = searcher.ask()
            key = table.key(point)
            if key in told:  # measured: answered with its value, no trial (the tool's dedup)
                searcher.tell(handle, told[key])
                dedups += 1
                repeated += 1
                searched_out = repeated >= MAX_REPEATED_PROPOSALS
                continue
            if any(trial.key == key for trial in running.values()):
                searcher.tell(handle, None)  # withdrawn: a FAIL, which the samplers ignore
                withdrawn += 1
                running_repeats += 1
                if running_repeats >= running_repeats_allowed:
                    return
                continue
            repeated = 0
            start(now, started, key, handle)
            started += 1

    def finish(now: float, number: int, outcome: str, value: Optional[float], has_window: bool) -> None:
        nonlocal busy_s, reach
        trial = running.pop(number)
        trial.ended = True
        heapq.heappush(free, trial.slot)
        busy_s += now - trial.start_s
        told[trial.key] = value
        if has_window:
            measured[trial.key] = value
        searcher.tell(trial.handle, value)
        ended.append(SlotTrial(trial.key, trial.slot, trial.start_s, now, outcome, value))
        named = max(measured, key=measured.get) if measured else None
        if reach is None and named is not None and table.within_tolerance(named, tolerance):
            in_flight = sum(now - other.start_s for other in running.values())
            reach = (busy_s + in_flight, now, started)

    propose(0.0)
    while events and not (until_reached and reach is not None):
        now, _, kind, number, payload = heapq.heappop(events)
        trial = running.get(number)
        if trial is None:
            continue  # a report of a trial ASHA stopped already
        if kind == "window":
            trial.last_report = {"training_iteration": payload.index, METRIC: payload.throughput}
            decision = asha.on_trial_result(None, trial.tune_trial, trial.last_report)
            if decision == TrialScheduler.STOP and payload.index < table.windows:
                asha.on_trial_complete(None, trial.tune_trial, trial.last_report)
                finish(now, number, f"asha@{payload.index}", payload.throughput, True)
                propose(now)
            continue
        if kind == "rejected":
            stage, _, projection = trial.rejected
            if asha is not None:  # reported once, at the first rung (as the sequential replay)
                result = {"training_iteration": 1, METRIC: projection}
                asha.on_trial_result(None, trial.tune_trial, result)
                asha.on_trial_complete(None, trial.tune_trial, result)
            finish(now, number, f"rejected ({stage})", projection, False)
        else:  # the trial's end
            if asha is not None and trial.last_report is not None and trial.row.throughput is not None:
                asha.on_trial_complete(None, trial.tune_trial, trial.last_report)
            if trial.row.throughput is None:
                finish(now, number, "failed", None, False)
            else:
                finish(now, number, "completed", trial.row.throughput, True)
        propose(now)

    if reach is None:
        # Never within the tolerance: charged the whole grid, on the device and on the clock.
        reach_device, reach_wall, reach_trials = table.total_s, grid_wall_s(table, concurrency, seed), started
    else:
        reach_device, reach_wall, reach_trials = reach
    return ConcurrentReplay(policy.name, seed, concurrency, reach is not None, reach_device, reach_wall,
                            reach_trials, tuple(ended), dedups, withdrawn)


@dataclass(frozen=True)
class ConcurrentSummary:
    policy: str
    concurrency: int
    device_median_s: float
    device_p90_s: float
    wall_median_s: float
    wall_p90_s: float
    device_fraction: float  # median device-seconds over the grid's total
    wall_fraction: float  # median wall-seconds over the grid's median wall at this concurrency
    median_trials: float
    not_reached: int
    seeds: int
    withdrawn: float  # proposals withdrawn (a config running then), mean per seed


def summarize_at(table: Table, replays: Sequence[ConcurrentReplay], grid_wall: float) -> ConcurrentSummary:
    device = np.array([r.reach_device_s for r in replays])
    wall = np.array([r.reach_wall_s for r in replays])
    return ConcurrentSummary(replays[0].policy, replays[0].concurrency, float(np.median(device)),
                             float(np.percentile(device, 90)), float(np.median(wall)), float(np.percentile(wall, 90)),
                             float(np.median(device)) / table.total_s, float(np.median(wall)) / grid_wall,
                             float(np.median([r.reach_trials for r in replays])), sum(not r.reached for r in replays),
                             len(replays), float(np.mean([r.withdrawn for r in replays])))


def compare_at(table: Table, seeds: int, concurrencies: Sequence[int] = CONCURRENCIES,
               reject_ratio: Optional[float] = None, num_samples: int = 24,
               policies: Sequence[Policy] = CONCURRENT_POLICIES,
               progress=lambda line: None) -> dict[int, dict[str, Any]]:
    """Per concurrency: the grid's median wall time there, and each policy's summary."""
    out: dict[int, dict[str, Any]] = {}
    for concurrency in concurrencies:
        grid_wall = float(np.median([grid_wall_s(table, concurrency, seed) for seed in range(seeds)]))
        summaries = {}
        for policy in policies:
            replays = [replay_at(table, policy, seed, concurrency, reject_ratio, num_samples) for seed in range(seeds)]
            summaries[policy.name] = summarize_at(table, replays, grid_wall)
            progress(f"N={concurrency} {policy.name}: device median {summaries[policy.name].device_median_s:.1f} s, "
                     f"wall median {summaries[policy.name].wall_median_s:.1f} s")
        out[concurrency] = {"grid_wall_s": grid_wall, "summaries": summaries}
    return out


def target_verdicts(results: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """Issue 31's targets, each MET or NOT MET with its figure (a concurrency not
    replayed: not judged)."""
    lines = []
    at = results.get(TARGET_CONCURRENCY)
    if at is not None and TOOL_POLICY in at["summaries"]:
        s = at["summaries"][TOOL_POLICY]
        lines.append(f"N={TARGET_CONCURRENCY}, {TOOL_POLICY}: median device-seconds {s.device_fraction:.1%} of the "
                     f"grid's (target <= {TARGET_DEVICE_FRACTION:.0%}): "
                     f"{'MET' if s.device_fraction <= TARGET_DEVICE_FRACTION else 'NOT MET'}; median wall "
                     f"{s.wall_fraction:.1%} of the grid's wall at N={TARGET_CONCURRENCY} "
                     f"({at['grid_wall_s']:.1f} s; target <= {TARGET_WALL_FRACTION:.1%}): "
                     f"{'MET' if s.wall_fraction <= TARGET_WALL_FRACTION else 'NOT MET'}")
    for concurrency, at in results.items():
        for other in (PLAIN_POLICY, BEFORE_POLICY):
            if concurrency < 4 or TOOL_POLICY not in at["summaries"] or other not in at["summaries"]:
                continue
            aware, plain = at["summaries"][TOOL_POLICY], at["summaries"][other]
            beats = aware.device_median_s < plain.device_median_s and aware.wall_median_s < plain.wall_median_s
            lines.append(f"N={concurrency}: {TOOL_POLICY} against {other}, device median "
                         f"{aware.device_median_s:.1f} vs {plain.device_median_s:.1f} s (p90 {aware.device_p90_s:.1f} "
                         f"vs {plain.device_p90_s:.1f}), wall median {aware.wall_median_s:.1f} vs "
                         f"{plain.wall_median_s:.1f} s (p90 {aware.wall_p90_s:.1f} vs {plain.wall_p90_s:.1f}): "
                         f"{'beats it (both medians lower)' if beats else 'does NOT beat it on both medians'}")
    return lines


def wall_floor(table: Table, tolerance: float = TOLERANCE) -> float:
    """The least wall time any searcher can reach the tolerance in: the shortest full run
    of a config within it (a search cannot name a config best before a trial of it
    reports; ASHA never stops the leader early on this account)."""
    return min(row.wall_s for key, row in table.rows.items() if table.within_tolerance(key, tolerance))


def format_concurrency_report(table: Table, results: Mapping[int, Mapping[str, Any]], seeds: int) -> str:
    lines = [f"Replay at concurrency on a virtual clock: {seeds} seeds per searcher and N; grid total "
             f"{table.total_s:.1f} device-s, best {table.best:.1f} samples/s. Until the named best is within "
             f"{TOLERANCE:.0%} of the grid's best: device-seconds (busy slot time) and wall-seconds (the clock), "
             "median and 90th percentile; 'of grid' is the median over the grid's total device-seconds, and over "
             "the grid's own wall time at that N. Not reached: charged the whole grid.", ""]
    header = (f"{'N':>3} {'searcher':<14} {'device med':>10} {'p90':>7} {'of grid':>8} {'wall med':>9} {'p90':>7} "
              f"{'of grid':>8} {'trials':>6} {'withdrawn':>9} {'not reached':>11}")
    lines += [header, "-" * len(header)]
    for concurrency, at in results.items():
        for name, s in at["summaries"].items():
            lines.append(f"{concurrency:>3} {name:<14} {s.device_median_s:>10.1f} {s.device_p90_s:>7.1f} "
                         f"{s.device_fraction:>8.1%} {s.wall_median_s:>9.1f} {s.wall_p90_s:>7.1f} "
                         f"{s.wall_fraction:>8.1%} {s.median_trials:>6.1f} {s.withdrawn:>9.1f} "
                         f"{s.not_reached:>5}/{s.seeds}")
        lines.append(f"    (grid wall at N={concurrency}: {at['grid_wall_s']:.1f} s)")
    lines.append("")
    lines += [f"  {name:<14} {words}" for name, words in CONCURRENT_POLICY_WORDS.items()]
    lines.append("  withdrawn: proposals of a config running at the time, mean per seed (asked again)")
    lines += ["", *target_verdicts(results)]
    floor = wall_floor(table)
    near = sum(table.within_tolerance(key) for key in table.rows)
    lines.append(f"Wall floor: {near} config(s) are within {TOLERANCE:.0%} of the best; the shortest run of one "
                 f"takes {floor:.1f} s, so no searcher reaches the tolerance sooner: "
                 + ", ".join(f"{floor / at['grid_wall_s']:.1%} of the grid's wall at N={n}"
                             for n, at in results.items()) + ".")
    return "\n".join(lines)


def concurrency_json(table: Table, results: Mapping[int, Mapping[str, Any]], seeds: int) -> dict:
    import dataclasses

    return {"grid_total_s": table.total_s, "configs": table.size, "best_samples_per_s": table.best,
            "cpu_model": table.machine.get("cpu_model"), "seeds": seeds, "tolerance": TOLERANCE,
            "wall_floor_s": wall_floor(table),
            "targets": {"concurrency": TARGET_CONCURRENCY, "device_fraction": TARGET_DEVICE_FRACTION,
                        "wall_fraction": TARGET_WALL_FRACTION, "verdicts": target_verdicts(results)},
            "by_concurrency": {str(n): {"grid_wall_s": at["grid_wall_s"],
                                        "searchers": {name: dataclasses.asdict(s)
                                                      for name, s in at["summaries"].items()}}
                               for n, at in results.items()}}

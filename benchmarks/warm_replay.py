"""Warm start, replayed (issue 31 item 4): a search of one recorded grid that begins from
another grid's results, as ``--warm-start SWEEP`` begins a sweep from an earlier one.

    python benchmarks/search_efficiency.py replay TARGET.json --warm-start SOURCE.json \\
        --concurrency 1,4,16,32 --seeds 50

What the tool does (sweeps/driver/define/warm_start.py), done to the recordings: the source's
WARM_START_CONFIGS best configs that are points of the target's space are proposed
first, before the baseline; the source's results are told to TPE as completed trials
only where both grids measured the same thing (the same CPU, ISA limit, versions and
workload), else the configs are only proposed and measured here, at the target's
recorded cost. The gain is the same search (policy, seeds, concurrency) with and without
the warm start: device- and wall-seconds until the named best is within the tolerance of
the target grid's best.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from accelsweep.sweeps.driver.define.warm_start import NOT_WORKLOAD_FIELDS, WARM_START_CONFIGS
from accelsweep.trainables.errors import ConfigError
from benchmarks.concurrent_replay import replay_at
from benchmarks.recorded_grid import Policy, Searcher, Table, make_searcher

__all__ = ["WarmPlan", "plan_warm", "measurement_differences", "compare_starts", "compare_warm", "starts_table", "format_warm_report", "warm_json"]

# What a recording's figures depend on beyond the workload (search_efficiency.describe_machine).
MEASUREMENT_FIELDS = ("cpu_model", "usable_cpus", "cpu_flags", "torch_cpu_capability", "onednn_max_cpu_isa",
                      "versions")


@dataclass
class WarmPlan:
    points: list[dict] = field(default_factory=list)  # proposed first, best first
    told: list[tuple[dict, float]] = field(default_factory=list)  # the source's results TPE learns (same measurement)
    differences: list[str] = field(default_factory=list)  # why nothing is told (empty: told)
    skipped: list[str] = field(default_factory=list)  # source configs that are no point of the target's space


def measurement_differences(source: Table, target: Table) -> list[str]:
    """How the two recordings' hardware, versions and workload differ (empty: the same)."""
    found = [f"{name}: {source.machine.get(name)} there, {target.machine.get(name)} here"
             for name in MEASUREMENT_FIELDS if source.machine.get(name) != target.machine.get(name)]
    searched = set(source.space) | set(target.space)
    for name in sorted((set(source.base) | set(target.base)) - searched - set(NOT_WORKLOAD_FIELDS)):
        if source.base.get(name) != target.base.get(name):
            found.append(f"workload: {name} {source.base.get(name)} there, {target.base.get(name)} here")
    return found


def _as_target_point(point: Mapping[str, Any], target: Table) -> tuple[Optional[dict], str]:
    """``point`` (a source config) in the target's space, or None and why not: a target
    knob the source lacks is left to the searcher; a source knob the target does not
    search must have the target's base value."""
    kept = {}
    for knob, choices in target.space.items():
        if knob in point:
            if point[knob] not in choices:
                return None, f"{knob}={point[knob]!r} is not in this space"
            kept[knob] = point[knob]
    for knob, value in point.items():
        if knob not in target.space and knob in target.base and target.base[knob] != value:
            return None, f"{knob}={value!r}; this grid fixes {knob} at {target.base[knob]!r}"
    return kept, ""


def plan_warm(source: Table, target: Table, count: int = WARM_START_CONFIGS) -> WarmPlan:
    """The warm start of a search of ``target`` from ``source``'s recording."""
    plan = WarmPlan(differences=measurement_differences(source, target))
    measured = sorted((row for row in source.rows.values() if row.throughput is not None),
                      key=lambda row: -row.throughput)
    for row in measured:
        point, why = _as_target_point(row.point, target)
        if point is None:
            if len(plan.points) < count:
                plan.skipped.append(why)
            continue
        if len(plan.points) < count and point not in plan.points:
            plan.points.append(point)
        if not plan.differences and set(point) == set(target.space):
            plan.told.append((point, row.throughput))
    if not plan.points:
        raise ConfigError("--warm-start", "a recording with a config that trained and fits this grid's space",
                          "none fits", "; ".join(plan.skipped[:3]))
    return plan


def compare_warm(target: Table, plan: WarmPlan, policy: Policy, seeds: int, concurrencies: Sequence[int],
                 reject_ratio: Optional[float] = None, num_samples: int = 24,
                 progress=lambda line: None) -> dict[int, dict[str, Any]]:
    """Per concurrency, the same searches cold and warm: device- and wall-seconds until
    reached (median and 90th percentile over ``seeds``) and the trials run by then."""
    def warm(seed: int) -> Searcher:
        return make_searcher(policy.sampler, target, seed, num_samples, warm_points=plan.points, told=plan.told)

    return compare_starts(target, policy, seeds, concurrencies, {"cold": None, "warm": warm}, reject_ratio,
                          num_samples, progress)


def compare_starts(target: Table, policy: Policy, seeds: int, concurrencies: Sequence[int],
                   starts: Mapping[str, Optional[Callable[[int], Searcher]]], reject_ratio: Optional[float] = None,
                   num_samples: int = 24, progress=lambda line: None) -> dict[int, dict[str, Any]]:
    """Per concurrency, the same searches (policy, seeds) begun each way of ``starts``
    (name -> the searcher for a seed; None: the policy's own)."""
    out: dict[int, dict[str, Any]] = {}
    for concurrency in concurrencies:
        out[concurrency] = {
            start: _figures([replay_at(target, policy, seed, concurrency, reject_ratio, num_samples,
                                       searcher=searcher_for(seed) if searcher_for else None)
                             for seed in range(seeds)])
            for start, searcher_for in starts.items()}
        progress(f"N={concurrency} {policy.name}: device median "
                 + ", ".join(f"{f['device_median_s']:.1f} s {start}" for start, f in out[concurrency].items()))
    return out


def _figures(replays) -> dict[str, float]:
    device = np.array([r.reach_device_s for r in replays])
    wall = np.array([r.reach_wall_s for r in replays])
    return {"device_median_s": float(np.median(device)), "device_p90_s": float(np.percentile(device, 90)),
            "wall_median_s": float(np.median(wall)), "wall_p90_s": float(np.percentile(wall, 90)),
            "trials_median": float(np.median([r.reach_trials for r in replays])),
            "not_reached": int(sum(not r.reached for r in replays)), "seeds": len(replays)}


def format_warm_report(source_name: str, target: Table, plan: WarmPlan, policy: Policy,
                       results: Mapping[int, Mapping[str, Any]]) -> str:
    lines = [f"Warm start from {source_name}: proposed first {len(plan.points)} config(s): "
             + "; ".join(" ".join(f"{k}={v}" for k, v in p.items()) for p in plan.points)]
    lines += [f"  not proposed: {why}" for why in plan.skipped]
    lines.append(f"  told to TPE: {len(plan.told)} measured result(s)" if not plan.differences else
                 "  not told to TPE (measured elsewhere; only proposed): " + "; ".join(plan.differences))
    def gain(starts: Mapping[str, Any]) -> str:
        cold, warm = starts["cold"], starts["warm"]
        return (f"{'':>3} gain: device median x{cold['device_median_s'] / warm['device_median_s']:.2f}, "
                f"wall median x{cold['wall_median_s'] / warm['wall_median_s']:.2f} (cold over warm)")

    return "\n".join([*lines, *starts_table(target, policy, results, gain)])


def starts_table(target: Table, policy: Policy, results: Mapping[int, Mapping[str, Any]],
                 after_each: Optional[Callable[[Mapping[str, Any]], str]] = None) -> list[str]:
    """compare_starts' figures as a table: a row per concurrency and start (and
    ``after_each``'s line under each concurrency's rows)."""
    width = max([len("start"), *(len(start) for starts in results.values() for start in starts)])
    lines = [f"Searcher {policy.name}; grid total {target.total_s:.1f} device-s; until the named best is within "
             "5% of the grid's best (median / 90th percentile over seeds).", ""]
    header = (f"{'N':>3} {'start':<{width}} {'device med':>10} {'device p90':>10} {'wall med':>9} {'wall p90':>9} "
              f"{'trials':>6} {'not reached':>11}")
    lines += [header, "-" * len(header)]
    for concurrency, starts in results.items():
        for start, f in starts.items():
            lines.append(f"{concurrency:>3} {start:<{width}} {f['device_median_s']:>10.1f} {f['device_p90_s']:>10.1f} "
                         f"{f['wall_median_s']:>9.1f} {f['wall_p90_s']:>9.1f} {f['trials_median']:>6.1f} "
                         f"{f['not_reached']:>5}/{f['seeds']}")
        if after_each is not None:
            lines.append(after_each(starts))
    return lines


def warm_json(source_name: str, plan: WarmPlan, policy: Policy, results: Mapping[int, Mapping[str, Any]]) -> dict:
    return {"warm_start": source_name, "policy": policy.name, "points": plan.points, "told": len(plan.told),
            "differences": plan.differences, "skipped": plan.skipped,
            "by_concurrency": {str(n): starts for n, starts in results.items()}}

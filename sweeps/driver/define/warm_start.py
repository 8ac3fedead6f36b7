"""A sweep that starts from an earlier one (``--warm-start SWEEP``).

Users rarely tune from nothing: they tuned this model last week, on another instance
type or SDK version. A warm start reads that sweep from its MLflow store (history.py:
its parent run's name or id, in any store the user can read), proposes its best configs
first (WARM_START_CONFIGS of them, each checked against the new space: ``_point``), and
tells the searcher the old results only where they measured the same thing: the same
hardware, workload and package versions. Elsewhere a number measured on another machine
or SDK would mislead TPE's model of this one, so the old configs are only enqueued, to be
measured here.

Everything is decided before the first trial (plan_sweep), and said: --dry-run prints it,
the sweep's start says it, the parent run keeps it (tags ``warm_start*``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from accelsweep.sweeps.driver.define.space import holds
from accelsweep.sweeps.driver.record.history import load_sweep
from accelsweep.sweeps.driver.record.secrets import redact_uri
from accelsweep.sweeps.driver.record.tracking import param_value
from accelsweep.sweeps.driver.record.trial_record import TrialRecord, config_key, ranked
from accelsweep.trainables.environment import environment_tags
from accelsweep.trainables.errors import ConfigError

__all__ = ["WARM_START_CONFIGS", "WarmStart", "plan_warm_start", "unique_points", "warm_trials"]

# The old sweep's best configs proposed first. A few, not all: they are measured again
# here (the new hardware or versions may rank them differently), and the rest of the
# budget is the search's.
WARM_START_CONFIGS = 3
# Parent-run tags that say where a sweep ran (lifecycle.py _start, plan.py capability_tags,
# trainables/environment.py, its oneDNN ISA limit among them); host.python_executable names
# a path, not hardware.
HARDWARE_TAGS = ("platform", "instance_type", "hardware", "host.machine", "host.cpus", "host.onednn_max_cpu_isa",
                 "host.dnnl_max_cpu_isa")
# Base-config fields that are the hardware's (said by HARDWARE_TAGS), not the workload's;
# and the seed, which picks the initial weights and data, not the work a step does.
NOT_WORKLOAD_FIELDS = ("platform", "instance_type", "seed")


@dataclass
class WarmStart:
    source: str  # the old sweep's parent run name
    source_run_id: str
    store: str  # its tracking URI, as shown (no credentials)
    points: list[dict] = field(default_factory=list)  # proposed first, best first
    skipped: list[str] = field(default_factory=list)  # the old best configs not valid here, each with why
    told: list[tuple[dict, Any]] = field(default_factory=list)  # (point, value(s)) the searcher learns
    mismatches: list[str] = field(default_factory=list)  # why the old results are not told (empty: told)

    @property
    def tells(self) -> bool:
        return not self.mismatches

    def lines(self) -> list[str]:
        """What --dry-run prints and the sweep's start says."""
        lines = [f"warm start from {self.source} ({self.store}): its {len(self.points)} best config(s) valid in "
                 "this space are proposed first: " + ("; ".join(str(p) for p in self.points) or "none")]
        lines += [f"  not proposed: {why}" for why in self.skipped]
        if self.tells:
            lines.append(f"  same hardware, workload and versions: the searcher is told its {len(self.told)} "
                         "measured result(s)")
        else:
            lines.append("  its results are not told to the searcher (only its configs are proposed, to be measured "
                         "here): " + "; ".join(self.mismatches))
        return lines

    def tags(self) -> dict[str, str]:
        return {"warm_start": self.source, "warm_start_run_id": self.source_run_id,
                "warm_start_points": str(len(self.points)),
                "warm_start_told": str(len(self.told)) if self.tells else "0",
                "warm_start_note": "; ".join(self.mismatches) or "same hardware, workload and versions: told"}


def _point(record: TrialRecord, distributions: Mapping[str, Any], base: Mapping[str, Any],
           holds) -> tuple[Optional[dict], str]:
    """``record``'s config as a point of the new space, or None and why not: each new knob
    takes the old trial's value (searched, else its full config's); a value the new space
    lacks skips the config, and a knob the old sweep searched that the new one does not
    must have the new base's value."""
    point: dict[str, Any] = {}
    for knob, distribution in distributions.items():
        if knob in record.searched:
            value = record.searched[knob]
        elif knob in record.config:
            value = record.config[knob]
        else:
            continue  # the old trial had no such setting: the searcher picks it
        if not holds(distribution, value):
            return None, f"trial {record.number}'s {knob}={value!r} is not in this space"
        point[knob] = value
    for knob, value in record.searched.items():
        if knob not in distributions and knob in base and str(base[knob]) != str(value):
            return None, f"trial {record.number} has {knob}={value!r}; this sweep fixes {knob} at {base[knob]!r}"
    return point, ""


def _mismatches(history, new_tags: Mapping[str, str], base_params: Mapping[str, str], knobs) -> list[str]:
    """How the old sweep's hardware, workload and versions differ from the new one's."""
    old = history.tags
    found = []
    for tag in HARDWARE_TAGS:
        if old.get(tag, "unknown") != new_tags.get(tag, "unknown"):
            found.append(f"hardware: {tag} {old.get(tag, 'unknown')} there, {new_tags.get(tag, 'unknown')} here")
    versions = sorted({k for k in (*old, *new_tags) if k.startswith("version.")})
    for tag in versions:
        if old.get(tag) != new_tags.get(tag):
            found.append(f"versions: {tag[len('version.'):]} {old.get(tag, 'absent')} there, "
                         f"{new_tags.get(tag, 'absent')} here")
    searched = set(knobs) | set(history.knobs)
    fields = sorted({k for k in (*history.params, *base_params) if k.startswith("base.")}
                    - {f"base.{k}" for k in (*searched, *NOT_WORKLOAD_FIELDS)})
    for name in fields:
        if history.params.get(name) != base_params.get(name):
            found.append(f"workload: {name[len('base.'):]} {history.params.get(name, 'absent')} there, "
                         f"{base_params.get(name, 'absent')} here")
    return found


def plan_warm_start(plan, ref: str, store: str) -> WarmStart:
    """The warm start of ``plan``'s sweep from the sweep ``ref`` names in ``store``."""
    sweep = plan.sweep
    if sweep.sampler != "tpe":
        raise ConfigError("warm_start", "none with sampler 'grid' (a grid runs every point once, in its own order)",
                          ref)
    try:
        history = load_sweep(store, ref)
    except ConfigError as error:  # named as the flag the user gave, with the store's answer
        raise ConfigError("warm_start", f"a sweep of the store {redact_uri(store)}", ref, str(error)) from None
    metric, mode = plan.objectives[0]
    measured = ranked(history.records, metric)
    if not measured:
        raise ConfigError("warm_start", f"a sweep with a trial that measured {metric} (this sweep's first "
                                        "objective)", ref, f"{history.name} has none.")
    distributions = plan.space.distributions
    pick = -1 if mode == "max" else 1
    best_first = sorted(measured, key=lambda r: pick * r.metric(metric))
    warm = WarmStart(history.name, history.parent_run_id, redact_uri(store))
    seen: set[str] = set()
    for record in best_first:
        point, why = _point(record, distributions, plan.base_dict, holds)
        key = repr(sorted((point or {}).items()))
        if point is not None and key in seen:
            continue  # the same config measured twice there (a repeat)
        if point is None:
            if len(warm.points) < WARM_START_CONFIGS:  # said for the configs that would have come first
                warm.skipped.append(why)
            continue
        try:
            plan.config_for(point)
        except ConfigError as error:
            if len(warm.points) < WARM_START_CONFIGS:  # said for the configs that would have come first
                warm.skipped.append(f"trial {record.number}'s config is refused here: {error}")
            continue
        seen.add(key)
        if len(warm.points) < min(WARM_START_CONFIGS, max(1, sweep.num_samples - 1)):
            warm.points.append(point)
        values = [record.metric(m) for m, _ in plan.objectives]
        # A whole point with every objective measured: one the searcher can be told.
        if set(point) == set(distributions) and all(math.isfinite(v) for v in values):
            warm.told.append((point, values if len(values) > 1 else values[0]))
    new_tags = {**environment_tags(), "platform": sweep.base.platform,
                "instance_type": (sweep.cost.instance_type if sweep.cost else None) or "unknown",
                **{k: v for k, v in plan.capability_tags().items() if k == "hardware"}}
    base_params = {f"base.{k}": param_value(v) for k, v in plan.base_dict.items()}
    warm.mismatches = _mismatches(history, new_tags, base_params, distributions)
    return warm


def unique_points(points) -> list[dict]:
    """``points`` in order, each config once (a warm config that is the baseline runs once)."""
    seen, kept = set(), []
    for point in points:
        if config_key(point) not in seen:
            seen.add(config_key(point))
            kept.append(dict(point))
    return kept


def warm_trials(told, distributions: Mapping[str, Any], objectives: int) -> list:
    """The old results as completed Optuna trials, for the searcher's study: TPE's model
    starts from them (they count toward its start-up trials too)."""
    import optuna

    trials = []
    for point, value in told:
        values = value if objectives > 1 else None
        trials.append(optuna.trial.create_trial(
            params=point, distributions={k: distributions[k] for k in point},
            value=None if objectives > 1 else value, values=values, state=optuna.trial.TrialState.COMPLETE,
            system_attrs={"warm_start": True}))
    return trials

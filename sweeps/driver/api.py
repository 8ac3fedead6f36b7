"""The sweep-building API: what every script in sweeps/ calls, and what users call.

    from accelsweep.sweeps.driver.api import Objective, Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.trainable import train_trainable

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast"])

    result = run_sweep(Sweep(name="my_study", trainable=train_trainable,
                             base=TrialConfig.make(model="vit-tiny"), space=space, num_samples=8))

A sweep is validated whole before anything starts: the trainable's signature and
declared metrics, the base config, every config the space can propose (sampled), the
objectives, the tracking URI, the platform, and the Ray instance it would use. Then the
base config runs first as the baseline, a seeded Optuna TPE search proposes the rest,
ASHA (or the median rule; with several objectives a Pareto rule) stops hopeless trials
after a window, trial processes are reused so torch is imported once per process, and
every trial becomes one nested MLflow run under one parent run for the sweep.

Your own trainable and config
-----------------------------
A sweep runs any trainable and config that keep this protocol (examples/user_trainable.py):

- **The config** (``Sweep.base``, the baseline): an object with ``platform`` (a platform
  name: cpu, cuda, xla, neuron, tpu), ``to_dict()`` giving a flat dict of its fields, and
  a classmethod ``from_dict(values)`` that builds one from such a dict and raises
  ``ConfigError`` for a bad value: the driver rebuilds each trial's config with it (the
  base's dict with the searched knobs over it), in the driver, before any trial starts.
  Optional fields: ``cpus_per_worker`` and ``workers`` (the CPUs a trial holds: their
  product; 1 each when absent), ``windows`` (how many results a trial reports; early
  stopping needs 2 or more) and ``trial_env()`` (environment variables the trial sets).
  ``SweepConfig`` is such a config: subclass it as a frozen dataclass and add fields.
- **The trainable**: a function called in the trial's process as
  ``trainable(searched, base=base_dict, cost=cost_basis)`` (``searched``: the knobs the
  search space chose; ``base``: the base config's dict) that reports each window's figures
  with ``ray.tune.report({...})``. An exception ends the trial as a failed result.
- **Its metrics**: a ``MetricSet`` (accelsweep.trainables.metrics) naming what the
  trainable reports, each with its unit and better direction, declared on the function
  with ``declare_metrics`` (or given as ``Sweep.metrics``). Objectives must name declared
  metrics; the summary's rows, the MLflow curves and the progress lines follow it.

Several objectives: ``SweepResult.best`` (and the summary's baseline-against-best table)
is the best trial of the first objective; ``SweepResult.pareto`` and the summary's Pareto
table hold every measured trial no other dominates (is at least as good on every objective
and better on one); the parent
run gets ``best_<metric>`` for each objective; early stopping stops a trial only when most
trials at its rung dominate it (``schedulers.ParetoStoppingRule``).

Ray: ``run_sweep`` uses the Ray instance this process has initialised (and leaves it
running), or starts one and shuts it down before it returns, also on failure. One it
starts is private (never a ``ray start`` cluster: address "auto" joins that) and does
not outlive the process, even a killed one (local_ray.py). An
``address`` other than that of the instance already initialised is refused. The
process-wide settings a sweep needs (Tune's logger and checkpoint variables, Ray's usage
stats, a logger's level) hold for the sweep only and are put back after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import glob
import inspect
import json
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from accelsweep.sweeps.driver.callbacks import FAILED, INTERRUPTED, REJECTED, REUSED, SweepCallback, TrialRecord
from accelsweep.sweeps.driver import local_ray
from accelsweep.sweeps.driver.deadline import check_trial_timeout, deadline_for
from accelsweep.sweeps.driver.preflight import check_fits_locally, check_ray_address, check_running_ray
from accelsweep.sweeps.driver.store_checks import (check_storage_path, check_study_storage, check_tracking_store,
                                                   claim_experiment_dir)
from accelsweep.sweeps.driver.storage_watch import StorageWatch, storage_error_stopped
from accelsweep.sweeps.driver.history import KNOBS_TAG, METRICS_TAG, SEARCHED_OUT_TAG, metrics_tag
from accelsweep.sweeps.driver.report import best_record, mean_overhead_s, pareto_set, summary
from accelsweep.sweeps.driver.study import SweepStudy, default_study_storage, validate_study_storage
from accelsweep.sweeps.driver.resume_check import check_same_sweep, defining_flags, storage_dir
from accelsweep.sweeps.driver.resumed_runs import LOST, keep_tuner_file, read_stopped_sweep, restore_tuner_file
from accelsweep.sweeps.driver.sweep_report import log_report
from accelsweep.sweeps.driver.space import (SearchSpace, SpaceSpec, describe_distribution, describe_reasons,
                                           quiet_optuna)
from accelsweep.sweeps.driver.stop_signals import StopSignals, SweepInterrupted
from accelsweep.sweeps.driver.verdict import verdict
from accelsweep.trainables.config import DictConfig, TrialConfig
from accelsweep.trainables.errors import MAX_SEED, ConfigError, one_of, positive_float, positive_int, random_seed
from accelsweep.trainables.cost import NO_BASIS_HINT, CostBasis
from accelsweep.trainables.environment import environment_tags
from accelsweep.trainables.failures import run_isolated
from accelsweep.trainables.metrics import MetricSet
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.capabilities import Capabilities, not_known
from accelsweep.trainables.rejection import REJECT_RATIO, BoardLimits, SweepBoard, TrialLimits
from accelsweep.trainables.secrets import mlflow_credentials_hidden, mlflow_credentials_restored, redact_uri, shown_uri
from accelsweep.trainables.tracking import open_tracker, validate_tracking_uri
from accelsweep.trainables.tracking_buffer import DEFAULT_WAIT_S, MLFLOW_REQUEST_SETTINGS

__all__ = ["Objective", "Plan", "Sweep", "SweepConfig", "SweepResult", "declare_metrics", "plan_sweep", "preflight",
           "remeasure", "run_sweep"]

SCHEDULERS = ("asha", "median", "none")
SAMPLERS = ("tpe", "grid")
MODES = ("max", "min")
DRY_RUN_SAMPLE_TRIALS = 3
TRAINABLE_SIGNATURE = "a function trainable(searched, base=..., cost=...) that reports through ray.tune.report"
CONFIG_PROTOCOL = ("a config with .platform (a platform name), .to_dict() (a flat dict) and a classmethod "
                   "from_dict(dict) that validates it (e.g. a SweepConfig subclass)")
# What the platforms read from a config to size a trial, for a config that has no such field.
RESOURCE_DEFAULTS = {"cpus_per_worker": 1, "workers": 1}


@dataclass(frozen=True)
class SweepConfig(DictConfig):
    """A base for a user's own config: the platform and the CPUs a trial holds, a flat
    dict each way. Subclass it as a frozen dataclass with fields of your own (with
    defaults), and check them in ``__post_init__`` (calling this one) with ConfigError:

        @dataclass(frozen=True)
        class MatmulConfig(SweepConfig):
            size: int = 256
            windows: int = 3
    """

    platform: str = "cpu"
    cpus_per_worker: int = 1
    workers: int = 1

    def __post_init__(self) -> None:
        get_platform(self.platform)  # a known name
        positive_int("cpus_per_worker", self.cpus_per_worker)
        positive_int("workers", self.workers)


def declare_metrics(metrics: Union[MetricSet, Callable[[Any], MetricSet]]) -> Callable[[Callable], Callable]:
    """Declare what a trainable reports: a decorator that sets ``fn.metrics``, where the
    driver reads it. ``metrics``: a MetricSet, or a function of the base config giving one.

        @declare_metrics(MetricSet(metrics=(Metric("gflops", "GFLOP/s", "max", ...),), headline=("gflops",)))
        def matmul_trainable(searched, base, cost=None): ...
    """
    if not isinstance(metrics, MetricSet) and not callable(metrics):
        raise ConfigError("metrics", "a MetricSet, or a function of the base config giving one", metrics)

    def declare(trainable: Callable) -> Callable:
        trainable.metrics = metrics
        return trainable

    return declare


@dataclass(frozen=True)
class Objective:
    metric: str = "throughput_samples_per_s"
    mode: str = "max"

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ConfigError("objective metric", "a result metric name", self.metric)
        one_of("objective mode", self.mode, MODES)


@dataclass
class Sweep:
    name: str
    trainable: Callable[..., None]  # (searched, base=..., cost=...), reports through tune.report
    base: Any  # the baseline config: the protocol in the module's docstring (e.g. a SweepConfig)
    space: SpaceSpec
    # The first is the one the best trial, the summary's table and ASHA go by; with
    # several, the Pareto set is reported and early stopping uses the Pareto rule.
    objectives: Sequence[Objective] = (Objective(),)
    # What the trainable reports (a MetricSet, or a function of the base config giving
    # one). None: what the trainable declares (``declare_metrics``: its ``metrics``).
    metrics: Union[MetricSet, Callable[[Any], MetricSet], None] = None
    num_samples: int = 16
    time_budget_s: Optional[float] = None
    scheduler: str = "asha"
    sampler: str = "tpe"  # "grid": every combination of the (categorical) space once
    seed: int = 0
    tracking_uri: str = "sqlite:///mlflow.db"
    # Seconds the sweep waits for a tracking store that stops answering, its MLflow writes
    # kept in order meanwhile (trainables/tracking_buffer.py: why 600); then it stops, the
    # writes saved under its experiment dir, written first on --resume.
    tracking_wait_s: float = DEFAULT_WAIT_S
    experiment: Optional[str] = None  # default: the sweep's name
    storage_path: Optional[str] = None
    # Ray cluster; None: the Ray instance this process has initialised, else a new local one.
    address: Optional[str] = None
    cost: Optional[CostBasis] = None
    cost_note: str = NO_BASIS_HINT
    max_concurrent_trials: Optional[int] = None  # None: as many as the resources fit
    platform_note: str = ""
    print_line: Optional[Callable[[str], None]] = None  # None: print (looked up when called)
    # Continue the newest unfinished run of this sweep under storage_path: finished trials
    # are kept, interrupted ones run again, each keeps its one MLflow run.
    resume: bool = False
    # Restarts of a trial whose process or node went away (a trial's own errors are never
    # retried: the same config would fail the same way, after the same compile).
    retries: int = 1
    # Figures measured before the trials (e.g. a precompile phase), logged on the parent run.
    parent_metrics: dict = field(default_factory=dict)
    # Work between the checks and the first trial, with Ray connected (seed 002's
    # precompile): (plan) -> figures logged on the parent run with parent_metrics. Not run
    # again on resume.
    before_trials: Optional[Callable[["Plan"], Mapping[str, float]]] = None
    # Keep the values the hardware only emulates (the base platform's ``capabilities``: bf16
    # on a CPU without bf16 instructions, ...) in the space; by default they are removed.
    keep_emulated: bool = False
    # A trial whose first steps project the first objective worse than the best so far by
    # more than this factor stops itself (trainables/rejection.py); None: never. Only with
    # one objective (with several, a trial slow on one may be on the Pareto set).
    reject_ratio: Optional[float] = REJECT_RATIO
    # Seconds a trial's compile (its first step, when it compiles) may take; past it the
    # trial fails with cause "compile". None: no limit.
    max_compile_s: Optional[float] = None
    # Seconds a trial may go without reporting (from its start, or its last report): past
    # it the driver kills its process tree and records it FAILED, cause "timeout", not
    # retried (sweeps/driver/deadline.py). None: no deadline. Must exceed the longest gap
    # between a trial's reports, its start (imports, a compile) included.
    trial_timeout_s: Optional[float] = None
    # Run a config again when the searcher proposes it again; by default its earlier
    # result is reused (tagged so in MLflow) and the searcher is told it.
    repeats: bool = False
    # Configs (knob -> value, points of the space) proposed first, in this order, before
    # the searcher's own; they replace the baseline-first rule (list the baseline to keep
    # it first). With ``repeats``, a config listed twice runs twice (``remeasure``).
    points: Sequence[Mapping[str, Any]] = ()
    # Where the sweep's Optuna study is kept (sweeps/driver/study.py): an SQLAlchemy URL;
    # None: beside a sqlite MLflow store (mlflow.db: mlflow.optuna.db), else under storage_path.
    study_storage: Optional[str] = None
    # At the end, the report (tables and plots) is logged on the parent run (sweep_report.py).
    report: bool = True


@dataclass
class SweepResult:
    """What ``run_sweep`` returns. Each record's ``run_id`` is its trial's MLflow run."""

    records: list[TrialRecord]
    best: Optional[TrialRecord]  # the best measured trial by the first objective
    baseline: Optional[TrialRecord]
    parent_run_id: str
    experiment_id: str
    summary: str
    # Measured trials no other dominates (as good on every objective, better on one),
    # best first by the first objective.
    pareto: list[TrialRecord] = field(default_factory=list)
    tracking_uri: str = ""
    mean_overhead_s: float = float("nan")
    extra: dict = field(default_factory=dict)


class _WithResourceDefaults:
    """A user's config as the platforms see it when sizing a trial: they read
    ``cpus_per_worker``, ``workers`` and the platform's ``knobs``, which such a config
    need not have (RESOURCE_DEFAULTS; the platform's default knobs)."""

    def __init__(self, config: Any):
        self._config = config

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._config, name)
        except AttributeError:
            if name in RESOURCE_DEFAULTS:
                return RESOURCE_DEFAULTS[name]
            if name == "knobs":
                return get_platform(self._config.platform).Knobs()
            raise


def _as_sized(config: Any) -> Any:
    if all(hasattr(config, name) for name in (*RESOURCE_DEFAULTS, "knobs")):
        return config
    return _WithResourceDefaults(config)


@dataclass
class Plan:
    """A validated sweep: what --dry-run prints and what run_sweep runs."""

    sweep: Sweep
    space: SearchSpace
    baseline_point: dict[str, Any]
    base_dict: dict[str, Any]
    metrics: Optional[MetricSet] = None  # what the trainable reports (declared)
    # What the base platform's hardware does natively; the space lacks what it only emulates.
    capabilities: Optional[Capabilities] = None

    def __getstate__(self):
        # Pickled into Tune's experiment state (tuner.pkl: the callback and the trials'
        # resources hold bound methods of the plan): the Sweep's URIs without credentials
        # (secrets.py), in a copy (the caller's Sweep is left as it is).
        sweep = self.sweep
        shown = dataclasses.replace(sweep, tracking_uri=shown_uri(sweep.tracking_uri),
                                    study_storage=sweep.study_storage and shown_uri(sweep.study_storage))
        return {**self.__dict__, "sweep": shown}

    def kept_emulated(self) -> dict[str, dict[Any, str]]:
        """The values the hardware only emulates that the space still offers (knob ->
        {value: why, and why it is kept}): the baseline's own, or all of them as asked."""
        if self.capabilities is None:
            return {}
        if not self.sweep.keep_emulated:
            return {knob: {value: f"{why}; kept: the baseline's value" for value, why in values.items()}
                    for knob, values in self.space.kept.items()}
        choices = {name: getattr(d, "choices", ()) for name, d in self.space.distributions.items()}
        kept = {knob: {value: f"{why}; kept, as asked" for value, why in values.items()
                       if value in choices.get(knob, ())}
                for knob, values in self.capabilities.emulated.items()}
        return {knob: values for knob, values in kept.items() if values}

    def capability_lines(self) -> list[str]:
        """The hardware, where it was read, and the values removed from the space (or kept),
        each with why: what --dry-run prints and the sweep's start says."""
        if self.capabilities is None:
            return []
        lines = [f"hardware: {self.capabilities.describe()}"]
        removed = "; ".join(f"{knob} {describe_reasons(values)}" for knob, values in self.space.removed.items())
        kept = self.kept_emulated()
        if removed:
            lines.append(f"removed from the space (only emulated here; --keep-emulated keeps them): {removed}")
        elif not kept:
            lines.append("removed from the space: nothing"
                         + ("" if self.capabilities.known else " (what this hardware emulates is not known)"))
        lines += [f"kept in the space: {knob} {describe_reasons(values)}" for knob, values in kept.items()]
        return lines

    def capability_tags(self) -> dict[str, str]:
        """The parent MLflow run's record of the same: hardware, source, and each removed
        (``removed.<knob>``) or kept (``kept.<knob>``) value with why."""
        if self.capabilities is None:
            return {}
        removed = self.space.removed
        tags = {"hardware": self.capabilities.hardware, "capability_source": self.capabilities.source,
                "removed_values": ", ".join(f"{knob}={value}" for knob, values in removed.items() for value in values)
                or "none"}
        tags.update({f"removed.{knob}": describe_reasons(values) for knob, values in removed.items()})
        tags.update({f"kept.{knob}": describe_reasons(values) for knob, values in self.kept_emulated().items()})
        return tags

    @property
    def objectives(self) -> list[tuple[str, str]]:
        return [(o.metric, o.mode) for o in self.sweep.objectives]

    def config_for(self, searched: Mapping[str, Any]) -> Any:
        """The trial's config: the base with the searched knobs over it. The one place
        the driver rebuilds a config from a dict (validated by the config's from_dict)."""
        return type(self.sweep.base).from_dict({**self.base_dict, **searched})

    def complete_config(self, searched: Mapping[str, Any]) -> dict[str, Any]:
        return self.config_for(searched).to_dict()

    def resources_of(self, searched: Mapping[str, Any]) -> dict[str, float]:
        config = _as_sized(self.config_for(searched))
        return dict(get_platform(config.platform).resources(config))

    def trial_env(self, searched: Mapping[str, Any]) -> dict[str, str]:
        config = self.config_for(searched)
        own_env = getattr(config, "trial_env", None)  # a kernel config knows its own (trainables/microbench.py)
        if own_env is not None:
            return own_env()
        platform = get_platform(config.platform)
        # The platform turns a training config's knobs into variables; any other config
        # gets what every process of the platform needs.
        return platform.trial_env(config) if isinstance(config, TrialConfig) else platform.runtime_env()

    def describe(self) -> str:
        sweep = self.sweep
        lines = [f"sweep {sweep.name!r} on platform {sweep.base.platform!r}"]
        if sweep.platform_note:
            lines.append(f"  ({sweep.platform_note})")
        lines += self.capability_lines()
        lines.append("search space:")
        lines += [f"  {line}" for line in self.space.describe()]
        lines.append("objectives: " + ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives))
        lines.append(f"budget: {sweep.num_samples} trials"
                     + (f", {sweep.time_budget_s:g} s" if sweep.time_budget_s else "")
                     + f"; early stopping: {early_stopping(sweep)}; seed {sweep.seed}")
        lines.append(sweep.cost_note)
        samples = [("baseline", self.baseline_point)]
        other_seed = (sweep.seed + 1) % (MAX_SEED + 1)  # not the search's own first proposals
        samples += [(f"sample {i}", p) for i, p in
                    enumerate(self.space.sample(DRY_RUN_SAMPLE_TRIALS, seed=other_seed), start=1)]
        for label, point in samples:
            resources = self.resources_of(point)
            lines.append(f"{label}: {point}")
            lines.append(f"  resources per trial: {resources}")
            lines.append(f"  trial environment: {self.trial_env(point)}")
            if sweep.cost is not None:
                lines.append(f"  cost basis: {sweep.cost.describe(resources)}")
        return "\n".join(lines)


def check_trainable(trainable: Any) -> None:
    """The trainable can be called as the trials call it: (searched, base=..., cost=...)."""
    name = getattr(trainable, "__name__", repr(trainable))
    if not callable(trainable):
        raise ConfigError("trainable", TRAINABLE_SIGNATURE, trainable)
    try:
        signature = inspect.signature(trainable)
    except (TypeError, ValueError):
        return  # a callable Python cannot describe (a builtin): the trial will say
    try:
        signature.bind({}, base={}, cost=None)
    except TypeError as error:
        raise ConfigError("trainable", TRAINABLE_SIGNATURE, f"{name}{signature}",
                          f"It cannot be called as trainable(searched, base=..., cost=...): {error}.") from None


def declared_metrics(sweep: Sweep) -> MetricSet:
    """The trainable's metrics: ``Sweep.metrics``, else what the trainable declares."""
    declared = sweep.metrics if sweep.metrics is not None else getattr(sweep.trainable, "metrics", None)
    if declared is None:
        name = getattr(sweep.trainable, "__name__", repr(sweep.trainable))
        raise ConfigError("metrics", "the MetricSet of what the trainable reports", None,
                          f"Trainable {name} declares none: decorate it with declare_metrics(MetricSet(...)) "
                          "(accelsweep.sweeps.driver.api, accelsweep.trainables.metrics), or give Sweep(metrics=...).")
    if not isinstance(declared, MetricSet) and callable(declared):
        declared = declared(sweep.base)
    if not isinstance(declared, MetricSet):
        raise ConfigError("metrics", "a MetricSet, or a function of the base config giving one", declared)
    return declared


def check_config_protocol(base: Any) -> dict[str, Any]:
    """The base config keeps the protocol (the module's docstring); its flat dict."""
    kind = type(base).__name__
    missing = [name for name, present in (("platform", hasattr(base, "platform")),
                                          ("to_dict()", callable(getattr(base, "to_dict", None))),
                                          ("from_dict()", callable(getattr(type(base), "from_dict", None))))
               if not present]
    if missing:
        raise ConfigError("base", CONFIG_PROTOCOL, kind, f"It has no {', '.join(missing)}.")
    get_platform(base.platform)  # a known platform name
    base_dict = base.to_dict()
    if not isinstance(base_dict, Mapping) or not all(isinstance(key, str) for key in base_dict):
        raise ConfigError("base", CONFIG_PROTOCOL, kind, f"Its to_dict() gave {base_dict!r}, not a dict of names.")
    nested = sorted(key for key, value in base_dict.items() if isinstance(value, Mapping))
    if nested:
        raise ConfigError("base", CONFIG_PROTOCOL, kind,
                          f"Its to_dict() is not flat: {', '.join(nested)} hold dicts (a search space sets "
                          "flat names).")
    try:
        type(base).from_dict(dict(base_dict))
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever it is, the protocol is broken here, not in a trial
        raise ConfigError("base", CONFIG_PROTOCOL, kind,
                          f"{kind}.from_dict(base.to_dict()) raised {type(error).__name__}: {error}.") from None
    for name in RESOURCE_DEFAULTS:
        if hasattr(base, name):
            positive_int(name, getattr(base, name))
    return dict(base_dict)


def plan_sweep(sweep: Sweep) -> Plan:
    """Validate everything about a sweep that can be checked without running it."""
    if not isinstance(sweep.name, str) or not sweep.name.strip():
        raise ConfigError("name", "a non-empty sweep name", sweep.name)
    positive_int("num_samples", sweep.num_samples)
    positive_int("retries", sweep.retries, minimum=0)
    random_seed("seed", sweep.seed)  # before the space is sampled with it
    if sweep.time_budget_s is not None and not (sweep.time_budget_s > 0 and math.isfinite(sweep.time_budget_s)):
        raise ConfigError("time_budget_s", "a number of seconds > 0, or None", sweep.time_budget_s)
    check_trial_timeout(sweep.trial_timeout_s)
    positive_float("tracking_wait_s", sweep.tracking_wait_s)
    one_of("scheduler", sweep.scheduler, SCHEDULERS)
    one_of("sampler", sweep.sampler, SAMPLERS)
    if not sweep.objectives:
        raise ConfigError("objectives", "at least one Objective", list(sweep.objectives))
    for objective in sweep.objectives:
        if not isinstance(objective, Objective):
            raise ConfigError("objectives", "Objective(metric, mode) each", objective)
    repeated = sorted({o.metric for o in sweep.objectives if [p.metric for p in sweep.objectives].count(o.metric) > 1})
    if repeated:
        raise ConfigError("objectives", "one per metric", repeated)
    check_trainable(sweep.trainable)
    base_dict = check_config_protocol(sweep.base)
    metrics = declared_metrics(sweep)
    for objective in sweep.objectives:
        metrics.check_objective(objective.metric, objective.mode)
    if sweep.max_concurrent_trials is not None:
        positive_int("max_concurrent_trials", sweep.max_concurrent_trials)
    validate_tracking_uri(sweep.tracking_uri)
    if sweep.study_storage is not None:
        validate_study_storage(sweep.study_storage)
    trial_limits_of(sweep)  # checks reject_ratio and max_compile_s

    # Values the base platform's hardware only emulates leave the space (the baseline's own
    # stay: it must be a point of it), unless the sweep keeps them.
    capabilities = get_platform(sweep.base.platform).capabilities(_as_sized(sweep.base))
    if capabilities.read_here and sweep.address and sweep.address != "local":
        capabilities = not_known(capabilities.hardware, f"read on this driver, but trials run on the cluster at "
                                                        f"{sweep.address}, whose nodes may have other hardware")
    space = SearchSpace(sweep.space, remove=None if sweep.keep_emulated else capabilities.emulated, keep=base_dict)
    plan = Plan(sweep=sweep, space=space, baseline_point={}, base_dict=base_dict, metrics=metrics,
                capabilities=capabilities)
    # Proposals first: a knob the platform refuses is named with the platform's reason,
    # before the baseline's value of it is looked up.
    for point in space.sample(64, seed=sweep.seed):
        try:
            plan.config_for(point)
        except ConfigError as error:
            if error.field == "config key":
                break  # a name no config has: point_for says so below, naming the fields
            raise ConfigError(error.field, "valid for every config the search space can propose",
                              point, f"Refused: {error}") from None
    plan.baseline_point = space.point_for(base_dict)
    _check_points(plan)
    if sweep.sampler == "grid":
        from optuna.distributions import CategoricalDistribution

        for name, distribution in space.distributions.items():
            if not isinstance(distribution, CategoricalDistribution):
                raise ConfigError(f"search space knob {name}", "categorical for sampler 'grid'",
                                  type(distribution).__name__)
    return plan


def _check_points(plan: Plan) -> None:
    """Each of ``Sweep.points`` names every knob of the space with a value it holds, and
    makes a valid config."""
    sweep = plan.sweep
    if sweep.points and sweep.sampler != "tpe":
        raise ConfigError("points", "none with sampler 'grid' (a grid runs every point once)", list(sweep.points))
    knobs = plan.space.distributions
    for index, point in enumerate(sweep.points):
        field_name = f"points[{index}]"
        if not isinstance(point, Mapping) or not set(point) <= set(knobs):
            raise ConfigError(field_name, f"a mapping of the space's knobs {sorted(knobs)} to values", point)
        for knob, value in point.items():
            if not _holds(knobs[knob], value):
                raise ConfigError(f"{field_name}.{knob}", describe_distribution(knobs[knob]), value)
        plan.config_for(point)  # a ConfigError names the field


def _holds(distribution, value: Any) -> bool:
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except ValueError:  # a categorical's value not among its choices
        return False


def remeasure(sweep: Sweep, configs: Sequence[Mapping[str, Any]], times: int = 5, name: Optional[str] = None) -> Sweep:
    """``sweep`` narrowed to measuring each of ``configs`` ``times`` times, interleaved
    (c1, c2, c1, c2, ...: a drift of the machine's speed spreads over all of them), with
    nothing stopped early or rejected: how repeatable a figure is, or the top configs of a
    finished sweep measured again. Its trial runs say which config they repeat (their
    ``searched`` tag)."""
    positive_int("times", times)
    if not configs:
        raise ConfigError("configs", "at least one config to measure again", list(configs))
    points = [dict(config) for _ in range(times) for config in configs]
    return dataclasses.replace(sweep, name=name or f"{sweep.name}-remeasure", points=points,
                               num_samples=len(points), repeats=True, scheduler="none", reject_ratio=None,
                               sampler="tpe", time_budget_s=None)


def preflight(sweep: Sweep) -> Plan:
    """``plan_sweep`` plus the checks against where the sweep will run (sweeps/driver/
    preflight.py, store_checks.py); ``run_sweep`` runs it before anything else. The tracking
    store, the study's database and the storage path must take writes; a cluster's address
    must answer; a local run's trials must fit this machine. A Ray instance the caller has
    initialised already is theirs to size (it may be a cluster): an address given must be
    its own."""
    import ray

    plan = plan_sweep(sweep)
    # Where the sweep writes takes writes: each refused in seconds (store_checks.py).
    unchecked = check_tracking_store(sweep.tracking_uri)
    if unchecked:
        (sweep.print_line or print)(unchecked)
    if sweep.study_storage is not None:
        check_study_storage(sweep.study_storage)
    check_storage_path(storage_dir(sweep))
    if ray.is_initialized():
        check_running_ray(sweep.address, ray.get_runtime_context().gcs_address)
    elif sweep.address and sweep.address != "local":
        check_ray_address(sweep.address)
    else:
        check_fits_locally(plan)
    if sweep.resume:  # the stopped run's defining flags against this command's (resume_check.py)
        experiment_dir = unfinished_sweep_dir(storage_dir(sweep), sweep.name)
        check_same_sweep(plan, read_sweep_marker(experiment_dir), experiment_dir)
    return plan


def connect_ray(address: Optional[str]) -> str:
    """Connect to the cluster at ``address``, or start a private local instance (None,
    "local") that stops with this process, stopping first any a killed driver left
    (local_ray.py). A Ray instance this process has initialised already is used as it is."""
    import ray

    if ray.is_initialized():
        return "using the Ray instance already initialised"
    if address and address != "local":
        check_ray_address(address)  # ray.init retries an unreachable address for minutes
        with ray_adapter.sigterm_handler_kept():  # the sweep's own (stop_signals.py)
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        return f"connected to Ray at {address}"
    # A private local instance that does not outlive this process, never a `ray start`
    # cluster a bare ray.init() would join (local_ray.py). Its processes inherit this
    # environment: not the tracking server's credentials.
    with mlflow_credentials_hidden():
        return local_ray.start()


def concurrency_for(per_trial: Mapping[str, float], sweep: Sweep) -> tuple[int, str]:
    """How many trials fit at once in the cluster's current resources."""
    import ray

    if sweep.max_concurrent_trials:
        return sweep.max_concurrent_trials, "as asked"
    total = ray.cluster_resources()
    fits = []
    for resource, amount in per_trial.items():
        if amount <= 0:
            continue
        if total.get(resource, 0) < amount:
            return 1, (f"the cluster has {total.get(resource, 0):g} {resource} now and a trial needs {amount:g}: "
                       "running one trial at a time while the autoscaler adds nodes")
        fits.append(int(total[resource] // amount))
    slots = max(1, min(fits) if fits else 1)
    return min(slots, sweep.num_samples), f"{slots} trial(s) fit in the cluster's resources"


def startup_trials(sweep: Sweep) -> int:
    """TPE's random start-up proposals: seeded, so known before any result."""
    return min(10, max(2, sweep.num_samples // 3))


def _searcher(plan: Plan, sweep_token: str = ""):
    import optuna

    from accelsweep.sweeps.driver.searchers import FailureAwareOptunaSearch

    sweep = plan.sweep
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    if sweep.sampler == "grid":
        grid = {name: list(d.choices) for name, d in plan.space.distributions.items()}
        sampler = optuna.samplers.GridSampler(grid, seed=sweep.seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=sweep.seed,
                                             n_startup_trials=startup_trials(sweep))
    # TPE runs the baseline first; a grid reaches it anyway (it is one of its points).
    first = None
    if sweep.sampler == "tpe":
        first = [dict(point) for point in sweep.points] or [plan.baseline_point]
    return FailureAwareOptunaSearch(plan.space.define_by_run, metric=metrics if len(metrics) > 1 else metrics[0],
                        mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                        points_to_evaluate=first, seed=sweep.seed, repeats=sweep.repeats, sweep_token=sweep_token,
                        budget=sweep.num_samples)


def early_stopping(sweep: Sweep) -> str:
    """The early stopping the sweep gets, in words (the plan and the start say it)."""
    if sweep.scheduler == "none":
        return "none"
    rejection = (f"; a trial projected more than {sweep.reject_ratio:g}x worse than the best so far in its first "
                 "steps stops then" if rejects(sweep) else "")
    if getattr(sweep.base, "windows", 1) < 2:
        return f"none ({sweep.scheduler} needs a config with windows >= 2: a trial reports once){rejection}"
    if len(sweep.objectives) > 1:
        return "Pareto rule (several objectives: a trial stops when most at its rung dominate it)"
    return sweep.scheduler + rejection


def _scheduler(plan: Plan):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    from accelsweep.sweeps.driver.schedulers import ParetoStoppingRule

    sweep = plan.sweep
    windows = getattr(sweep.base, "windows", 1)
    if sweep.scheduler == "none" or windows < 2:
        return FIFOScheduler()
    if len(sweep.objectives) > 1:
        # ASHA and the median rule rank by one metric: they would stop a trial for the
        # first objective alone, though it may be on the Pareto set.
        return ParetoStoppingRule(plan.objectives, grace_period=1, max_t=windows)
    objective = sweep.objectives[0]
    if sweep.scheduler == "asha":
        return ASHAScheduler(time_attr="training_iteration", metric=objective.metric, mode=objective.mode,
                             max_t=windows, grace_period=1, reduction_factor=2)
    return MedianStoppingRule(time_attr="training_iteration", metric=objective.metric, mode=objective.mode,
                              grace_period=1, min_samples_required=3)


def _trial_resources(config_for: Callable[[Mapping[str, Any]], Any], fallback: Mapping[str, float],
                     searched: Mapping[str, Any]) -> dict[str, float]:
    """What Tune reserves for one trial's process (``config_for``: Plan.config_for).
    Module-level so Tune can pickle it."""
    try:
        config = _as_sized(config_for(searched))
    except ConfigError:
        return dict(fallback)  # the trial itself then fails with the config error, on record
    return dict(get_platform(config.platform).trial_actor_resources(config))


SWEEP_MARKER = "accelsweep-sweep.json"


def _write_sweep_marker(experiment_dir: str, parent_run_id: str, status: str,
                        defines: Optional[Mapping[str, Any]] = None) -> None:
    """What --resume needs besides Tune's state: the MLflow parent run, whether the sweep
    ended (a finished sweep is not resumed), and what defines it (``defines``, written at
    the start and kept: resume_check.py; no credential in it). Replaced whole (a rename):
    a driver killed while writing leaves the previous marker."""
    os.makedirs(experiment_dir, exist_ok=True)
    marker = {**read_sweep_marker(experiment_dir), "parent_run_id": parent_run_id, "status": status}
    if defines is not None:
        marker["defines"] = dict(defines)
    path = os.path.join(experiment_dir, SWEEP_MARKER)
    with open(path + ".tmp", "w") as new:
        json.dump(marker, new)
    os.replace(path + ".tmp", path)


def read_sweep_marker(experiment_dir: str) -> dict[str, Any]:
    """The marker of the sweep in ``experiment_dir``; {} when it has none, or one cut
    short (by a driver killed as it wrote it, before markers were replaced whole)."""
    try:
        with open(os.path.join(experiment_dir, SWEEP_MARKER)) as marker:
            return json.load(marker)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def unfinished_sweep_dir(storage: str, name: str) -> str:
    """The newest run of sweep ``name`` under ``storage`` that did not finish."""
    candidates = []
    for marker_path in glob.glob(os.path.join(storage, f"{name}-*", SWEEP_MARKER)):
        directory = os.path.dirname(marker_path)
        status = read_sweep_marker(directory).get("status")
        if status != "finished" and os.path.exists(os.path.join(directory, "tuner.pkl")):
            candidates.append(directory)
    if not candidates:
        raise ConfigError("--resume", f"a stopped run of sweep {name!r} under {storage} (a {name}-* directory "
                                      "with Tune's state that did not finish)", "none found",
                          "Start it without --resume, or pass the --storage-path it ran with.")
    return max(candidates, key=os.path.getmtime)


def _callback_of(tuner) -> SweepCallback:
    """The SweepCallback Tuner.restore unpickled with the run config."""
    found = [c for c in ray_adapter.restored_callbacks(tuner) if isinstance(c, SweepCallback)]
    if len(found) != 1:
        raise RuntimeError(f"the restored sweep has {len(found)} SweepCallbacks, expected 1 (Ray's Tuner changed?)")
    return found[0]


@dataclass
class _Run:
    """A sweep's Tune experiment, started or resumed, and what is needed to finish it."""

    tuner: Any
    callback: SweepCallback
    experiment_dir: str
    parent_run_id: str


def run_sweep(sweep: Sweep) -> SweepResult:
    """Check the sweep against where it runs (``preflight``), connect to Ray, start or
    resume it, run every trial and summarise. Nothing starts when a check fails.

    Callable many times in one process (a notebook), each sweep with its own store and
    experiment. A Ray instance this call started is shut down before it returns (also
    when the sweep fails); one the caller had initialised is left running. Process-wide
    settings (``sweep_settings``) are put back as they were.

    SIGINT or SIGTERM (on the main thread) stops the sweep cleanly, then raises
    ``SweepInterrupted`` (stop_signals.py): running trials end as interrupted, and the
    same sweep with ``resume=True`` continues it. A storage path that fills up (or turns
    read-only) meanwhile stops it the same way, then raises SweepStopped (storage_watch.py)."""
    import ray

    started = time.monotonic()
    with StopSignals(sweep.print_line) as stop:
        plan = preflight(sweep)  # a signal meanwhile: acted on once it is done (a store may be created)
        stop.raise_if_requested()
        ray_was_running = ray.is_initialized()
        with sweep_settings(), mlflow_credentials_restored():  # a server's credentials: set by SweepTracker
            try:
                result = _run(plan, started, stop)
            except OSError as error:  # a write of the sweep's own on a disk that filled up or went read-only
                stopped = storage_error_stopped(error, storage_dir(sweep))
                if stopped is None:
                    raise
                raise stopped from None
            finally:
                if not ray_was_running and ray.is_initialized():
                    local_ray.shutdown()  # the instance this sweep started: nothing else uses it
        stop.raise_if_requested(result)
        return result


# Set for a sweep's duration only (sweep_settings); a value the caller set is kept.
SWEEP_ENVIRONMENT = {
    # Every result goes to MLflow through SweepCallback; Tune's own CSV/JSON/TensorBoard
    # loggers would only add per-result file writes to each trial's overhead.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # Tune saves the experiment (trials, searcher, our callback's state) this often: what
    # a killed driver can lose, and what --resume picks up from.
    "TUNE_GLOBAL_CHECKPOINT_S": "5",
    "RAY_USAGE_STATS_ENABLED": "0",  # read by ray.init (connect_ray)
    **MLFLOW_REQUEST_SETTINGS,  # short retries per request: the tracker's buffer waits out an outage
}
# ...with Tune's loggers off, Tune's result grid finds no result files: it need not say
# so. And ray.init sets the level of Ray's own logger.
SWEEP_LOGGER_LEVELS = {"ray.tune.analysis.experiment_analysis": logging.ERROR, "ray": None}


@contextlib.contextmanager
def sweep_settings() -> Iterator[None]:
    """The process-wide settings a sweep needs, for the sweep's duration: the variables
    of SWEEP_ENVIRONMENT (a value already set is kept), the loggers' levels and Optuna's
    verbosity, all put back as they were when it ends (a user's own Tune run afterwards
    gets Tune's loggers)."""
    saved_env = {name: os.environ.get(name) for name in SWEEP_ENVIRONMENT}
    saved_levels = {name: logging.getLogger(name).level for name in SWEEP_LOGGER_LEVELS}
    try:
        for name, value in SWEEP_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        for name, level in SWEEP_LOGGER_LEVELS.items():
            if level is not None:
                logging.getLogger(name).setLevel(level)
        with quiet_optuna():  # the searcher's study
            yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def _run(plan: Plan, started: float, stop: StopSignals) -> SweepResult:
    sweep = plan.sweep
    say = sweep.print_line or (lambda line: print(line, flush=True))
    tracker = open_tracker(sweep.tracking_uri, sweep.experiment or sweep.name, sweep.tracking_wait_s, say)
    concurrency = _connect_and_announce(plan, say)
    stop.claim()  # ray.init put its core worker's C++ SIGTERM handler over the sweep's
    stop.raise_if_requested()
    parent_metrics = dict(sweep.parent_metrics)  # the Sweep is the caller's: not changed
    if sweep.before_trials is not None and not sweep.resume:
        with stop.at_once():
            parent_metrics.update(sweep.before_trials(plan))
    # The sweep's best so far, which each trial reads as it starts (rejection); one per run
    # of the driver: a resumed sweep's is filled again from the records Tune restores.
    board_name = f"accelsweep-board-{uuid.uuid4().hex[:12]}" if rejects(sweep) else None
    # Held here for the sweep's duration: Ray ends a named actor with its last handle.
    board = SweepBoard.start(board_name, sweep.objectives[0].mode) if board_name else None
    trainable = _tune_trainable(plan, board_name)
    storage = storage_dir(sweep)
    stop.raise_if_requested()  # the last moment at which nothing of the sweep is written
    if sweep.resume:
        run = _resume(plan, trainable, storage, tracker, say)
    else:
        run = _start(plan, trainable, storage, tracker, concurrency)
    run.callback.board_name, run.callback._board = board_name, board
    run.callback.deadline = deadline_for(sweep.trial_timeout_s)  # this run's flag, also on --resume
    watch = run.callback.storage_watch = StorageWatch(storage, sweep.print_line)  # stops it before the disk is full
    status = "FAILED"
    try:
        with stop.through_tune(), tracker.buffer.stopping_tune(), watch.stopping_tune():
            run.tuner.fit()  # stopped as it begins after a signal meanwhile: its state saved for --resume
        if not stop.requested:
            tracker.buffer.drain()  # MLflow writes kept while its store was away: written, or given up on
        interrupted = stop.requested or tracker.buffer.gave_up or watch.tripped or any(
            r.status == INTERRUPTED for r in run.callback.records.values())
        status = "KILLED" if interrupted else "FINISHED"
    except SweepInterrupted:  # a second signal: Tune's loop was not waited for
        run.callback.on_experiment_end(trials=[])  # the trials still running end as interrupted
        status = "KILLED"
    finally:
        result = _finish(plan, run, tracker, status, time.monotonic() - started, parent_metrics)
    say(result.summary)
    if not stop.requested:
        tracker.buffer.drain()  # the end's own writes (its report), should the store go away then
    if tracker.buffer.gave_up:
        _write_sweep_marker(run.experiment_dir, run.parent_run_id, INTERRUPTED)  # for --resume, also if it ended
        raise tracker.buffer.stopped()  # says where its writes are, and to --resume
    if watch.tripped:
        raise watch.stopped()  # how much is free, and to --resume once there is room
    if status == "KILLED":
        say(f"interrupted: run the same command with --resume to continue {run.experiment_dir}")
    return result


def _connect_and_announce(plan: Plan, say: Callable[[str], None]) -> int:
    """Connect to Ray and say what will run; returns how many trials run at once."""
    sweep = plan.sweep
    say(connect_ray(sweep.address))
    baseline_resources = plan.resources_of(plan.baseline_point)
    concurrency, why = concurrency_for(baseline_resources, sweep)
    say(f"{sweep.name}: up to {sweep.num_samples} trials, {concurrency} at a time ({why}); "
        f"each trial holds {baseline_resources}; early stopping: {early_stopping(sweep)}")
    if sweep.platform_note:
        say(f"platform: {sweep.platform_note}")
    for line in plan.capability_lines():
        say(line)
    say(sweep.cost_note)
    return concurrency


def trial_limits_of(sweep: Sweep) -> TrialLimits:
    """What each trial of ``sweep`` may cost before it stops itself (without the best so
    far: trials read it from the sweep's board when they start)."""
    if sweep.reject_ratio is not None and not (isinstance(sweep.reject_ratio, (int, float))
                                               and sweep.reject_ratio > 1 and math.isfinite(sweep.reject_ratio)):
        raise ConfigError("reject_ratio", "a number > 1 (how many times worse than the best so far a projection "
                                          "may be), or None to never reject", sweep.reject_ratio)
    if sweep.max_compile_s is not None and not reads_trial_limits(sweep.trainable):
        raise ConfigError("max_compile_s", "None for a trainable that does not apply the trial limits "
                                           "(set reads_trial_limits = True on one that reads current_limits())",
                          sweep.max_compile_s)
    first = sweep.objectives[0]
    return TrialLimits(first.metric, first.mode, ratio=sweep.reject_ratio or REJECT_RATIO,
                       max_compile_s=sweep.max_compile_s)


def reads_trial_limits(trainable: Callable) -> bool:
    """Whether the trainable applies the sweep's limits (accelsweep.trainables.rejection
    current_limits: the built-in training loop does; a kernel's microbenchmark does not)."""
    return bool(getattr(trainable, "reads_trial_limits", False))


def rejects(sweep: Sweep) -> bool:
    """Whether trials stop themselves on a hopeless projection: early stopping of a kind,
    so not with scheduler "none" (a study that measures every config), nor with several
    objectives (a trial slow on the first may be on the Pareto set), nor for a trainable
    that does not read the limits."""
    return (sweep.reject_ratio is not None and sweep.scheduler != "none" and len(sweep.objectives) == 1
            and reads_trial_limits(sweep.trainable))


def _tune_trainable(plan: Plan, board_name: Optional[str]):
    """The sweep's trainable as Tune runs it: isolated (its failures become results),
    with the base config and cost basis bound, and each trial's own resources."""
    from ray import tune

    sweep = plan.sweep
    objective_metrics = [o.metric for o in sweep.objectives]
    limits = BoardLimits(board_name, trial_limits_of(sweep))
    isolated = functools.partial(run_isolated, trainable=sweep.trainable, objective_metrics=objective_metrics,
                                 limits=limits)
    baseline_actor = _trial_resources(plan.config_for, {}, plan.baseline_point)
    resources = functools.partial(_trial_resources, plan.config_for, baseline_actor)
    return tune.with_resources(tune.with_parameters(isolated, base=plan.base_dict, cost=sweep.cost), resources)


def _resume(plan: Plan, trainable, storage: str, tracker, say: Callable[[str], None]) -> _Run:
    """Tune's saved experiment and our callback in it, back on their MLflow parent run."""
    from ray import tune

    sweep = plan.sweep
    experiment_dir = unfinished_sweep_dir(storage, sweep.name)
    tracker.buffer.keep_in(experiment_dir)  # MLflow writes the stopped run kept (its store was away): first
    restore_tuner_file(experiment_dir)  # a kill during a resumed run's save may have cut it short
    tuner = tune.Tuner.restore(experiment_dir, trainable, resume_unfinished=True, resume_errored=False)
    callback = _callback_of(tuner)
    callback._tracker, callback.print_line = tracker, sweep.print_line
    # Pickled without a database password (secrets.py): this command's, checked the same
    # store in preflight (resume_check.py).
    callback.tracking_uri = tracker.tracking_uri
    if callback.study is not None:
        callback.study.url = sweep.study_storage or default_study_storage(sweep.tracking_uri, storage)
    parent_run_id = tracker.parent_run_id = tracker.buffer.run_id_of(callback.parent_run_id)
    tracker.reopen(parent_run_id, tags={"status": "running", "resumed": datetime.datetime.now().isoformat()})
    # What the killed driver did after Tune's last save, from MLflow (resumed_runs.py): the
    # callback takes it with its saved records when fit() starts (set_state).
    callback.stopped = read_stopped_sweep(experiment_dir, tracker)
    if callback.stopped.saved_trials is None:  # killed before Tune's first save: no trial had started
        ray_adapter.start_afresh(tuner)
    say(f"resuming {experiment_dir} (MLflow parent run {parent_run_id})")
    return _Run(tuner, callback, experiment_dir, parent_run_id)


def _start(plan: Plan, trainable, storage: str, tracker, concurrency: int) -> _Run:
    """A new MLflow parent run and a new Tune experiment for the sweep."""
    from ray import tune

    sweep = plan.sweep
    env_tags = environment_tags()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    sweep_tags = {**env_tags, "sweep": sweep.name, "platform": sweep.base.platform, "kind": "sweep",
                  "instance_type": (sweep.cost.instance_type if sweep.cost else None) or "unknown",
                  "cost_basis": sweep.cost_note, "status": "running", **plan.capability_tags()}
    parent_params = {f"base.{k}": v for k, v in plan.base_dict.items()}
    parent_params.update({"num_samples": sweep.num_samples, "time_budget_s": sweep.time_budget_s,
                          "scheduler": sweep.scheduler, "seed": sweep.seed, "max_concurrent_trials": concurrency,
                          "objectives": ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives),
                          "reject_ratio": sweep.reject_ratio if rejects(sweep) else None,
                          "max_compile_s": sweep.max_compile_s, "trial_timeout_s": sweep.trial_timeout_s,
                          "repeats": sweep.repeats,
                          "search_space": "; ".join(plan.space.describe()), "keep_emulated": sweep.keep_emulated})
    study = _study(plan, storage, f"{sweep.name}-{stamp}")
    study.claim()  # its name is the parent run's, unique in the database (two sweeps in one second)
    sweep_tags.update({METRICS_TAG: metrics_tag(plan.metrics), KNOBS_TAG: json.dumps(list(plan.space.distributions)),
                       "optuna_study": study.name, "optuna_storage": redact_uri(study.url)})
    parent_run_id = tracker.start_sweep(study.name, parent_params, sweep_tags)
    trial_tags = {**env_tags, "sweep": sweep.name, "platform": sweep.base.platform,
                  "instance_type": sweep_tags["instance_type"]}
    callback = SweepCallback(tracker, plan.complete_config, plan.resources_of, plan.baseline_point,
                             sweep.cost, trial_tags, sweep.num_samples, print_line=sweep.print_line,
                             time_budget_s=sweep.time_budget_s, metrics=plan.metrics,
                             objective_metrics=[metric for metric, _ in plan.objectives],
                             sweep_token=f"{sweep.name}-{stamp}-{uuid.uuid4().hex[:8]}", study=study)
    experiment_dir = claim_experiment_dir(storage, study.name)  # another sweep's of the same second not shared
    tracker.buffer.keep_in(experiment_dir)  # where MLflow writes are kept if its store stops answering
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=_searcher(plan, callback.sweep_token), scheduler=_scheduler(plan),
                                    num_samples=sweep.num_samples, time_budget_s=sweep.time_budget_s,
                                    max_concurrent_trials=concurrency,
                                    reuse_actors=get_platform(sweep.base.platform).reuses_processes),
        run_config=tune.RunConfig(name=os.path.basename(experiment_dir), storage_path=storage,
                                  callbacks=[callback], verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=sweep.retries)),
    )
    # After Tune's tuner.pkl: a sweep with a marker can always be resumed (resumed_runs.py).
    keep_tuner_file(experiment_dir)
    _write_sweep_marker(experiment_dir, parent_run_id, "running", defines=defining_flags(plan))
    return _Run(tuner, callback, experiment_dir, parent_run_id)


def _study(plan: Plan, storage: str, name: str) -> SweepStudy:
    """The sweep's Optuna study (named after its parent run) in its database."""
    sweep = plan.sweep
    url = sweep.study_storage
    if url is None:
        url = default_study_storage(sweep.tracking_uri, storage)
        if url.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(url[len("sqlite:///"):]), exist_ok=True)
    return SweepStudy(url, name, plan.objectives, plan.space.distributions)


def _finish(plan: Plan, run: _Run, tracker, status: str, elapsed_s: float,
            parent_metrics: Mapping[str, float]) -> SweepResult:
    """Close what the driver left running, mark the sweep ended, and summarise it on
    its parent run (also after a failed or interrupted fit)."""
    from accelsweep.sweeps.driver.searchers import searched_out

    sweep = plan.sweep
    run.callback.adopt_run_ids()  # of runs created while MLflow's store was away, written since
    run.parent_run_id = tracker.parent_run_id = tracker.buffer.run_id_of(run.parent_run_id)
    # A store that does not answer can be read nothing from: --resume closes what is left open.
    for run_id, tags in (tracker.trial_runs(only_running=True) if tracker.buffer.answering else {}).items():
        if tags.get("status") == REUSED:  # a reused proposal's run its driver died before closing
            tracker.finish(run_id, "FINISHED")
            continue
        if status == "KILLED":  # the sweep was interrupted (a signal): --resume runs it again
            tracker.finish(run_id, "KILLED", tags={"status": INTERRUPTED})
            continue
        # A run left RUNNING by a driver that died, whose trial the resumed sweep did not run
        # again (resumed_runs.py proposes it first: its time budget or search ended before).
        tracker.finish(run_id, "FAILED", tags={"status": "failed", "error_class": LOST, "error_cause": "killed",
                                               "error": "its sweep's driver stopped while it ran, and the resumed "
                                                        "sweep ended before running it again"})
    records = sorted(run.callback.records.values(), key=lambda r: r.number)
    records = [r for r in records if r.run_id is not None]
    first_metric, first_mode = plan.objectives[0]
    best = best_record(records, first_metric, first_mode)
    baseline = next((r for r in records if r.is_baseline), None)
    pareto = pareto_set(records, plan.objectives)
    text = summary(f"{sweep.name} on {sweep.base.platform}", records, first_metric, first_mode,
                   list(plan.space.distributions), sweep.cost_note, tracker.ui_command(),
                   elapsed_s, metrics=plan.metrics, objectives=plan.objectives, planned_trials=sweep.num_samples,
                   searched_out=searched_out(run.callback.sweep_token))
    figures = {**parent_metrics, "trials": len(records),
               "failed_trials": sum(r.status == FAILED for r in records),
               "rejected_trials": sum(r.status == REJECTED for r in records),
               "rejected_s": sum(r.wall_s for r in records if r.status == REJECTED and math.isfinite(r.wall_s)),
               "reused_proposals": sum(r.status == REUSED for r in records),
               "mean_overhead_s": mean_overhead_s(records), "pareto_trials": len(pareto)}
    judged = verdict(baseline, best, first_metric, first_mode, records)
    if judged is not None:
        figures.update(judged.figures())
    for metric, mode in plan.objectives:  # each objective's own best, and the baseline's
        best_of_it = best_record(records, metric, mode)
        if best_of_it is not None:
            figures[f"best_{metric}"] = best_of_it.metric(metric)
        if baseline is not None and baseline.measured(metric):
            figures[f"baseline_{metric}"] = baseline.metric(metric)
    tracker.finish(run.parent_run_id, status, metrics=figures,
                   tags={"status": "interrupted" if status == "KILLED" else status.lower(),
                         "best_trial": str(best.number) if best else "none",
                         "pareto_trials": ", ".join(str(r.number) for r in pareto) or "none",
                         "verdict": judged.text if judged is not None else "none: no baseline or best measured",
                         SEARCHED_OUT_TAG: str(searched_out(run.callback.sweep_token)).lower()})
    if sweep.report and tracker.buffer.answering:  # the report reads the store
        log_report(tracker, run.parent_run_id, study=run.callback.study, say=sweep.print_line)
    # Last: a driver killed before this leaves a sweep --resume finishes (its parent run closed).
    _write_sweep_marker(run.experiment_dir, run.parent_run_id, INTERRUPTED if status == "KILLED" else status.lower())
    return SweepResult(records=records, best=best, baseline=baseline, parent_run_id=run.parent_run_id,
                       experiment_id=tracker.experiment_id, summary=text, pareto=pareto,
                       tracking_uri=tracker.tracking_uri, mean_overhead_s=mean_overhead_s(records))

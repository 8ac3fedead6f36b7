"""The sweep-building API: what every script in sweeps/ calls, and what users call.

    from accelsweep.sweeps.driver.api import Objective, Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.trainable import train_trainable

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast"])

    result = run_sweep(Sweep(name="my_study", trainable=train_trainable,
                             base=TrialConfig(model="vit-tiny"), space=space, num_samples=8))

A sweep is validated whole before anything starts: the base config, every config the
space can propose (sampled), the objectives, the tracking URI, the platform. Then the
base config runs first as the baseline, a seeded Optuna TPE search proposes the rest,
ASHA (or the median rule) stops hopeless trials after a window, trial processes are
reused so torch is imported once per process, and every trial becomes one nested
MLflow run under one parent run for the sweep.
"""

from __future__ import annotations

import datetime
import functools
import glob
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.callbacks import INTERRUPTED, SweepCallback, TrialRecord
from accelsweep.sweeps.driver.preflight import check_fits_locally, check_ray_address
from accelsweep.sweeps.driver.report import best_record, mean_overhead_s, summary
from accelsweep.sweeps.driver.space import SearchSpace, SpaceSpec
from accelsweep.trainables.errors import ConfigError, one_of, positive_int
from accelsweep.trainables.cost import NO_BASIS_HINT, CostBasis
from accelsweep.trainables.environment import environment_tags
from accelsweep.trainables.failures import run_isolated
from accelsweep.trainables.metrics import MetricSet
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.tracking import validate_tracking_uri

SCHEDULERS = ("asha", "median", "none")
SAMPLERS = ("tpe", "grid")
MODES = ("max", "min")
DRY_RUN_SAMPLE_TRIALS = 3


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
    base: Any  # a config dataclass with .platform, .to_dict() and .from_dict(): the baseline
    space: SpaceSpec
    objectives: Sequence[Objective] = (Objective(),)
    # What the trainable reports (trainables/metrics.py: TRAINING_METRICS, KERNEL_METRICS):
    # objectives are checked against it; the summary rows, per-window curves and progress
    # lines come from it. None: objectives unchecked, shown as the training loop's.
    metrics: Optional[MetricSet] = None
    num_samples: int = 16
    time_budget_s: Optional[float] = None
    scheduler: str = "asha"
    sampler: str = "tpe"  # "grid": every combination of the (categorical) space once
    seed: int = 0
    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: Optional[str] = None  # default: the sweep's name
    storage_path: Optional[str] = None
    address: Optional[str] = None  # Ray cluster; None: a local Ray instance
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
    # precompile): (plan) -> figures added to parent_metrics. Not run again on resume.
    before_trials: Optional[Callable[["Plan"], Mapping[str, float]]] = None


@dataclass
class SweepResult:
    records: list[TrialRecord]
    best: Optional[TrialRecord]
    baseline: Optional[TrialRecord]
    parent_run_id: str
    experiment_id: str
    summary: str
    mean_overhead_s: float = float("nan")
    extra: dict = field(default_factory=dict)


@dataclass
class Plan:
    """A validated sweep: what --dry-run prints and what run_sweep runs."""

    sweep: Sweep
    space: SearchSpace
    baseline_point: dict[str, Any]
    base_dict: dict[str, Any]

    def config_for(self, searched: Mapping[str, Any]) -> Any:
        """The trial's config: the base with the searched knobs over it. The one place
        the driver rebuilds a config from a dict (validated by the config's from_dict)."""
        return type(self.sweep.base).from_dict({**self.base_dict, **searched})

    def complete_config(self, searched: Mapping[str, Any]) -> dict[str, Any]:
        return self.config_for(searched).to_dict()

    def resources_of(self, searched: Mapping[str, Any]) -> dict[str, float]:
        config = self.config_for(searched)
        return dict(get_platform(config.platform).resources(config))

    def trial_env(self, searched: Mapping[str, Any]) -> dict[str, str]:
        config = self.config_for(searched)
        own_env = getattr(config, "trial_env", None)  # a kernel config knows its own (trainables/microbench.py)
        return own_env() if own_env else get_platform(config.platform).trial_env(config)

    def describe(self) -> str:
        sweep = self.sweep
        lines = [f"sweep {sweep.name!r} on platform {sweep.base.platform!r}"]
        if sweep.platform_note:
            lines.append(f"  ({sweep.platform_note})")
        lines.append("search space:")
        lines += [f"  {line}" for line in self.space.describe()]
        lines.append("objectives: " + ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives))
        lines.append(f"budget: {sweep.num_samples} trials"
                     + (f", {sweep.time_budget_s:g} s" if sweep.time_budget_s else "")
                     + f"; early stopping: {sweep.scheduler}; seed {sweep.seed}")
        lines.append(sweep.cost_note)
        samples = [("baseline", self.baseline_point)]
        samples += [(f"sample {i}", p) for i, p in
                    enumerate(self.space.sample(DRY_RUN_SAMPLE_TRIALS, seed=sweep.seed + 1), start=1)]
        for label, point in samples:
            resources = self.resources_of(point)
            lines.append(f"{label}: {point}")
            lines.append(f"  resources per trial: {resources}")
            lines.append(f"  trial environment: {self.trial_env(point)}")
            if sweep.cost is not None:
                lines.append(f"  cost basis: {sweep.cost.describe(resources)}")
        return "\n".join(lines)


def plan_sweep(sweep: Sweep) -> Plan:
    """Validate everything about a sweep that can be checked without running it."""
    if not isinstance(sweep.name, str) or not sweep.name.strip():
        raise ConfigError("name", "a non-empty sweep name", sweep.name)
    positive_int("num_samples", sweep.num_samples)
    positive_int("retries", sweep.retries, minimum=0)
    if sweep.time_budget_s is not None and not (sweep.time_budget_s > 0 and math.isfinite(sweep.time_budget_s)):
        raise ConfigError("time_budget_s", "a number of seconds > 0, or None", sweep.time_budget_s)
    one_of("scheduler", sweep.scheduler, SCHEDULERS)
    one_of("sampler", sweep.sampler, SAMPLERS)
    if not sweep.objectives:
        raise ConfigError("objectives", "at least one Objective", list(sweep.objectives))
    if sweep.metrics is not None:
        for objective in sweep.objectives:
            sweep.metrics.check_objective(objective.metric, objective.mode)
    if sweep.max_concurrent_trials is not None:
        positive_int("max_concurrent_trials", sweep.max_concurrent_trials)
    validate_tracking_uri(sweep.tracking_uri)

    base_dict = sweep.base.to_dict()
    space = SearchSpace(sweep.space)
    plan = Plan(sweep=sweep, space=space, baseline_point={}, base_dict=base_dict)
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
    if sweep.sampler == "grid":
        from optuna.distributions import CategoricalDistribution

        for name, distribution in space.distributions.items():
            if not isinstance(distribution, CategoricalDistribution):
                raise ConfigError(f"search space knob {name}", "categorical for sampler 'grid'",
                                  type(distribution).__name__)
    return plan


def preflight(sweep: Sweep) -> Plan:
    """``plan_sweep`` plus the checks against where the sweep will run (sweeps/driver/
    preflight.py); ``run_sweep`` runs it before anything else. A cluster's address must
    answer; a local run's trials must fit this machine. A Ray instance the caller has
    started already is theirs to size (it may be a cluster): only the address is checked."""
    import ray

    plan = plan_sweep(sweep)
    if sweep.address and sweep.address != "local":
        check_ray_address(sweep.address)
    elif not ray.is_initialized():
        check_fits_locally(plan)
    return plan


def connect_ray(address: Optional[str]) -> str:
    import ray

    if ray.is_initialized():
        return "using the Ray instance already initialised"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        check_ray_address(address)  # ray.init retries an unreachable address for minutes
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        return f"connected to Ray at {address}"
    # A private local instance with no dashboard. Its GCS, raylet and workers still
    # listen on every interface (Ray 2.60 has no loopback-only mode), so token auth
    # stays on: with RAY_AUTH_MODE unset, ray.init turns it on for a new local instance
    # (and reloads Ray's cached config, which setting the variable here would not).
    # RAY_AUTH_MODE=disabled opts out.
    ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    return f"started a local Ray instance ({ray.cluster_resources().get('CPU', 0):g} CPUs)"


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


def _searcher(plan: Plan):
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
    first = [plan.baseline_point] if sweep.sampler == "tpe" else None
    return FailureAwareOptunaSearch(plan.space.define_by_run, metric=metrics if len(metrics) > 1 else metrics[0],
                        mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                        points_to_evaluate=first, seed=sweep.seed)


def _scheduler(sweep: Sweep):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    objective = sweep.objectives[0]  # early stopping needs one metric: the first objective
    windows = getattr(sweep.base, "windows", 1)
    if sweep.scheduler == "none" or windows < 2:
        return FIFOScheduler()
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
        config = config_for(searched)
    except ConfigError:
        return dict(fallback)  # the trial itself then fails with the config error, on record
    return dict(get_platform(config.platform).trial_actor_resources(config))


SWEEP_MARKER = "accelsweep-sweep.json"


def _write_sweep_marker(experiment_dir: str, parent_run_id: str, status: str) -> None:
    """What --resume needs besides Tune's state: the MLflow parent run, and whether the
    sweep ended (a finished sweep is not resumed)."""
    os.makedirs(experiment_dir, exist_ok=True)
    with open(os.path.join(experiment_dir, SWEEP_MARKER), "w") as marker:
        json.dump({"parent_run_id": parent_run_id, "status": status}, marker)


def unfinished_sweep_dir(storage: str, name: str) -> str:
    """The newest run of sweep ``name`` under ``storage`` that did not finish."""
    candidates = []
    for marker_path in glob.glob(os.path.join(storage, f"{name}-*", SWEEP_MARKER)):
        with open(marker_path) as marker:
            status = json.load(marker).get("status")
        directory = os.path.dirname(marker_path)
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
    resume it, run every trial and summarise. Nothing starts when a check fails."""
    from accelsweep.trainables.tracking import SweepTracker

    started = time.monotonic()
    plan = preflight(sweep)
    _quiet_tune()
    say = sweep.print_line or (lambda line: print(line, flush=True))
    tracker = SweepTracker(sweep.tracking_uri, sweep.experiment or sweep.name)
    concurrency = _connect_and_announce(plan, say)
    if sweep.before_trials is not None and not sweep.resume:
        sweep.parent_metrics.update(sweep.before_trials(plan))
    trainable = _tune_trainable(plan)
    storage = os.path.abspath(os.path.expanduser(sweep.storage_path or "~/ray_results"))
    if sweep.resume:
        run = _resume(plan, trainable, storage, tracker, say)
    else:
        run = _start(plan, trainable, storage, tracker, concurrency)
    status = "FAILED"
    try:
        run.tuner.fit()
        interrupted = any(r.status == INTERRUPTED for r in run.callback.records.values())
        status = "KILLED" if interrupted else "FINISHED"
    finally:
        result = _finish(plan, run, tracker, status, time.monotonic() - started)
    say(result.summary)
    if status == "KILLED":
        say(f"interrupted: run the same command with --resume to continue {run.experiment_dir}")
    return result


def _quiet_tune() -> None:
    # Every result goes to MLflow through SweepCallback; Tune's own CSV/JSON/TensorBoard
    # loggers would only add per-result file writes to each trial's overhead.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # ...which also means Tune's result grid finds no result files: it need not say so.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # Tune saves the experiment (trials, searcher, our callback's state) this often: what
    # a killed driver can lose, and what --resume picks up from.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")


def _connect_and_announce(plan: Plan, say: Callable[[str], None]) -> int:
    """Connect to Ray and say what will run; returns how many trials run at once."""
    sweep = plan.sweep
    say(connect_ray(sweep.address))
    baseline_resources = plan.resources_of(plan.baseline_point)
    concurrency, why = concurrency_for(baseline_resources, sweep)
    say(f"{sweep.name}: up to {sweep.num_samples} trials, {concurrency} at a time ({why}); "
        f"each trial holds {baseline_resources}")
    if sweep.platform_note:
        say(f"platform: {sweep.platform_note}")
    say(sweep.cost_note)
    return concurrency


def _tune_trainable(plan: Plan):
    """The sweep's trainable as Tune runs it: isolated (its failures become results),
    with the base config and cost basis bound, and each trial's own resources."""
    from ray import tune

    sweep = plan.sweep
    objective_metrics = [o.metric for o in sweep.objectives]
    isolated = functools.partial(run_isolated, trainable=sweep.trainable, objective_metrics=objective_metrics)
    baseline_actor = _trial_resources(plan.config_for, {}, plan.baseline_point)
    resources = functools.partial(_trial_resources, plan.config_for, baseline_actor)
    return tune.with_resources(tune.with_parameters(isolated, base=plan.base_dict, cost=sweep.cost), resources)


def _resume(plan: Plan, trainable, storage: str, tracker, say: Callable[[str], None]) -> _Run:
    """Tune's saved experiment and our callback in it, back on their MLflow parent run."""
    from ray import tune

    sweep = plan.sweep
    experiment_dir = unfinished_sweep_dir(storage, sweep.name)
    tuner = tune.Tuner.restore(experiment_dir, trainable, resume_unfinished=True, resume_errored=False)
    callback = _callback_of(tuner)
    callback._tracker, callback.print_line = tracker, sweep.print_line
    parent_run_id = tracker.parent_run_id = callback.parent_run_id
    tracker.reopen(parent_run_id, tags={"status": "running", "resumed": datetime.datetime.now().isoformat()})
    # Tune hands the callback its saved records when fit() starts (set_state), and
    # those are dropped from the orphans then.
    callback.orphans = {run_id: tags.get("searched", "") for run_id, tags in tracker.trial_runs().items()}
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
                  "cost_basis": sweep.cost_note, "status": "running"}
    parent_params = {f"base.{k}": v for k, v in plan.base_dict.items()}
    parent_params.update({"num_samples": sweep.num_samples, "time_budget_s": sweep.time_budget_s,
                          "scheduler": sweep.scheduler, "seed": sweep.seed, "max_concurrent_trials": concurrency,
                          "objectives": ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives),
                          "search_space": "; ".join(plan.space.describe())})
    parent_run_id = tracker.start_sweep(f"{sweep.name}-{stamp}", parent_params, sweep_tags)
    trial_tags = {**env_tags, "sweep": sweep.name, "platform": sweep.base.platform,
                  "instance_type": sweep_tags["instance_type"]}
    callback = SweepCallback(tracker, plan.complete_config, plan.resources_of, plan.baseline_point,
                             sweep.cost, trial_tags, sweep.num_samples, print_line=sweep.print_line,
                             time_budget_s=sweep.time_budget_s, metrics=sweep.metrics)
    experiment_dir = os.path.join(storage, f"{sweep.name}-{stamp}")
    _write_sweep_marker(experiment_dir, parent_run_id, "running")
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=_searcher(plan), scheduler=_scheduler(sweep),
                                    num_samples=sweep.num_samples, time_budget_s=sweep.time_budget_s,
                                    max_concurrent_trials=concurrency,
                                    reuse_actors=get_platform(sweep.base.platform).reuses_processes),
        run_config=tune.RunConfig(name=os.path.basename(experiment_dir), storage_path=storage,
                                  callbacks=[callback], verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=sweep.retries)),
    )
    return _Run(tuner, callback, experiment_dir, parent_run_id)


def _finish(plan: Plan, run: _Run, tracker, status: str, elapsed_s: float) -> SweepResult:
    """Close what the driver left running, mark the sweep ended, and summarise it on
    its parent run (also after a failed or interrupted fit)."""
    sweep = plan.sweep
    for run_id in tracker.trial_runs(only_running=True):
        # A run left RUNNING by a driver that died, whose trial Tune did not run again.
        tracker.finish(run_id, "FAILED", tags={"status": "failed", "error_class": "Lost", "error_cause": "killed",
                                               "error": "its sweep's driver stopped while it ran"})
    _write_sweep_marker(run.experiment_dir, run.parent_run_id, status.lower())
    records = sorted(run.callback.records.values(), key=lambda r: r.number)
    records = [r for r in records if r.run_id is not None]
    objective = sweep.objectives[0]
    best = best_record(records, objective.metric, objective.mode)
    baseline = next((r for r in records if r.is_baseline), None)
    text = summary(f"{sweep.name} on {sweep.base.platform}", records, objective.metric, objective.mode,
                   list(plan.space.distributions), sweep.cost_note, tracker.ui_command(),
                   elapsed_s, metrics=sweep.metrics)
    parent_metrics = {**sweep.parent_metrics, "trials": len(records),
                      "failed_trials": sum(r.status == "failed" for r in records),
                      "mean_overhead_s": mean_overhead_s(records)}
    if best is not None:
        parent_metrics[f"best_{objective.metric}"] = best.metric(objective.metric)
        if baseline is not None and baseline.has_measurement:
            parent_metrics[f"baseline_{objective.metric}"] = baseline.metric(objective.metric)
    tracker.finish(run.parent_run_id, status, metrics=parent_metrics,
                   tags={"status": "interrupted" if status == "KILLED" else status.lower(),
                         "best_trial": str(best.number) if best else "none"})
    return SweepResult(records=records, best=best, baseline=baseline, parent_run_id=run.parent_run_id,
                       experiment_id=tracker.experiment_id, summary=text, mean_overhead_s=mean_overhead_s(records))

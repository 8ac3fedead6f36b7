"""A sweep validated whole before anything starts (``plan_sweep``: the trainable's
signature and declared metrics, the base config, every config the space can propose, the
objectives and limits), then checked against where it will run (``preflight``): the
``Plan`` that --dry-run prints and lifecycle.py runs."""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.define.first_guess import plan_first_guess
from accelsweep.sweeps.driver.record.marker import read_sweep_marker, unfinished_sweep_dir
from accelsweep.sweeps.driver.define.preflight import (
    check_fits_locally,
    check_ray_address,
    check_running_ray,
)
from accelsweep.sweeps.driver.record.secrets import shown_uri
from accelsweep.sweeps.driver.record.tracking import validate_tracking_uri
from accelsweep.sweeps.driver.define.resume_check import check_same_sweep, storage_dir
from accelsweep.sweeps.driver.define.space import (
    SearchSpace,
    describe_distribution,
    describe_reasons,
    holds,
)
from accelsweep.sweeps.driver.define.store_checks import (
    check_storage_path,
    check_study_storage,
    check_tracking_store,
)
from accelsweep.sweeps.driver.record.optuna_study import validate_study_storage
from accelsweep.sweeps.driver.define.sweep import SAMPLERS, SCHEDULERS, Objective, Sweep
from accelsweep.sweeps.driver.define.warm_start import plan_warm_start
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import (
    MAX_SEED,
    ConfigError,
    one_of,
    positive_float,
    positive_int,
    random_seed,
)
from accelsweep.trainables.loop.rejection import REJECT_RATIO, TrialLimits
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.metrics import MetricSet
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.capabilities import Capabilities, not_known

DRY_RUN_SAMPLE_TRIALS = 3
TRAINABLE_SIGNATURE = "a function trainable(searched, base=..., cost=...) that reports through ray.tune.report"
CONFIG_PROTOCOL = ("a config with .platform (a platform name), .to_dict() (a flat dict) and a classmethod "
                   "from_dict(dict) that validates it (e.g. a SweepConfig subclass)")
# What the platforms read from a config to size a trial, for a config that has no such field.
RESOURCE_DEFAULTS = {"cpus_per_worker": 1, "workers": 1}


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


def as_sized(config: Any) -> Any:
    """``config`` as the platforms can size a trial from (``_WithResourceDefaults`` where it
    lacks a field they read)."""
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
    warm: Optional[Any] = None  # WarmStart (warm_start.py): what an earlier sweep gives this one
    guess: Optional[Any] = None  # FirstGuess (first_guess.py): the platform's config tried after the baseline

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
        if self.resident_input():
            lines.append(f"input: {self.resident_input()}")
        return lines

    def resident_input(self) -> str:
        """What a sweep with batches kept on the device measures, in words ("": the loader's)."""
        count = getattr(self.sweep.base, "resident_batches", 0) if isinstance(self.sweep.base, TrialConfig) else 0
        return (f"{count} batches kept on the device and cycled (resident_batches): each config's own ceiling, "
                "not its input pipeline's; compare with the same sweep without it") if count else ""

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
        if self.resident_input():
            tags["input"] = self.resident_input()
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
        config = as_sized(self.config_for(searched))
        return dict(get_platform(config.platform).resources(config))

    def trial_env(self, searched: Mapping[str, Any]) -> dict[str, str]:
        config = self.config_for(searched)
        own_env = getattr(config, "trial_env", None)  # a kernel config knows its own (trainables/harness/microbench.py)
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
        if local_search_trials(sweep):
            lines.append(f"local search: the last {local_search_trials(sweep)} proposals"
                         + (f" (or the last {LOCAL_TIME_SHARE:.0%} of the search's time)" if sweep.time_budget_s else "")
                         + " each step from the best config so far to an unmeasured neighbour (one knob, one "
                           "choice away)")
        if self.guess is not None:
            lines += self.guess.lines()
        if self.warm is not None:
            lines += self.warm.lines()
        if sweep.stop_at_utilisation:
            lines.append(f"goal: stop once a trial runs at {sweep.stop_at_utilisation:.0%} or more of the "
                         "hardware's peak (--stop-at-utilisation)")
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


def unpriced_if_stand_in(sweep: Sweep) -> Sweep:
    """The sweep without its price basis where its platform is never priced (a stand-in:
    its figures are not those of the hardware it holds), its cost note saying why."""
    why = get_platform(sweep.base.platform).unpriced_because
    if not why:
        return sweep
    dropped = f" The price basis given is not applied ({sweep.cost_note})." if sweep.cost is not None else ""
    return dataclasses.replace(sweep, cost=None, cost_note=f"not priced: {why}.{dropped}")


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
                          "(both from accelsweep), or give Sweep(metrics=...).")
    if not isinstance(declared, MetricSet) and callable(declared):
        declared = declared(sweep.base)
    if not isinstance(declared, MetricSet):
        raise ConfigError("metrics", "a MetricSet, or a function of the base config giving one", declared)
    return declared


def check_config_protocol(base: Any) -> dict[str, Any]:
    """The base config keeps the protocol (``Sweep``'s docstring); its flat dict."""
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


def check_trial_timeout(timeout_s: Any) -> None:
    """``Sweep.trial_timeout_s`` is a number of seconds > 0, or None (no deadline)."""
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            timeout_s > 0 and math.isfinite(timeout_s)):
        raise ConfigError("trial_timeout_s", "a number of seconds > 0 (the longest a trial may go without "
                                             "reporting), or None for no deadline", timeout_s)


def plan_sweep(sweep: Sweep) -> Plan:
    """Validate everything about a sweep that can be checked without running it."""
    if not isinstance(sweep.name, str) or not sweep.name.strip():
        raise ConfigError("name", "a non-empty sweep name", sweep.name)
    if len(sweep.name) > MAX_NAME_CHARS:  # it names the sweep's folder, with a time stamp after it
        raise ConfigError("name", f"a sweep name of at most {MAX_NAME_CHARS} characters", _long(sweep.name),
                          f"It has {len(sweep.name)}.")
    experiment = sweep.experiment
    if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()
                                   or len(experiment) > MAX_EXPERIMENT_CHARS):
        raise ConfigError("experiment", f"a non-empty MLflow experiment name of at most {MAX_EXPERIMENT_CHARS} "
                                        "characters (MLflow's limit), or None for the sweep's name",
                          _long(experiment), f"It has {len(experiment)}." if isinstance(experiment, str) else "")
    positive_int("num_samples", sweep.num_samples)
    positive_int("retries", sweep.retries, minimum=0)
    rounds = sweep.confirm_rounds  # one round pairs nothing: a paired interval needs two
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds == 1 or rounds < 0:
        raise ConfigError("confirm_rounds", "0 (no confirmation), or an integer >= 2", rounds)
    if sweep.local_search is not None:
        positive_int("local_search", sweep.local_search, minimum=0)
        if sweep.local_search >= sweep.num_samples:
            raise ConfigError("local_search", f"fewer than num_samples ({sweep.num_samples}): the search needs "
                                              "measured configs to step from", sweep.local_search)
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
    sweep = unpriced_if_stand_in(sweep)
    metrics = declared_metrics(sweep)
    for objective in sweep.objectives:
        metrics.check_objective(objective.metric, objective.mode)
    check_utilisation_goal(sweep.stop_at_utilisation, metrics)
    if sweep.max_concurrent_trials is not None:
        positive_int("max_concurrent_trials", sweep.max_concurrent_trials)
    validate_tracking_uri(sweep.tracking_uri)
    if sweep.study_storage is not None:
        validate_study_storage(sweep.study_storage)
    trial_limits_of(sweep)  # checks reject_ratio and max_compile_s

    # Values the base platform's hardware only emulates leave the space (the baseline's own
    # stay: it must be a point of it), unless the sweep keeps them.
    capabilities = get_platform(sweep.base.platform).capabilities(as_sized(sweep.base))
    # A cluster on loopback is processes of this machine (`accelsweep cluster up`, a `ray
    # start` here): what was read here is what its trials run on.
    if capabilities.read_here and sweep.address and sweep.address != "local" \
            and not ray_adapter.loopback_address(sweep.address):
        capabilities = not_known(capabilities.hardware, f"read on this driver, but trials run on the cluster at "
                                                        f"{sweep.address}, whose nodes may have other hardware")
    space = SearchSpace(sweep.space, remove=None if sweep.keep_emulated else capabilities.emulated, keep=base_dict)
    if isinstance(sweep.base, TrialConfig) and "resident_batches" in space.distributions:
        # Kept batches measure the model's ceiling, the loader the pipeline: in one ranking,
        # one board of the best to beat and one verdict, the ceiling would win every time.
        raise ConfigError("search space knob resident_batches", "not searched: one value for the whole sweep, "
                          "set in its base config", space.distributions["resident_batches"],
                          "A sweep with resident batches finds each config's ceiling; run it beside the "
                          "sweep with the loader and compare the two.")
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
    plan.guess = plan_first_guess(plan)
    if sweep.warm_start is not None:
        store = sweep.warm_start_store or sweep.tracking_uri
        try:
            validate_tracking_uri(store)
        except ConfigError as error:
            raise ConfigError("warm_start_store", "an MLflow tracking URI this machine can read", store,
                              str(error)) from None
        plan.warm = plan_warm_start(plan, sweep.warm_start, store)
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
            if not holds(knobs[knob], value):
                raise ConfigError(f"{field_name}.{knob}", describe_distribution(knobs[knob]), value)
        plan.config_for(point)  # a ConfigError names the field


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
    """``plan_sweep`` plus the checks against where the sweep will run (define/preflight.py,
    store_checks.py); ``run_sweep`` runs it before anything else. The tracking
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
    """Whether the trainable applies the sweep's limits (accelsweep.trainables.loop.rejection
    current_limits: the built-in training loop does; a kernel's microbenchmark does not)."""
    return bool(getattr(trainable, "reads_trial_limits", False))


def rejects(sweep: Sweep) -> bool:
    """Whether trials stop themselves on a hopeless projection: early stopping of a kind,
    so not with scheduler "none" (a study that measures every config), nor with several
    objectives (a trial slow on the first may be on the Pareto set), nor for a trainable
    that does not read the limits."""
    return (sweep.reject_ratio is not None and sweep.scheduler != "none" and len(sweep.objectives) == 1
            and reads_trial_limits(sweep.trainable))


# MLflow 3.17 refuses a longer experiment name (mlflow/utils/validation.py), after Ray has
# started; a sweep's name also names its folder (with a time stamp: NAME_MAX is 255).
MAX_EXPERIMENT_CHARS = 500
MAX_NAME_CHARS = 200

# The local search's default share: the last quarter of the proposals, at most this many,
# or the last third of the search's time budget, whichever begins first.
LOCAL_SEARCH_MAX = 4
LOCAL_TIME_SHARE = 1 / 3


def _long(text: Any) -> Any:
    """A value as an error shows it: a long text by its start."""
    return f"{text[:40]}..." if isinstance(text, str) and len(text) > 60 else text


def check_utilisation_goal(goal: Optional[float], metrics) -> None:
    """Sweep.stop_at_utilisation: a share of the peak in (0, 1], for a trainable that
    reports its utilisation (mfu: the training loop's)."""
    if goal is None:
        return
    if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not 0 < goal <= 1:
        raise ConfigError("stop_at_utilisation", "a share of the hardware's peak in (0, 1], e.g. 0.4, or None", goal)
    if "mfu" not in metrics.names:
        raise ConfigError("stop_at_utilisation", "None for a trainable that reports no utilisation (mfu)", goal,
                          "Only the training loop's trials report mfu (trainables/utilisation.py).")


def local_search_trials(sweep: Sweep) -> int:
    """The proposals at the search's end that step from its leader (Sweep.local_search)."""
    if sweep.local_search is not None:
        return sweep.local_search
    if sweep.sampler != "tpe" or len(sweep.objectives) != 1:
        return 0
    return min(LOCAL_SEARCH_MAX, sweep.num_samples // 4)


def edge_trials(sweep: Sweep) -> int:
    """The most proposals that step past the space's edge (define/edges.py): as many as the
    local search's (a quarter of the budget, at most LOCAL_SEARCH_MAX: a batch 64 doubled
    four times is 1024), one at least; the rest is the search's."""
    return max(1, min(LOCAL_SEARCH_MAX, sweep.num_samples // 4))


def startup_trials(sweep: Sweep) -> int:
    """TPE's random start-up proposals: seeded, so known before any result."""
    return min(10, max(2, sweep.num_samples // 3))

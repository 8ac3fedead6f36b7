"""Search spaces: an Optuna define-by-run function, or a dict of Tune domains.

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        if trial.suggest_categorical("torch_compile", ["none", "inductor"]) == "none":
            trial.suggest_categorical("channels_last", [False, True])

A define-by-run space may branch on earlier choices and may return a dict of fixed
values. It is sampled here (cheaply, without running anything) to list its knobs for
``--dry-run`` and to validate the configs it can propose before any trial starts.

Categorical values the hardware only emulates (a platform's ``capabilities``) can be
removed from every ``suggest_categorical`` (``remove``), except the baseline's own values
(``keep``), which must stay points of the space.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution)

from accelsweep.sweeps.driver.record.optuna_study import holds, quiet_optuna
from accelsweep.trainables.errors import ConfigError

__all__ = ["DefineByRun", "Reasons", "SearchSpace", "SpaceSpec", "describe_distribution", "describe_reasons",
           "holds", "quiet_optuna"]

DefineByRun = Callable[[optuna.Trial], Optional[Mapping[str, Any]]]
SpaceSpec = Union[DefineByRun, Mapping[str, Any]]
Reasons = Mapping[str, Mapping[Any, str]]  # knob -> {value: why}

INTROSPECTION_SAMPLES = 128


def _suggest(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> Any:
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step,
                                 log=distribution.log)
    if isinstance(distribution, FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step,
                                   log=distribution.log)
    raise ConfigError("search space", "categorical, int or float distributions", distribution)


def describe_reasons(reasons: Mapping[Any, str]) -> str:
    """Values and why ({value: why}), values of one reason together: "bf16, bf16-autocast (no bf16 units)"."""
    by_reason: dict[str, list[str]] = {}
    for value, why in reasons.items():
        by_reason.setdefault(why, []).append(str(value))
    return "; ".join(f"{', '.join(values)} ({why})" for why, values in by_reason.items())


def describe_distribution(distribution: BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return "one of " + ", ".join(repr(c) for c in distribution.choices)
    kind = "int" if isinstance(distribution, IntDistribution) else "float"
    scale = " (log)" if distribution.log else ""
    step = f" step {distribution.step}" if distribution.step not in (None, 1) else ""
    return f"{kind} in [{distribution.low}, {distribution.high}]{step}{scale}"


class _PrunedTrial:
    """An optuna.Trial whose suggest_categorical leaves out the values in ``drop`` (knob ->
    {value: why}), and notes each knob's full choices in ``offered``."""

    def __init__(self, trial: optuna.Trial, drop: Reasons, offered: dict[str, tuple]):
        self._trial, self._drop, self._offered = trial, drop, offered

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        self._offered[name] = tuple(choices)
        dropped = self._drop.get(name, {})
        kept = [choice for choice in choices if choice not in dropped]
        if not kept:
            raise ConfigError(f"search space knob {name}", "at least one choice this hardware runs natively",
                              list(choices), f"Every one is only emulated here: {describe_reasons(dropped)}. "
                                             "Keep them with --keep-emulated (Sweep(keep_emulated=True)).")
        return self._trial.suggest_categorical(name, kept)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


class _DefineByRun:
    """A define-by-run function that plain pickle can save: Tune checkpoints the
    searcher with pickle, and users' spaces are often closures. ``drop``: the categorical
    values left out of every proposal (knob -> {value: why}); ``offered``: each categorical
    knob's choices as the function offered them, before any was dropped."""

    def __init__(self, function: DefineByRun, drop: Optional[Reasons] = None):
        self.function = function
        self.drop = {knob: dict(values) for knob, values in (drop or {}).items()}
        self.offered: dict[str, tuple] = {}

    def __call__(self, trial: optuna.Trial) -> Optional[Mapping[str, Any]]:
        return self.function(_PrunedTrial(trial, self.drop, self.offered) if self.drop else trial)

    def __reduce__(self):
        import cloudpickle

        return (_load_define_by_run, (cloudpickle.dumps(self.function), self.drop))


def _load_define_by_run(payload: bytes, drop: Optional[Reasons] = None) -> _DefineByRun:
    import cloudpickle

    return _DefineByRun(cloudpickle.loads(payload), drop)


class SearchSpace:
    """``remove``: categorical values to leave out of the space (knob -> {value: reason});
    ``keep``: the baseline config's dict, whose values are never removed. ``removed`` then
    says what was (knobs of this space, values among their choices); ``kept`` what would
    have been but is the baseline's."""

    def __init__(self, spec: SpaceSpec, remove: Optional[Reasons] = None, keep: Optional[Mapping[str, Any]] = None):
        remove, keep = remove or {}, keep or {}
        drop = {knob: {value: why for value, why in values.items() if not (knob in keep and keep[knob] == value)}
                for knob, values in remove.items()}
        if callable(spec):
            self.define_by_run = _DefineByRun(spec, drop)
        elif isinstance(spec, Mapping):
            distributions = self._from_mapping(spec)
            self.define_by_run = _DefineByRun(
                lambda trial: {n: _suggest(trial, n, d) for n, d in distributions.items()}, drop)
        else:
            raise ConfigError("search space", "an Optuna define-by-run function or a dict of Tune domains",
                              type(spec).__name__)
        self.distributions: dict[str, BaseDistribution] = {}
        self.constants: dict[str, Any] = {}
        self.sample(INTROSPECTION_SAMPLES, seed=0)  # fills distributions and constants
        if not self.distributions:
            raise ConfigError("search space", "at least one searched knob (suggest_* call or Tune domain)",
                              {} if not self.constants else self.constants)
        self.removed: dict[str, dict[Any, str]] = {}
        self.kept: dict[str, dict[Any, str]] = {}
        for knob, values in remove.items():
            for value, why in values.items():
                if value in self.define_by_run.offered.get(knob, ()):  # a choice of this space's knob
                    (self.removed if value in drop[knob] else self.kept).setdefault(knob, {})[value] = why

    @staticmethod
    def _from_mapping(spec: Mapping[str, Any]) -> dict[str, BaseDistribution]:
        from ray.tune.search.optuna import OptunaSearch

        if not spec:
            raise ConfigError("search space", "at least one searched knob", dict(spec))
        try:
            return OptunaSearch.convert_search_space(dict(spec))
        except ValueError as error:
            raise ConfigError("search space", "Tune domains (tune.choice, tune.randint, tune.uniform, ...)",
                              dict(spec), str(error)) from None

    def sample(self, count: int, seed: int) -> list[dict[str, Any]]:
        """``count`` random points from the space, as the values a trial would receive."""
        with quiet_optuna():
            study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        points = []
        for _ in range(count):
            trial = study.ask()
            fixed = self.define_by_run(trial)
            if fixed is None:
                fixed = {}
            elif not isinstance(fixed, Mapping):
                raise ConfigError("search space", "a define-by-run function returning None or a dict of fixed values",
                                  fixed, "A lambda returns what its last suggest_* call returned: use a def, or "
                                         "return {name: trial.suggest_...(...)}.")
            self.distributions.update(trial.distributions)
            self.constants.update(fixed)
            points.append({**trial.params, **fixed})
        return points

    def point_for(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The searched knobs' values in ``base``: the baseline trial, evaluated first.
        Every value must lie in the space, else the searcher could not replay it."""
        point = {}
        for name, distribution in self.distributions.items():
            if name not in base:
                raise ConfigError("search space knob", f"a config field ({', '.join(base)})", name)
            value = base[name]
            try:
                inside = distribution._contains(distribution.to_internal_repr(value))
            except (ValueError, TypeError):
                inside = False
            if not inside:
                raise ConfigError(f"baseline {name}", describe_distribution(distribution), value,
                                  "The baseline config must be a point of the search space.")
            point[name] = value
        return point

    def describe(self) -> list[str]:
        lines = [f"{name}: {describe_distribution(d)}" for name, d in self.distributions.items()]
        lines += [f"{name}: fixed at {value!r}" for name, value in self.constants.items()
                  if name not in self.distributions]
        return lines

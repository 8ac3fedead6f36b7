"""Search spaces: an Optuna define-by-run function, or a dict of Tune domains.

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        if trial.suggest_categorical("torch_compile", ["none", "inductor"]) == "none":
            trial.suggest_categorical("channels_last", [False, True])

A define-by-run space may branch on earlier choices and may return a dict of fixed
values. It is sampled here (cheaply, without running anything) to list its knobs for
``--dry-run`` and to validate the configs it can propose before any trial starts.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution)

from accelsweep.trainables.errors import ConfigError

__all__ = ["DefineByRun", "SearchSpace", "SpaceSpec", "describe_distribution", "quiet_optuna"]

DefineByRun = Callable[[optuna.Trial], Optional[Mapping[str, Any]]]
SpaceSpec = Union[DefineByRun, Mapping[str, Any]]

INTROSPECTION_SAMPLES = 128


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs each study it creates (one per sampling here, one per sweep) at INFO:
    warnings only while inside, the caller's verbosity again after."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


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


def describe_distribution(distribution: BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return "one of " + ", ".join(repr(c) for c in distribution.choices)
    kind = "int" if isinstance(distribution, IntDistribution) else "float"
    scale = " (log)" if distribution.log else ""
    step = f" step {distribution.step}" if distribution.step not in (None, 1) else ""
    return f"{kind} in [{distribution.low}, {distribution.high}]{step}{scale}"


class _DefineByRun:
    """A define-by-run function that plain pickle can save: Tune checkpoints the
    searcher with pickle, and users' spaces are often closures."""

    def __init__(self, function: DefineByRun):
        self.function = function

    def __call__(self, trial: optuna.Trial) -> Optional[Mapping[str, Any]]:
        return self.function(trial)

    def __reduce__(self):
        import cloudpickle

        return (_load_define_by_run, (cloudpickle.dumps(self.function),))


def _load_define_by_run(payload: bytes) -> _DefineByRun:
    import cloudpickle

    return _DefineByRun(cloudpickle.loads(payload))


class SearchSpace:
    def __init__(self, spec: SpaceSpec):
        if callable(spec):
            self.define_by_run = _DefineByRun(spec)
        elif isinstance(spec, Mapping):
            distributions = self._from_mapping(spec)
            self.define_by_run = _DefineByRun(
                lambda trial: {n: _suggest(trial, n, d) for n, d in distributions.items()})
        else:
            raise ConfigError("search space", "an Optuna define-by-run function or a dict of Tune domains",
                              type(spec).__name__)
        self.distributions: dict[str, BaseDistribution] = {}
        self.constants: dict[str, Any] = {}
        self.sample(INTROSPECTION_SAMPLES, seed=0)  # fills distributions and constants
        if not self.distributions:
            raise ConfigError("search space", "at least one searched knob (suggest_* call or Tune domain)",
                              {} if not self.constants else self.constants)

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

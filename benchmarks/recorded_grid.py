"""A recorded grid (``Table``: one ``Row`` per config) and what replays against it: the
searchers as the tool builds them (``make_searcher``), Ray Tune's ASHA (``make_asha``),
the training loop's rejection rule (``rejection``) and the ``Policy`` that combines them.

What search_efficiency.py (the one-at-a-time replay and the recording),
concurrent_replay.py, warm_replay.py and guess_replay.py share; search_efficiency.py's
command line runs them all.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from accelsweep.sweeps.driver.define.plan import startup_trials
from accelsweep.sweeps.driver.define.warm_start import unique_points, warm_trials
from accelsweep.sweeps.driver.run.searchers import concurrency_aware_tpe
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.rejection import FIRST_STEP_ALLOWANCE

__all__ = ["METRIC", "OptunaSearcher", "Policy", "Row", "Searcher", "ShuffledGrid", "TOLERANCE", "Table", "Window",
           "make_asha", "make_searcher", "rejection"]

METRIC = "throughput_samples_per_s"  # the main job's objective (sweeps/neuron_vit.py), maximised
TOLERANCE = 0.05  # "reached": the named best is within 5% of the grid's best


# --------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Window:
    index: int
    throughput: float  # cumulative over the windows so far: what the trial reports
    since_start_s: float  # the trial's device-seconds when it reports this window
    measured_s: float  # the timed seconds of the windows so far


@dataclass(frozen=True)
class Row:
    point: Mapping[str, Any]
    batch_size: int
    throughput: Optional[float]  # the full run's; None: the config failed
    windows: tuple[Window, ...]
    setup_s: Optional[float]
    first_step_s: Optional[float]
    warmup_step_s: Optional[float]
    wall_s: float
    error: Optional[str] = None

    @property
    def projection(self) -> Optional[float]:
        """The throughput projected from the warm-up's steps after the first."""
        return self.batch_size / self.warmup_step_s if self.warmup_step_s else None


@dataclass(frozen=True)
class Table:
    space: Mapping[str, tuple]
    baseline: Mapping[str, Any]
    windows: int  # each trial's planned windows (ASHA's max_t)
    warmup_steps: int
    rows: Mapping[tuple, Row]  # key(point) -> row
    machine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the recording's base config (unsearched)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Table":
        space = {name: tuple(choices) for name, choices in data["space"].items()}
        rows = {}
        for raw in data["rows"]:
            row = Row(point=raw["point"], batch_size=raw["batch_size"], throughput=raw[METRIC],
                      windows=tuple(Window(w["window"], w[METRIC], w["since_start_s"], w["measured_s"])
                                    for w in raw["windows"]),
                      setup_s=raw["setup_s"], first_step_s=raw["first_step_s"], warmup_step_s=raw["warmup_step_s"],
                      wall_s=raw["wall_s"], error=raw.get("error"))
            rows[tuple(row.point[name] for name in space)] = row
        missing = [point for point in itertools.product(*space.values()) if point not in rows]
        if missing:
            raise ConfigError("rows", "one per config of the space (the table is a full grid)",
                              f"{len(missing)} missing, e.g. {dict(zip(space, missing[0]))}")
        if not any(row.throughput is not None for row in rows.values()):
            raise ConfigError("rows", "at least one config that trained", "every one failed")
        base = data["base_config"]
        return cls(space, data["baseline"], base["windows"], base["warmup_steps"], rows, data.get("machine", {}), base)

    @classmethod
    def load(cls, path: str) -> "Table":
        with open(path) as table:
            return cls.from_dict(json.load(table))

    def key(self, point: Mapping[str, Any]) -> tuple:
        return tuple(point[name] for name in self.space)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def total_s(self) -> float:
        """The full grid's device-seconds: every config once, to its end."""
        return sum(row.wall_s for row in self.rows.values())

    @property
    def best(self) -> float:
        return max(row.throughput for row in self.rows.values() if row.throughput is not None)

    def within_tolerance(self, key: tuple, tolerance: float = TOLERANCE) -> bool:
        truth = self.rows[key].throughput
        return truth is not None and truth >= (1 - tolerance) * self.best


# --------------------------------------------------------------------------- searchers

class Searcher(Protocol):
    def ask(self) -> tuple[Any, dict]:
        """A handle for ``tell`` and the proposed point."""

    def tell(self, handle: Any, value: Optional[float]) -> None:
        """The value seen for the proposal (None: the trial failed)."""


class OptunaSearcher:
    """An Optuna sampler asked and told one trial at a time, as Ray's OptunaSearch drives
    it in the tool: points to evaluate are enqueued first; a failure is a FAIL trial
    (FailureAwareOptunaSearch), any value a COMPLETE one."""

    def __init__(self, sampler, space: Mapping[str, tuple], first: Iterable[Mapping[str, Any]] = ()):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.distributions = {name: optuna.distributions.CategoricalDistribution(choices)
                              for name, choices in space.items()}
        for point in first:
            self.study.enqueue_trial(dict(point))

    def ask(self) -> tuple[Any, dict]:
        trial = self.study.ask(self.distributions)
        return trial, dict(trial.params)

    def tell(self, handle: Any, value: Optional[float]) -> None:
        import optuna

        if value is None:
            self.study.tell(handle, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(handle, value)


class ShuffledGrid:
    """Every point of the space once, in a seeded random order (the tool's grid sampler
    also visits its points in a seeded random order)."""

    def __init__(self, space: Mapping[str, tuple], seed: int):
        self.points = [dict(zip(space, values)) for values in itertools.product(*space.values())]
        random.Random(seed).shuffle(self.points)

    def ask(self) -> tuple[Any, dict]:
        return None, self.points.pop(0)

    def tell(self, handle: Any, value: Optional[float]) -> None:
        pass


def make_searcher(sampler: str, table: Table, seed: int, num_samples: int, warm_points: Sequence[Mapping] = (),
                  told: Sequence[tuple[Mapping, float]] = (), guess: Optional[Mapping] = None) -> Searcher:
    """``tpe`` as the tool builds it (sweeps/driver/run/lifecycle.py: _searcher: the constant
    liar), with the baseline first; ``tpe-plain``, the same without the liar; ``grid``,
    every config in a seeded random order; ``random`` (Optuna's RandomSampler), a
    reference the tool does not offer. A warm start (TPE only, as in the tool):
    ``warm_points`` proposed before the baseline, ``told`` (point, value) known to TPE as
    completed trials before its first proposal (warm_replay.py). ``guess``: the platform's
    first guess, proposed right after the baseline (guess_replay.py; TPE only, as in the tool)."""
    import optuna

    startup = startup_trials(SimpleNamespace(num_samples=num_samples))
    if sampler not in ("tpe", "tpe-plain") and (warm_points or told or guess):
        raise ConfigError("warm start" if warm_points or told else "first guess", "a TPE searcher (tpe, tpe-plain)",
                          sampler)
    if sampler in ("tpe", "tpe-plain"):
        tpe = (concurrency_aware_tpe(seed, startup) if sampler == "tpe"  # plain: what the liar is measured against
               else optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=False))
        first = unique_points([*warm_points, table.baseline, *([guess] if guess else [])])
        searcher = OptunaSearcher(tpe, table.space, first=first)
        searcher.study.add_trials(warm_trials(told, searcher.distributions, objectives=1))
        return searcher
    if sampler == "grid":
        return ShuffledGrid(table.space, seed)
    if sampler == "random":
        return OptunaSearcher(optuna.samplers.RandomSampler(seed=seed), table.space)
    raise ConfigError("sampler", "one of tpe, tpe-plain, grid, random", sampler)


def make_asha(windows: int):
    """Ray Tune's ASHA as the tool configures it (sweeps/driver/run/lifecycle.py: _scheduler): the
    scheduler itself, so its cutoff rule is Ray's and not a copy (at a rung, a trial
    below the median of the values recorded there stops)."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="training_iteration", metric=METRIC, mode="max", max_t=windows,
                         grace_period=1, reduction_factor=2)


@dataclass(frozen=True)
class Policy:
    """A searcher and the early stopping it runs with."""

    name: str
    sampler: str  # tpe, grid, random
    asha: bool = False
    reject: bool = False
    # At concurrency (concurrent_replay.py): proposals of a running config withdrawn before
    # the slot waits; None: the tool's (searchers.py MAX_RUNNING_REPEATS); 1: the tool
    # before the constant liar, whose slot waited at the first.
    running_repeats: Optional[int] = None


def rejection(row: Row, best_so_far: Optional[float], ratio: float,
              warmup_steps: int) -> Optional[tuple[str, float, float]]:
    """Where the training loop's rejection rule (trainables/loop/rejection.py: StepGuard) stops
    ``row``, if it does: (stage, device-seconds spent, throughput reported).

    The rule: a step time ``deadline`` = batch * ratio / best projects exactly best / ratio.
    The first step is abandoned once it runs FIRST_STEP_ALLOWANCE deadlines; each later
    warm-up step once it runs one deadline; and after each timed step (warm-up and the
    first window) the trial stops when the mean of its steps since the first is past the
    deadline. An abandoned step reports what it projects at best (its time so far). The
    table has the warm-up's mean step, not each step's: every warm-up step after the
    first is taken to run at that mean, and each first-window step at the window's mean.
    The grid compiles nothing (a compiling config's first step is the compile limit's)."""
    if best_so_far is None or row.first_step_s is None or row.setup_s is None:
        return None
    deadline = row.batch_size * ratio / best_so_far
    if row.first_step_s > FIRST_STEP_ALLOWANCE * deadline:
        waited = FIRST_STEP_ALLOWANCE * deadline
        return "first step", row.setup_s + waited, row.batch_size / waited
    if row.warmup_step_s is None:
        return None
    if warmup_steps > 1 and row.warmup_step_s > deadline:
        return "warm-up", row.setup_s + row.first_step_s + deadline, row.batch_size / deadline
    if not row.windows:
        return None
    # The first window: its steps enter the running mean one by one; the trial stops at
    # the first step that takes the mean past the deadline.
    first = row.windows[0]
    warm = warmup_steps - 1  # the steps timed before the window (the first step is not)
    window_steps = round(first.throughput * first.measured_s / row.batch_size)
    window_step_s = first.measured_s / window_steps if window_steps else float("inf")
    if window_step_s <= deadline:
        return None
    steps = math.floor(warm * (deadline - row.warmup_step_s) / (window_step_s - deadline)) + 1
    if steps > window_steps:
        return None
    mean_s = (warm * row.warmup_step_s + steps * window_step_s) / (warm + steps)
    spent = row.setup_s + row.first_step_s + warm * row.warmup_step_s + steps * window_step_s
    return "first window", spent, row.batch_size / mean_s

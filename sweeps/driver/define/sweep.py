"""What a sweep is: its search, its trainable and config, its objectives and where it
records (``Sweep``, ``Objective``, ``SweepConfig``, ``declare_metrics``), and what running
one gives back (``SweepResult``). ``Sweep``'s docstring gives the protocol a user's own
trainable and config keep; plan.py validates a Sweep, lifecycle.py runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.record.tracking_buffer import DEFAULT_WAIT_S
from accelsweep.sweeps.driver.define.space import SpaceSpec
from accelsweep.trainables.config import DictConfig
from accelsweep.trainables.cost import NO_BASIS_CLI_HINT, NO_BASIS_HINT, CostBasis
from accelsweep.trainables.errors import ConfigError, one_of, positive_int
from accelsweep.trainables.loop.rejection import REJECT_RATIO
from accelsweep.trainables.metrics import MetricSet
from accelsweep.trainables.platforms import get_platform

if TYPE_CHECKING:
    from accelsweep.sweeps.driver.define.plan import Plan

SCHEDULERS = ("asha", "median", "none")
SAMPLERS = ("tpe", "grid")
MODES = ("max", "min")


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
    """A sweep, validated whole (``plan_sweep``) before anything starts. It runs any trainable
    and config that keep this protocol (examples/user_trainable.py):

    - the config (``base``, the baseline): ``platform``, ``to_dict()`` giving a flat dict of
      its fields, and a classmethod ``from_dict(values)`` that raises ConfigError for a bad
      value (each trial's config is the base's dict with the searched knobs over it, built
      in the driver before any trial starts). Optional: ``cpus_per_worker`` and ``workers``
      (a trial holds their product of CPUs), ``windows`` (results a trial reports; early
      stopping needs 2 or more), ``trial_env()``. ``SweepConfig`` is such a config;
    - the trainable: called in the trial's process as ``trainable(searched, base=base_dict,
      cost=cost_basis)``, reporting each window's figures with ``ray.tune.report({...})``;
      an exception ends the trial as a failed result;
    - its metrics: a ``MetricSet`` declared with ``declare_metrics`` (or given as
      ``metrics``); objectives must name declared metrics."""

    name: str
    trainable: Callable[..., None]  # (searched, base=..., cost=...), reports through tune.report
    base: Any  # the baseline config: the protocol in this class's docstring (e.g. a SweepConfig)
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
    # kept in order meanwhile (record/tracking_buffer.py: why 600); then it stops, the
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
    # Show Ray's, Tune's and MLflow's own output (banners, Ray's log lines) and every
    # trial's output as it ends; by default only the tool's lines, and a trial's output
    # only when it failed (it is always kept in the trial's MLflow run: trial-output.log).
    verbose: bool = False
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
    # more than this factor stops itself (trainables/loop/rejection.py); None: never. Only with
    # one objective (with several, a trial slow on one may be on the Pareto set).
    reject_ratio: Optional[float] = REJECT_RATIO
    # Seconds a trial's compile (its first step, when it compiles) may take; past it the
    # trial fails with cause "compile". None: no limit.
    max_compile_s: Optional[float] = None
    # Seconds a trial may go without reporting (from its start, or its last report): past
    # it the driver kills its process tree and records it FAILED, cause "timeout", not
    # retried (sweeps/driver/run/deadline.py). None: no deadline. Must exceed the longest gap
    # between a trial's reports, its start (imports, a compile) included.
    trial_timeout_s: Optional[float] = None
    # Run a config again when the searcher proposes it again; by default its earlier
    # result is reused (tagged so in MLflow) and the searcher is told it.
    repeats: bool = False
    # Configs (knob -> value, points of the space) proposed first, in this order, before
    # the searcher's own; they replace the baseline-first rule (list the baseline to keep
    # it first). With ``repeats``, a config listed twice runs twice (``remeasure``).
    points: Sequence[Mapping[str, Any]] = ()
    # With TPE and no ``points``: right after the baseline, propose the platform's first
    # guess (its rules of thumb for this hardware: bf16 where native, every core computing,
    # the largest batch, ...; sweeps/driver/define/first_guess.py). False: none.
    first_guess: bool = True
    # Where the sweep's Optuna study is kept (sweeps/driver/record/optuna_study.py): an SQLAlchemy URL;
    # None: beside a sqlite MLflow store (mlflow.db: mlflow.optuna.db), else under storage_path.
    study_storage: Optional[str] = None
    # At the end, the report (tables and plots) is logged on the parent run (report_artifacts.py).
    report: bool = True
    # When the search ends, the baseline and its best configs are measured again in this
    # many interleaved rounds, and the sweep's verdict is theirs (confirm.py); 0: none.
    # With a time budget, the search leaves confirm.CONFIRM_BUDGET_SHARE of it to them.
    confirm_rounds: int = 0
    # The search's last proposals that step from the best config so far to an unmeasured
    # neighbour (one knob one choice away: batch x2 or /2, workers +-1, ...) instead of
    # sampling (searchers.py); None: a quarter of num_samples, at most LOCAL_SEARCH_MAX,
    # with TPE and one objective; 0: none.
    local_search: Optional[int] = None
    # While the best config so far sits on the largest value of an ordered knob its
    # platform declares (batch size, loader workers, threads), propose it one step past the
    # space's edge (define/edges.py), again while the step leads or is near it; a quarter of num_samples
    # at most. Off by default: a user's own space is taken as written (the main job turns it on).
    past_edge: bool = False
    # End the sweep once a trial has run whole, uncontended, at or above this share of the
    # hardware's peak (its mfu: trainables/utilisation.py); None: never (sweeps/driver/run/goal.py).
    stop_at_utilisation: Optional[float] = None
    # Start from an earlier sweep (its parent run's name or id; sweeps/driver/define/warm_start.py):
    # its best configs valid here are proposed first, and the searcher is told its results
    # where hardware, workload and versions match. None: from nothing.
    warm_start: Optional[str] = None
    # The MLflow store that sweep is in; None: tracking_uri.
    warm_start_store: Optional[str] = None


    def __post_init__(self) -> None:
        # A basis given without its note: the note says the basis, not that there is none.
        if self.cost is not None and self.cost_note in (NO_BASIS_HINT, NO_BASIS_CLI_HINT):
            self.cost_note = (f"price basis: {self.cost.instance_type or 'this machine'} at "
                              f"${self.cost.usd_per_hour:g}/h ({self.cost.source})")


@dataclass
class SweepResult:
    """What ``run_sweep`` returns. Each record's ``run_id`` is its trial's MLflow run."""

    records: list[TrialRecord]
    # The sweep's answer: the trial of the config the confirmation's verdict names when one
    # ran and judged, else the best measured trial by the first objective (``search_leader``).
    best: Optional[TrialRecord]
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
    # The sweep's verdict on its best against its baseline (sweeps/driver/reporting/verdict.py): the
    # confirmation phase's when it ran (``confirmations``: its trials), else the search's.
    verdict: Optional[Any] = None
    confirmations: list[TrialRecord] = field(default_factory=list)
    # On a cluster other sweeps share: seconds it waited for a place with no trial running
    # (not counted in its time budget; sweeps/driver/run/fair_share.py).
    waited_s: float = 0.0
    # The search's best measured trial by the first objective (one trial per config).
    search_leader: Optional[TrialRecord] = None

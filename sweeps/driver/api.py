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

from accelsweep.sweeps.driver.lifecycle import run_sweep
from accelsweep.sweeps.driver.plan import Plan, plan_sweep, preflight, remeasure
from accelsweep.sweeps.driver.sweep import Objective, Sweep, SweepConfig, SweepResult, declare_metrics

__all__ = ["Objective", "Plan", "Sweep", "SweepConfig", "SweepResult", "declare_metrics", "plan_sweep", "preflight",
           "remeasure", "run_sweep"]

"""accelsweep: performance sweeps that run themselves (Ray Tune + Optuna + MLflow).

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast"])

    sweep = accelsweep.Sweep(name="my_study", trainable=accelsweep.train_trainable,
                             base=accelsweep.TrialConfig.make(model="vit-tiny"), space=space, num_samples=8)
    result = accelsweep.run_sweep(sweep)

Every name a sweep script needs is here. Each is imported on first use, so that a trial's
process, which imports ``accelsweep.trainables``, does not pay for Ray Tune, Optuna and MLflow.
The modules behind them are the advanced API (``docs/layout.md`` maps them).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import TYPE_CHECKING

from accelsweep._moved import install_moved_paths

# In a checkout used without an install (the lent GPU machine's runner puts the repository
# on PYTHONPATH), sweeps/, trainables/ and kernels/ sit beside this folder: setup.py's
# mapping, done here.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("accelsweep.trainables") is None and os.path.isfile(os.path.join(_CHECKOUT, "setup.py")):
    __path__.append(_CHECKOUT)

_DRIVER = "accelsweep.sweeps.driver"
# public name -> the module that defines it
_PUBLIC = {
    # a sweep: what it is, its plan, its run
    **dict.fromkeys(["Sweep", "Objective", "SweepConfig", "SweepResult", "declare_metrics"], f"{_DRIVER}.define.sweep"),
    **dict.fromkeys(["Plan", "plan_sweep", "preflight", "remeasure"], f"{_DRIVER}.define.plan"),
    "run_sweep": f"{_DRIVER}.run.lifecycle",
    # the flags every study shares
    **dict.fromkeys(["common_parser", "sweep_options", "platform_from_args", "main_guard", "cost_basis"],
                    f"{_DRIVER}.define.cli"),
    # what a trial runs: its config, workload and metrics
    **dict.fromkeys(["TrialConfig", "DictConfig"], "accelsweep.trainables.config"),
    "train_trainable": "accelsweep.trainables.trainable",
    **dict.fromkeys(["Workload", "WorkloadKnobs", "knob"], "accelsweep.trainables.workloads.base"),
    **dict.fromkeys(["import_path", "importable_module"], "accelsweep.trainables.importing"),
    **dict.fromkeys(["Metric", "MetricSet", "TRAINING_METRICS", "KERNEL_METRICS"], "accelsweep.trainables.metrics"),
    **dict.fromkeys(["ConfigError", "one_of"], "accelsweep.trainables.errors"),
    **dict.fromkeys(["CostBasis", "resolve_cost_basis"], "accelsweep.trainables.cost"),
    # kernel ops and their sweeps
    **dict.fromkeys(["OpSpec", "KernelImpl", "KernelUnavailable"], "accelsweep.kernels.registry"),
    "build_kernel_sweep": f"{_DRIVER}.run.kernel_sweep",
    # reading results back
    **dict.fromkeys(["load_sweep", "SweepHistory", "find_sweep_run"], f"{_DRIVER}.record.history"),
    "mlflow_client": f"{_DRIVER}.record.tracking",
    "TrialRecord": f"{_DRIVER}.record.trial_record",
    "compare_sweeps": f"{_DRIVER}.reporting.comparison",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'accelsweep' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


install_moved_paths()

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name loads on first use
    from accelsweep.kernels.registry import KernelImpl, KernelUnavailable, OpSpec
    from accelsweep.sweeps.driver.define.cli import (common_parser, cost_basis, main_guard, platform_from_args,
                                                     sweep_options)
    from accelsweep.sweeps.driver.define.plan import Plan, plan_sweep, preflight, remeasure
    from accelsweep.sweeps.driver.define.sweep import Objective, Sweep, SweepConfig, SweepResult, declare_metrics
    from accelsweep.sweeps.driver.record.history import SweepHistory, find_sweep_run, load_sweep
    from accelsweep.sweeps.driver.record.tracking import mlflow_client
    from accelsweep.sweeps.driver.record.trial_record import TrialRecord
    from accelsweep.sweeps.driver.reporting.comparison import compare_sweeps
    from accelsweep.sweeps.driver.run.kernel_sweep import build_kernel_sweep
    from accelsweep.sweeps.driver.run.lifecycle import run_sweep
    from accelsweep.trainables.config import DictConfig, TrialConfig
    from accelsweep.trainables.cost import CostBasis, resolve_cost_basis
    from accelsweep.trainables.errors import ConfigError, one_of
    from accelsweep.trainables.importing import import_path, importable_module
    from accelsweep.trainables.metrics import KERNEL_METRICS, TRAINING_METRICS, Metric, MetricSet
    from accelsweep.trainables.trainable import train_trainable
    from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob

"""Fault injection: every way a trial can fail ends as a FAILED MLflow run with its
class, message and cause, the searcher is told, and the sweep goes on.

The faults are real: a Python exception, an allocation the machine cannot satisfy, a
training run driven to a NaN loss, a torch.compile backend that fails, and the trial's
process killed with SIGKILL (retried once, as for a lost node, then failed)."""

import functools
import os
import signal
import sys
from dataclasses import dataclass
from typing import Optional

import pytest

from tests.test_sweep_e2e import mlflow_runs
from accelsweep.trainables.config import DictConfig

EXPECTED_CAUSE = {"raise": "error", "oom": "oom", "nan": "nan", "nan-capture": "nan", "compile": "compile",
                  "sigkill": "killed"}


@dataclass(frozen=True)
class FaultConfig(DictConfig):
    platform: str = "cpu"
    fault: str = "none"
    cpus_per_worker: int = 1
    workers: int = 1
    instance_type: Optional[str] = None
    windows: int = 1


def faulty_trainable(searched, base, cost=None):
    import torch

    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.loop.train_loop import run_training

    fault = searched["fault"]
    training = TrialConfig.make(model="vit-micro", batch_size=8, warmup_steps=1, window_min_steps=2, window_min_s=0.0,
                                windows=1 if fault != "nan" else 2)
    if fault == "raise":
        raise ValueError("injected: the trial raised")
    if fault == "oom":
        torch.empty(2 ** 42, dtype=torch.float32)  # 16 TiB: more than this machine can give
    if fault == "nan":
        training = training.replace(learning_rate=1e30)  # diverges within a window: a real NaN loss
    if fault == "nan-capture":
        import accelsweep.trainables.workloads.random_images as data
        from tests.test_nan_capture import PoisonedDataset

        poisoned = functools.partial(PoisonedDataset, poisoned_item=1 * training.batch_size + 2)  # step 1
        data.RandomImageDataset = poisoned  # this trial's process only
        training = training.replace(nan_capture=True)
    if fault == "compile":
        def broken_backend(graph, example_inputs):
            raise RuntimeError("injected: the compiler backend failed")

        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1, backend=broken_backend)(torch.ones(4))
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    from ray import tune

    run_training(training, report=tune.report)


@pytest.mark.slow
def test_each_failure_kind_is_a_failed_run_and_the_sweep_goes_on(ray_session, tracking_uri):
    import ray.cloudpickle

    from accelsweep import Objective, Sweep, run_sweep
    from accelsweep.trainables.metrics import TRAINING_METRICS

    import tests.test_nan_capture

    for module in (sys.modules[__name__], tests.test_nan_capture):  # Ray workers cannot import tests/
        ray.cloudpickle.register_pickle_by_value(module)
    faults = ["none", "raise", "oom", "nan", "nan-capture", "compile", "sigkill"]
    lines = []
    result = run_sweep(Sweep(
        name="faults", trainable=faulty_trainable, base=FaultConfig(),
        space=lambda trial: {"fault": trial.suggest_categorical("fault", faults)},
        objectives=[Objective("throughput_samples_per_s", "max")], metrics=TRAINING_METRICS,
        num_samples=len(faults), sampler="grid", scheduler="none", tracking_uri=tracking_uri, retries=1,
        print_line=lines.append))

    parents, children = mlflow_runs(tracking_uri, "faults")
    assert [p.info.status for p in parents] == ["FINISHED"]
    by_fault = {run.data.params["fault"]: run for run in children}
    assert sorted(by_fault) == sorted(faults) and len(children) == len(faults)  # one run per trial
    assert by_fault["none"].info.status == "FINISHED"
    assert by_fault["none"].data.metrics["throughput_samples_per_s"] > 0
    for fault, cause in EXPECTED_CAUSE.items():
        run = by_fault[fault]
        assert run.info.status == "FAILED", (fault, run.info.status)
        assert run.data.tags["error_cause"] == cause, (fault, run.data.tags)
        assert run.data.tags["error_class"] and run.data.tags["error"], fault
    assert "injected: the trial raised" in by_fault["raise"].data.tags["error"]
    assert "allocate" in by_fault["oom"].data.tags["error"]
    assert by_fault["nan"].data.tags["error_class"] == "NonFiniteLoss"
    captured = by_fault["nan-capture"]
    assert captured.data.tags["error_class"] == "NonFiniteGradient"
    assert captured.data.tags["nan_capture_artifact"] == "nan_capture.pt"
    assert captured.data.metrics["nan_step"] == 1
    from mlflow.tracking import MlflowClient

    artifacts = [a.path for a in MlflowClient(tracking_uri).list_artifacts(captured.info.run_id)]
    assert sorted(artifacts) == ["nan_capture.pt", "trial-output.log"]  # the capture travels with its trial's run
    output_log = MlflowClient(tracking_uri).download_artifacts(captured.info.run_id, "trial-output.log")
    with open(output_log) as kept:
        text = kept.read()
    assert "Traceback" in text and "NonFiniteGradient" in text  # where it failed, kept with the run
    assert "injected: the compiler backend failed" in by_fault["compile"].data.tags["error"]
    assert by_fault["sigkill"].data.tags["retries"] == "1"  # restarted once, as for a lost node
    summary_line = next(line for line in result.summary.splitlines() if line.startswith("failures by cause:"))
    for cause in set(EXPECTED_CAUSE.values()):
        count = list(EXPECTED_CAUSE.values()).count(cause)
        assert f"{cause} x{count}" in summary_line, summary_line
    assert sum("FAILED (" in line for line in lines) == len(EXPECTED_CAUSE)


def test_the_searcher_is_told_a_reported_failure_is_a_failure():
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    searcher = FailureAwareOptunaSearch(lambda trial: {"x": trial.suggest_categorical("x", [1, 2])},
                                        metric="throughput_samples_per_s", mode="max", seed=0)
    searcher.suggest("trial-a")
    searcher.suggest("trial-b")
    searcher.on_trial_complete("trial-a", result={"trial_failed": 1, "throughput_samples_per_s": float("nan")})
    searcher.on_trial_complete("trial-b", result={"throughput_samples_per_s": 10.0})
    states = [t.state for t in searcher._ot_study.trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]

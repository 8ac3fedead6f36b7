"""Whole sweeps on local Ray into a temporary sqlite MLflow store, read back through
the MLflow client."""

import re
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO


def mlflow_runs(uri, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


@pytest.mark.slow
def test_main_job_smoke_sweep_lands_in_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    done = subprocess.run(
        [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", "4", "--tracking-uri", uri,
         "--storage-path", str(tmp_path / "ray"), "--price-per-hour", "0.357", "--experiment", "X"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "baseline" in out and "best (trial" in out and "throughput (samples/s)" in out
    assert "$ per 1M samples" in out and "mean overhead per trial" in out
    assert f"mlflow ui --backend-store-uri {uri}" in out

    parents, children = mlflow_runs(uri, "X")
    reused = [r for r in children if r.data.tags["status"] == "reused"]  # repeated proposals: answered, not run
    assert all(r.data.tags["reused_from_trial"] for r in reused)
    assert len(parents) == 1 and len(children) - len(reused) == 4
    parent_id = parents[0].info.run_id
    searched = ["batch_size", "num_workers", "precision", "patch_embed", "threads", "channels_last"]
    for run in children:
        if run in reused:
            continue
        metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
        assert tags["mlflow.parentRunId"] == parent_id
        assert run.info.status == "FINISHED", tags.get("error")
        assert metrics["throughput_samples_per_s"] > 0
        assert math.isfinite(metrics["usd_per_1m_samples"])
        assert metrics["step_time_p50_s"] > 0
        if tags["status"] == "rejected":  # stopped by its first steps: a projection, and why
            assert "more than 3x worse" in tags["rejection"] and metrics["windows_done"] == 0
            continue
        assert math.isfinite(metrics["final_loss"])
        assert metrics["trial_cost_usd"] > 0 and metrics["overhead_s"] >= 0
        for knob in searched:
            assert knob in params
        assert tags["platform"] == "cpu" and tags["version.torch"] and tags["version.ray"]
        assert "$0.357/h" in tags["cost_basis"]
    baselines = [r for r in children if r.data.tags["baseline"] == "true"]
    assert len(baselines) == 1
    assert baselines[0].data.params["batch_size"] == "16" and baselines[0].data.params["precision"] == "fp32"


def failing_for_batch_8(searched, base, cost=None):
    if searched["batch_size"] == 8:
        raise RuntimeError("injected failure for batch_size=8")
    from accelsweep.trainables.trainable import train_trainable

    train_trainable(searched, base, cost)


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_sweep_goes_on(ray_session, tracking_uri):
    import ray.cloudpickle

    from accelsweep.sweeps.driver.api import Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.cost import resolve_cost_basis
    from accelsweep.trainables.metrics import TRAINING_METRICS

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    basis, note = resolve_cost_basis(price_per_hour=0.357, local_units={"CPU": 2}, detect=False)
    lines = []
    result = run_sweep(Sweep(
        name="failing", trainable=failing_for_batch_8, metrics=TRAINING_METRICS,
        base=TrialConfig.make(model="vit-micro", cpus_per_worker=2, batch_size=16, warmup_steps=1,
                              window_min_steps=2, window_min_s=0.05, windows=1),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [8, 16])},
        num_samples=3, scheduler="none", tracking_uri=tracking_uri, cost=basis, cost_note=note,
        print_line=lines.append,
    ))
    statuses = sorted(r.status for r in result.records if r.status != "reused")
    # Two configs: each runs once (the failing one is not run again), then the space is used up.
    assert statuses == ["failed", "finished"]
    assert "search: 2 of 3 planned trials ran; the searcher ran out of new configs" in result.summary
    assert result.baseline is not None and result.baseline.status == "finished"
    assert re.search(r"failures by cause: error x\d \(RuntimeError\)", result.summary), result.summary
    _, children = mlflow_runs(tracking_uri, "failing")
    failed = [r for r in children if r.info.status == "FAILED"]
    assert len([r for r in children if r.data.tags["status"] != "reused"]) == 2 and failed
    for run in failed:
        assert run.data.tags["error_class"] == "RuntimeError"
        assert "injected failure for batch_size=8" in run.data.tags["error"]
    assert any("FAILED (error): RuntimeError" in line for line in lines)

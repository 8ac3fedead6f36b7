"""sweeps/metric_collection.py (seed 003's TorchMetrics study): public API only; each
metrics_mode changes what the seed says it changes, counted as would-be host-device syncs;
every mode computes the same metrics; the study runs end to end and logs its figures."""

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

# Whether it is installed, not imported: importing TorchMetrics (it loads scipy.signal) costs
# about 3 s of every test process's collection; the tests that use it import it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchmetrics") is None,
                                reason="torchmetrics is not installed (pip install -e '.[dev]')")

from accelsweep.sweeps import metric_collection as study  # noqa: E402
from accelsweep.trainables.platforms import get_platform  # noqa: E402
from accelsweep.trainables.workloads import metric_collection as workload  # noqa: E402
from accelsweep.trainables.config import TrialConfig  # noqa: E402
from accelsweep.trainables.loop.train_loop import run_training  # noqa: E402
from accelsweep.trainables.timing.limiter import PROFILED_STEPS  # noqa: E402
from accelsweep.trainables.workloads.base import load_workload  # noqa: E402
from tests.test_examples import run_smoke  # noqa: E402
from tests.test_platform_knowledge import assert_study_imports  # noqa: E402

SCRIPT = Path(study.__file__)
FIXED = [mode for mode in workload.MODES if mode not in ("none", "naive")]


def test_the_study_composes_the_public_api_its_platform_and_its_workload():
    assert_study_imports(SCRIPT, workload.__name__)


def test_the_workload_path_is_what_import_path_gives():
    from accelsweep.trainables.workloads.base import import_path

    assert study.WORKLOAD == import_path(workload.MetricCollection) == (
        "accelsweep.trainables.workloads.metric_collection:MetricCollection")


def test_the_naive_way_performs_more_host_device_syncs_than_each_fix():
    counts = {mode: workload.count_syncs(mode) for mode in workload.MODES}
    assert counts["none"]["total"] == 0
    # naive: the loss's float weight is copied to the device (1), its NaN check reads two
    # flags (2); the step time and its float weight are copied (2), its NaN check reads (2).
    assert counts["naive"] == {"host-to-device": 3, "read": 4, "total": 7}
    for mode in FIXED:
        assert counts[mode]["total"] < counts["naive"]["total"], mode
    assert counts["explicit-weights"] == {"host-to-device": 2, "read": 4, "total": 6}  # the loss's weight
    assert counts["no-nan-check"] == {"host-to-device": 3, "total": 3}  # no reads at all
    # A host tensor for the step time, or its metric on the host: none of its copies or reads.
    assert counts["tensor-updates"] == counts["host-placement"] == {"host-to-device": 1, "read": 2, "total": 3}
    assert counts["all-fixes"]["total"] == 0


def test_the_counter_counts_reads_of_device_values_only():
    on_device, on_host = torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])
    counter = workload.WouldBeSyncs()
    with counter:
        counter.on_device(on_device)
        for tensor in (on_device, on_host):
            bool(torch.isnan(tensor).any())
            tensor.sum().item()
            float(tensor[0])
            tensor.tolist()
            tensor.cpu()
            torch.unique(tensor)
            tensor[tensor > 0]
        torch.as_tensor(1.0)  # host data outside a device-placed metric: stays on the host
    assert counter.counts == {"read": 5, "data-dependent": 2}


def test_a_device_metric_made_from_a_python_number_counts_a_copy():
    from torchmetrics import MeanMetric

    metric, counter = MeanMetric(nan_strategy="disable"), workload.WouldBeSyncs()
    counter.counting_updates(metric)
    with counter:
        metric.update(0.5, weight=1.0)
    assert counter.counts == {"host-to-device": 2}


def _states(mode, steps=workload.COMPUTE_EVERY):
    torch.manual_seed(0)
    batches = [(torch.randn(8, workload.NUM_CLASSES), torch.randint(workload.NUM_CLASSES, (8,))) for _ in range(4)]
    metrics = workload.StepMetrics(mode, torch.device("cpu"))
    for step in range(steps):
        outputs, targets = batches[step % len(batches)]
        metrics.update(outputs, targets, torch.nn.functional.cross_entropy(outputs, targets))
    return metrics


def test_every_fix_computes_what_the_naive_way_computes():
    naive = _states("naive").values
    assert set(naive) == {"avg_loss", "accuracy", "precision", "recall", "f1_score", "avg_step_time"}
    assert naive["avg_step_time"] > 0
    for mode in FIXED:
        values = _states(mode).values
        assert values.keys() == naive.keys()
        for name in naive.keys() - {"avg_step_time"}:  # the step time is this run's own
            assert values[name] == pytest.approx(naive[name], rel=1e-6), (mode, name)


def test_each_mode_builds_the_metrics_the_seed_describes():
    for mode in workload.MODES[1:]:
        metrics = workload.StepMetrics(mode, torch.device("cpu"))
        means = [metrics.on_device["avg_loss"], (metrics.on_host | metrics.on_device)["avg_step_time"]]
        disabled = mode in ("no-nan-check", "all-fixes")
        assert all((m.nan_strategy == "disable") == disabled for m in means), mode
        assert ("avg_step_time" in metrics.on_host) == (mode == "host-placement"), mode
        if mode == "host-placement":
            assert metrics.on_host["avg_step_time"].sync_on_compute is False


@pytest.mark.slow
def test_the_loop_runs_the_mode_a_trial_asks_for():
    config = TrialConfig.make(workload=study.WORKLOAD, metrics_mode="no-nan-check", network="small-cnn",
                              image_size=16, batch_size=4, warmup_steps=1, window_min_steps=2, window_min_s=0.0,
                              windows=1)
    result = run_training(config)
    loaded = load_workload(study.WORKLOAD)
    assert result["throughput_samples_per_s"] > 0
    # Warm-up, measured, and the limiter's profiled steps (trainables/timing/limiter.py).
    assert loaded.metrics.steps == 3 + PROFILED_STEPS and loaded.metrics.fixes == {"no_nan_check"}
    run_training(TrialConfig.from_dict({**config.to_dict(), "metrics_mode": "none"}))
    assert loaded.metrics is None  # a new trial: the last trial's metrics are gone, none made


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["cuda", "neuron"])
def test_the_dry_run_shows_the_space_without_the_hardware(platform):
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--platform", platform],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"on platform '{platform}'" in run.stdout and "baseline: {'metrics_mode': 'none'}" in run.stdout
    assert "resnet18 on 224x224 random images, batch 128" in run.stdout
    assert all(f"'{mode}'" in run.stdout for mode in workload.MODES)
    assert f"on {platform}: each costs {get_platform(platform).host_read_cost}" in run.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_naive_way_synchronizes_more_than_all_fixes():
    def syncs(mode):
        metrics = workload.StepMetrics(mode, torch.device("cuda"))
        outputs = torch.randn(8, workload.NUM_CLASSES, device="cuda")
        targets = torch.randint(workload.NUM_CLASSES, (8,), device="cuda")
        loss = torch.nn.functional.cross_entropy(outputs, targets)
        metrics.update(outputs, targets, loss)  # the first step has no step time
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                metrics.update(outputs, targets, loss)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in caught)

    assert syncs("naive") > syncs("all-fixes")


@pytest.mark.slow
def test_the_study_runs_and_logs_each_trials_cost_against_no_metrics(tmp_path, shared_ray):
    from mlflow.tracking import MlflowClient

    run, uri = run_smoke(SCRIPT, tmp_path, *shared_ray.flags)
    table = run.stdout[run.stdout.index("Throughput cost of each way"):]
    assert all(f"\n{mode} " in table for mode in workload.MODES), table
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED"
    assert sorted(t.data.params["metrics_mode"] for t in trials) == sorted(workload.MODES)
    for trial in trials:
        assert trial.info.status == "FINISHED", trial.data.tags.get("error")
        mode, metrics = trial.data.params["metrics_mode"], trial.data.metrics
        assert metrics["would_be_syncs_per_step"] == workload.count_syncs(mode)["total"]
        if mode == "none":
            assert trial.data.tags["baseline"] == "true" and metrics["throughput_cost_vs_baseline"] == 0
        else:
            assert metrics["throughput_cost_vs_baseline"] < 1

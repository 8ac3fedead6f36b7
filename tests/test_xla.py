"""The XLA training loop for real, on torch-xla's CPU client (PJRT_DEVICE=CPU): the
code path torch-neuronx uses, minus the Neuron compiler. Runs in the XLA venv
(.venv-xla: torch 2.9.0 + torch_xla 2.9.0); ./env/test.sh runs it there."""

import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xla
pytest.importorskip("torch_xla", reason="torch_xla is not installed here: the XLA lane runs in .venv-xla")

from tests.conftest import REPO  # noqa: E402
from tests.test_sweep_e2e import mlflow_runs  # noqa: E402
from accelsweep.trainables.config import TrialConfig  # noqa: E402
from accelsweep.trainables.loop.train_loop import run_training  # noqa: E402
from tests.one_layer_workload import OneLayerImages  # noqa: E402

os.environ.setdefault("PJRT_DEVICE", "CPU")
MICRO = dict(platform="xla", model="vit-micro", cpus_per_worker=2, batch_size=8, warmup_steps=2,
             window_min_steps=4, window_min_s=0.2, windows=2)


@pytest.mark.parametrize("precision, batches_per_execution", [("fp32", 1), ("bf16-autocast", 1), ("bf16", 2)])
def test_steady_state_compiles_nothing(precision, batches_per_execution):
    result = run_training(TrialConfig.make(**MICRO, precision=precision, batches_per_execution=batches_per_execution))
    assert result["throughput_samples_per_s"] > 0 and math.isfinite(result["final_loss"])
    assert result["compile_s"] > 0 and result["xla_compiles_total"] >= 1  # warm-up compiled the graphs
    assert result["xla_compiles"] == 0  # and the measured windows reused them
    assert result["device"].startswith("xla: CPU")
    assert "window mean" in result["step_time_source"]  # XLA is lazy: host clocks per step lie


class DriftingLoss(OneLayerImages):
    """A user workload whose loss sees one sample fewer each step: a new shape, a new graph
    (its model one linear layer: what is counted is graphs)."""

    steps = 0

    def loss(self, outputs, targets):
        DriftingLoss.steps += 1
        keep = len(outputs) - DriftingLoss.steps % len(outputs)
        return super().loss(outputs[:keep], targets[:keep])


def test_a_graph_that_changes_every_step_shows_up_as_recompiles():
    """The recompilation bug users must see: a shape that changes from step to step."""
    result = run_training(TrialConfig.make(**{**MICRO, "windows": 1, "workload": "tests.test_xla:DriftingLoss"}))
    assert result["xla_compiles"] >= 4  # one per measured step


@pytest.mark.parametrize("platform, hardware", [("neuron", "NEURON"), ("tpu", "TPU")])
def test_training_on_neuron_or_tpu_refuses_another_device(platform, hardware, monkeypatch):
    """torch-xla's CPU client is no NeuronCore and no TPU: a trial on platform neuron or
    tpu that got it fails naming what it found, instead of timing the CPU."""
    import torch_xla

    from accelsweep.trainables.platforms import PlatformUnavailable, get_platform

    torch_xla.device()  # this process's PJRT client is the CPU one (tpu's trial_env asks for TPU: too late)
    config = TrialConfig.make(**{**MICRO, "platform": platform, "cpus_per_worker": 1})
    for name in get_platform(platform).trial_env(config):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored after what prepare() sets
    with pytest.raises(PlatformUnavailable, match=f"platform {platform} needs torch-xla on {hardware}, but its "
                                                  r"device is CPU \(PJRT_DEVICE=\w+\): nothing timed"):
        run_training(config)


@pytest.mark.slow
def test_xla_smoke_sweep_records_compiles(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    done = subprocess.run(
        [sys.executable, "sweeps/neuron_vit.py", "--platform", "xla", "--smoke", "--num-samples", "3",
         "--tracking-uri", uri, "--storage-path", str(tmp_path / "ray"), "--experiment", "XLA",
         "--price-per-hour", "0.357"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parents, children = mlflow_runs(uri, "XLA")
    children = [r for r in children if r.data.tags["status"] != "reused"]  # repeated proposals: not run
    assert len(parents) == 1 and len(children) == 3
    for run in children:
        metrics = run.data.metrics
        assert run.info.status == "FINISHED", run.data.tags.get("error")
        if run.data.tags["status"] == "rejected":  # stopped by its first steps: a projection, and why
            assert "more than 3x worse" in run.data.tags["rejection"]
            continue
        assert "xla_compiles" in metrics and metrics["compile_s"] >= 0
        assert run.data.tags["platform"] == "xla" and run.data.tags["version.torch_xla"] == "2.9.0"
        assert "batches_per_execution" in run.data.params

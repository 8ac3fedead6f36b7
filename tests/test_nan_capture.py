"""NaN capture for real, on the CPU with the micro ViT: a batch poisoned with an
infinite pixel at a known step makes every gradient non-finite; the trial must end with
a capture of that step, and the replay command must find the non-finite gradient again
at the same step. The XLA tests run the asynchronous path (flag read at syncs, window
replayed from its start) on torch-xla's CPU client, in the XLA venv."""

import importlib.util
import io
import json
import math
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.workloads.random_images import RandomImageDataset
from accelsweep.trainables.loop.failures import failure_cause
from accelsweep.trainables.loop.nan_capture import CAPTURE_FILE, load_capture
from accelsweep.trainables.loop.nan_overhead import measure_overhead, overhead_config
from accelsweep.trainables.loop.nan_replay import show_replay
from accelsweep.trainables.loop.train_loop import NonFiniteGradient, run_training

# window_min_s=0: every run takes the same steps, so two runs' losses compare exactly.
# Steps: 0 first, 1 warm-up, 2-4 window 1, 5-7 window 2, 8-10 window 3.
MICRO = dict(model="vit-micro", cpus_per_worker=2, batch_size=8, warmup_steps=2, window_min_steps=3,
             window_min_s=0.0, windows=3)
POISONED_STEP = 6  # in window 2, so window 1 has reported before the capture's report


class PoisonedDataset(RandomImageDataset):
    """One image of one step's batch has an infinite pixel (the loop's DataLoader reads
    items in order, ``batch_size`` per step)."""

    def __init__(self, *args, poisoned_item: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.poisoned_item = poisoned_item

    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        if index == self.poisoned_item:
            image = image.clone()
            image[0, 3, 5] = math.inf
        return image, label


@pytest.fixture
def poisoned_batch(monkeypatch):
    """Poison step ``POISONED_STEP``'s batch (the third image of it)."""
    import accelsweep.trainables.workloads.random_images as data

    def poisoned(*args, **kwargs):
        return PoisonedDataset(*args, poisoned_item=POISONED_STEP * MICRO["batch_size"] + 2, **kwargs)

    monkeypatch.setattr(data, "RandomImageDataset", poisoned)


def replay_command(path):
    return subprocess.run([sys.executable, "-m", "accelsweep.trainables.loop.nan_replay", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def run_until_captured(config, capture_dir):
    reports = []
    with pytest.raises(NonFiniteGradient) as caught:
        run_training(config, report=reports.append, capture_dir=str(capture_dir))
    return caught.value, reports


def check_round_trip(error, reports, capture_dir, windows_reported=1):
    path = capture_dir / CAPTURE_FILE
    assert error.capture_path == str(path) and error.step == POISONED_STEP
    assert f"step {POISONED_STEP}" in str(error) and str(path) in str(error)
    assert failure_cause(error) == "nan"  # the sweep records the trial as failed, cause nan

    # The windows done reported, then the capture's report: their result (NaN before the
    # first window) plus where the capture is.
    assert [r["windows_done"] for r in reports] == list(range(1, windows_reported + 1)) + [windows_reported]
    captured = reports[-1]
    assert captured["nan_capture_path"] == str(path) and captured["nan_step"] == POISONED_STEP
    if windows_reported:
        assert captured["throughput_samples_per_s"] == reports[-2]["throughput_samples_per_s"] > 0
    else:
        assert math.isnan(captured["throughput_samples_per_s"])
    assert math.isnan(captured["window_throughput_samples_per_s"])  # the window under way never finished

    capture = load_capture(path)
    assert capture["step"] == POISONED_STEP
    assert torch.isinf(capture["inputs"]).sum() == 1  # the poisoned batch itself
    assert torch.isfinite(torch.cat([t.flatten() for t in capture["model_state"].values()])).all()  # pre-step weights
    assert capture["non_finite_gradients"][0]["parameter"] == captured["nan_parameter"]

    done = replay_command(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "non-finite elements: 1, first at index (2, 0, 3, 5)" in done.stdout  # the poisoned pixel
    assert f"replayed step {POISONED_STEP} on cpu" in done.stdout
    assert f"step {POISONED_STEP}: {captured['nan_parameter']} = {captured['nan_gradient_value']}" in done.stdout
    assert "the same parameters as captured" in done.stdout
    return capture


@pytest.mark.slow
def test_round_trip_capture_reload_non_finite_at_the_same_step(poisoned_batch, tmp_path):
    error, reports = run_until_captured(TrialConfig.make(**MICRO, nan_capture=True), tmp_path)
    check_round_trip(error, reports, tmp_path)


def test_without_the_capture_the_poisoned_step_is_only_a_non_finite_loss(poisoned_batch, tmp_path):
    """The same poison with the option off: the loop's loss check ends it, nothing is saved."""
    from accelsweep.trainables.loop.train_loop import NonFiniteLoss

    with pytest.raises(NonFiniteLoss) as caught:
        run_training(TrialConfig.make(**MICRO), capture_dir=str(tmp_path))
    assert not isinstance(caught.value, NonFiniteGradient)
    assert list(tmp_path.iterdir()) == []


def test_replay_of_a_finite_step_says_not_reproduced(poisoned_batch, tmp_path):
    """The replay really recomputes the step: with the infinite pixel cleaned out of the
    captured batch, the same weights give finite gradients, and the command says so."""
    run_until_captured(TrialConfig.make(**MICRO, nan_capture=True), tmp_path)
    capture = load_capture(tmp_path / CAPTURE_FILE)
    capture["inputs"] = torch.nan_to_num(capture["inputs"], posinf=0.0)
    cleaned = tmp_path / "cleaned.pt"
    torch.save(capture, cleaned)
    out = io.StringIO()
    assert show_replay(str(cleaned), out=out) is False
    assert f"not reproduced: every gradient of step {POISONED_STEP} is finite on cpu" in out.getvalue()


@pytest.mark.slow
def test_a_finite_run_with_the_capture_on_is_the_same_run(tmp_path, monkeypatch):
    # Both runs keep the threads asked: a neighbour of the parallel lane could cut one run's
    # threads (a "threading" note, another reduction order) and not the other's.
    from accelsweep.trainables.platforms.cpu import CpuPlatform

    fit = CpuPlatform.thread_fit
    monkeypatch.setattr(CpuPlatform, "thread_fit", lambda self, config, measure=True: fit(self, config, False))
    off_reports, on_reports = [], []
    config = TrialConfig.make(**MICRO)
    off = run_training(config, report=off_reports.append, capture_dir=str(tmp_path))
    on = run_training(config.replace(nan_capture=True), report=on_reports.append, capture_dir=str(tmp_path))
    assert [sorted(r) for r in on_reports] == [sorted(r) for r in off_reports]
    assert on["measured_steps"] == off["measured_steps"]
    # The check reads the gradients and changes nothing: the same losses, bit for bit.
    assert (on["initial_loss"], on["final_loss"]) == (off["initial_loss"], off["final_loss"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("changes, fragments", [
    ({"nan_capture": "yes"}, ["True or False", "got 'yes'"]),
    ({"nan_capture": True, "workers": 2}, ["False when workers > 1", "workers=1"]),
])
def test_bad_nan_capture_values_are_refused(changes, fragments):
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(**changes)
    assert caught.value.field == "nan_capture"
    for fragment in fragments:
        assert fragment in str(caught.value)


@pytest.mark.slow
def test_overhead_measurement_prints_both_throughputs():
    out = io.StringIO()
    summary = measure_overhead(overhead_config("vit-micro", windows=1, window_min_s=0.2), rounds=1, out=out)
    text = out.getvalue()
    assert f"capture off: {summary['off_samples_per_s']:.2f} samples/s" in text
    assert f"capture on:  {summary['on_samples_per_s']:.2f} samples/s" in text
    assert "relative cost:" in text
    assert summary["off_samples_per_s"] > 0 and summary["on_samples_per_s"] > 0
    assert json.loads(text.strip().splitlines()[-1]) == summary


def test_neuron_vit_flag_sets_the_base_config(monkeypatch):
    import accelsweep.sweeps.neuron_vit as neuron_vit

    planned = []
    monkeypatch.setattr(neuron_vit, "run_sweep", planned.append)
    monkeypatch.setattr(sys, "argv", ["neuron_vit.py", "--platform", "cpu", "--smoke", "--nan-capture"])
    neuron_vit.main()
    assert planned[0].base.nan_capture is True


def test_neuron_sweep_with_capture_keeps_one_worker_per_trial():
    """Each gradient of a multi-worker trial is an all-reduce a capture cannot replay,
    so with the capture on the Neuron space does not search workers."""
    from accelsweep import Objective, Sweep, plan_sweep
    from accelsweep.sweeps.neuron_vit import base_config, make_space
    from accelsweep.trainables.metrics import TRAINING_METRICS

    sweep = Sweep(name="nan", trainable=lambda *a, **k: None, objectives=[Objective("throughput_samples_per_s", "max")],
                  metrics=TRAINING_METRICS,
                  base=base_config("neuron", False, 1, "trn1.32xlarge", 0, nan_capture=True),
                  space=make_space("neuron", False, 1, "trn1.32xlarge", nan_capture=True), num_samples=2)
    assert "workers" not in plan_sweep(sweep).space.distributions


NO_XLA = importlib.util.find_spec("torch_xla") is None
XLA_REASON = "torch_xla is not installed here: the XLA lane runs in .venv-xla"
# The XLA tests capture a step of one linear layer on the micro ViT's poisoned images: what
# they check is the capture's path on a lazy device, and each graph of the ViT's step takes
# XLA's CPU compiler seconds (tests/one_layer_workload.py).
XLA_MICRO = {**MICRO, "platform": "xla", "workload": "tests.one_layer_workload:OneLayerImages"}


# batches_per_execution=3 rounds warm-up to steps 1-3, so the poisoned step 6 falls in
# window 1 (steps 4-6): no window has reported, and the capture's report says so.
@pytest.mark.xla
@pytest.mark.skipif(NO_XLA, reason=XLA_REASON)
@pytest.mark.parametrize("batches_per_execution, windows_reported", [(1, 1), (3, 0)])
def test_xla_round_trip_replays_the_window_to_the_first_non_finite_step(batches_per_execution, windows_reported,
                                                                      poisoned_batch, tmp_path, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    config = TrialConfig.make(**XLA_MICRO, batches_per_execution=batches_per_execution, nan_capture=True)
    error, reports = run_until_captured(config, tmp_path)
    capture = check_round_trip(error, reports, tmp_path, windows_reported)
    assert capture["device"].startswith("xla: CPU") and isinstance(capture["rng_state"]["xla"], int)


@pytest.mark.xla
@pytest.mark.skipif(NO_XLA, reason=XLA_REASON)
def test_xla_capture_adds_no_graph_compiles_to_the_windows(tmp_path, monkeypatch):
    """The per-window copy and the flag compile during warm-up, like the step's graphs."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    config = TrialConfig.make(**XLA_MICRO, batches_per_execution=3)
    off = run_training(config, capture_dir=str(tmp_path))
    on = run_training(config.replace(nan_capture=True), capture_dir=str(tmp_path))
    assert sorted(on) == sorted(off)
    assert on["xla_compiles"] == 0 and math.isfinite(on["final_loss"])
    assert list(tmp_path.iterdir()) == []

"""The CUDA knobs of issue 32, checked without a GPU: neuron_vit's CUDA space, the
precisions and compile modes the cuda platform accepts, and the measurement flags.
What they do on a GPU is checked there (env/gpu_checks.py knobs)."""

import argparse

import pytest

from accelsweep.sweeps import neuron_vit
from accelsweep.sweeps.driver.define.measurement_flags import add_measurement_flags, with_measurement_flags
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError


class FirstChoice:
    """An Optuna trial stand-in: each categorical's choices recorded, the index-th taken."""

    def __init__(self, index=0):
        self.index, self.choices = index, {}

    def suggest_categorical(self, name, choices):
        self.choices[name] = list(choices)
        return choices[min(self.index, len(choices) - 1)]


def test_neuron_vit_searches_the_cuda_knobs_on_cuda():
    space = neuron_vit.make_space("cuda", smoke=False, cpus=16)
    fp32 = FirstChoice(0)
    assert space(fp32) == {"attention": "sdpa"}  # forced backends need 16-bit inputs (flash, cuDNN)
    assert fp32.choices["precision"] == ["fp32", "bf16-autocast", "fp16-autocast", "bf16"]
    assert fp32.choices["torch_compile"] == ["none", "inductor", "max-autotune", "reduce-overhead"]
    assert fp32.choices["channels_last"] == [False, True]
    assert fp32.choices["batch_size"] == [16, 32, 64, 128]
    half = FirstChoice(1)
    assert space(half) is None
    assert half.choices["attention"] == ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"]
    # Every point of the space is a valid CUDA config.
    for index in range(5):
        trial = FirstChoice(index)
        fixed = space(trial) or {}
        chosen = {name: choices[min(index, len(choices) - 1)] for name, choices in trial.choices.items()}
        base = neuron_vit.base_config("cuda", False, 1, None, 0)
        base.replace(**chosen, **fixed)
    # The CPU and Neuron spaces are unchanged: no fp16, no CUDA compile modes there.
    cpu = FirstChoice(0)
    neuron_vit.make_space("cpu", smoke=False, cpus=2)(cpu)
    assert cpu.choices["precision"] == ["fp32", "bf16-autocast", "bf16"]
    assert cpu.choices["torch_compile"] == ["none", "inductor"] and "attention" not in cpu.choices


def test_cuda_accepts_its_compile_modes_and_fp16_autocast_and_the_cpu_refuses_them():
    for mode in ("inductor", "max-autotune", "reduce-overhead"):
        assert TrialConfig.make(platform="cuda", torch_compile=mode).torch_compile == mode
    assert TrialConfig.make(platform="cuda", precision="fp16-autocast").precision == "fp16-autocast"
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(platform="cpu", torch_compile="reduce-overhead")
    assert caught.value.field == "torch_compile"
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(platform="cpu", precision="fp16-autocast")
    assert caught.value.field == "precision"


def test_nan_capture_refuses_fp16_autocast():
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(platform="cuda", precision="fp16-autocast", nan_capture=True)
    assert caught.value.field == "nan_capture" and "GradScaler" in str(caught.value)


def test_measurement_flags_replace_only_what_they_name():
    parser = argparse.ArgumentParser()
    add_measurement_flags(parser)
    base = neuron_vit.base_config("cuda", False, 1, None, 0)
    assert with_measurement_flags(base, parser.parse_args([])) == base
    short = with_measurement_flags(base, parser.parse_args(["--window-s", "1", "--windows", "2"]))
    assert (short.window_min_s, short.windows) == (1.0, 2)
    assert (short.warmup_steps, short.window_min_steps) == (base.warmup_steps, base.window_min_steps)
    with pytest.raises(SystemExit):
        parser.parse_args(["--windows", "0"])


def test_the_cuda_platform_starts_cuda_before_the_loop_reads_memory_statistics(monkeypatch):
    """torch 2.11 refuses reset_peak_memory_stats on a process where CUDA has not started
    ("Invalid device argument": every trial of the first sweep on a lent H100)."""
    torch = pytest.importorskip("torch")
    from accelsweep.trainables.platforms.cuda import CudaPlatform

    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: started.append(True))
    assert CudaPlatform().torch_device() == torch.device("cuda", 0) and started == [True]


def test_the_main_jobs_resident_batches_keep_its_loader_out_of_the_space(tmp_path):
    """--resident-batches N: the main job finds each config's ceiling (the ViT-B/16 a lent
    GPU ran loader-bound). Its base keeps N batches on the device, num_workers leaves the
    space (no loader while timed), every proposal is valid; not on an XLA platform."""
    parse = neuron_vit.parser().parse_args
    flags = ["--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--storage-path", str(tmp_path / "ray"),
             "--dry-run"]  # planned for hardware this machine lacks
    for platform in ("cuda", "cpu"):
        sweep = neuron_vit.build_sweep(parse(["--platform", platform, "--resident-batches", "8", *flags]))
        assert sweep.base.resident_batches == 8 and sweep.base.num_workers == 0
        trial = FirstChoice(1)
        fixed = sweep.space(trial) or {}
        assert "num_workers" not in trial.choices and "batch_size" in trial.choices
        sweep.base.replace(**{name: choices[1 % len(choices)] for name, choices in trial.choices.items()}, **fixed)
    assert neuron_vit.build_sweep(parse(["--platform", "cuda", *flags])).base.resident_batches == 0
    from accelsweep import plan_sweep

    plan = plan_sweep(neuron_vit.build_sweep(parse(["--platform", "cpu", "--resident-batches", "8", *flags])))
    said = "8 batches kept on the device and cycled (resident_batches): each config's own ceiling"
    assert any(line.startswith(f"input: {said}") for line in plan.capability_lines())  # its start and --dry-run
    assert plan.capability_tags()["input"].startswith(said)  # the parent run's tag
    assert "input" not in plan_sweep(neuron_vit.build_sweep(parse(["--platform", "cpu", *flags]))).capability_tags()
    with pytest.raises(ConfigError, match="resident_batches must be 0 on platform 'neuron'"):
        neuron_vit.build_sweep(parse(["--platform", "neuron", "--resident-batches", "8", *flags]))
    with pytest.raises(SystemExit):
        parse(["--resident-batches", "-1"])


def test_every_knob_row_a_lent_gpu_runs_is_a_valid_cuda_config():
    """env/gpu_checks.py's rows are checked here, where the time is free, not on a GPU
    machine's few minutes."""
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("gpu_checks", f"{REPO}/env/gpu_checks.py")
    gpu_checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_checks)
    base = neuron_vit.base_config("cuda", False, 1, None, 0)
    names = [name for name, _ in gpu_checks.KNOB_ROWS]
    assert len(set(names)) == len(names) and any("resident" in name for name in names)
    for name, changes in gpu_checks.KNOB_ROWS:
        assert base.replace(**changes).platform == "cuda", name

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

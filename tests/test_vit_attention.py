"""sweeps/vit_attention.py (seed 003, attention in training): what its knob really changes.
The forced SDPA backend is the one that ran (the profiler's op names, eager and compiled),
a backend that cannot run raises instead of falling back, every implementation a CPU
trains with agrees with the hand-written one (outputs and gradients), the default is
timm's own module (existing studies unchanged), what a platform lacks is refused before
any trial with the reason and removed from the study's space, and the study runs as a
smoke sweep that logs to MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accelsweep.sweeps import vit_attention as study
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.workloads.vision_models import ATTENTIONS, build_model
from tests.test_examples import run_smoke
from tests.test_platform_knowledge import assert_study_imports

SCRIPT = Path(study.__file__)
CPU_TRAINS = ("naive", "sdpa", "sdpa-math", "sdpa-flash")
# ATen's op names for SDPA's CPU backends (torch 2.14.1).
MATH_OP = "aten::_scaled_dot_product_attention_math"
CPU_FLASH_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def model_with(attention: str, model: str = "vit-micro") -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights whatever the attention
    return build_model(model, "conv", attention)


def ops_of_a_training_step(model: torch.nn.Module) -> set[str]:
    x, y = images(), torch.tensor([0, 1])
    F.cross_entropy(model(x), y).backward()  # compiles, when compiled, outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        F.cross_entropy(model(x), y).backward()
    return {event.name for event in profile.events()}


def test_the_script_composes_the_public_api_and_its_platform():
    assert_study_imports(SCRIPT)


def test_the_study_has_a_row_for_every_attention_the_workload_has():
    assert sorted(study.ATTENTIONS) == sorted(ATTENTIONS)
    assert study.__doc__.splitlines()[0].startswith("Seed 003's attention post")
    assert "hand-written (baseline)     attention=naive                            370       242" in study.__doc__


def test_the_default_is_timms_own_attention_module():
    from timm.layers import Attention

    assert TrialConfig.make(model="vit-micro").workload_knobs.attention == "sdpa"
    attention = [m for m in build_model("vit-micro").modules() if isinstance(m, Attention)]
    assert attention and all(type(m) is Attention and m.fused_attn for m in attention)
    swapped = [m for m in model_with("naive").modules() if isinstance(m, Attention)]
    assert swapped and all(type(m) is not Attention for m in swapped)


@pytest.mark.parametrize("attention", ("sdpa-math", "sdpa-flash", "naive", "sdpa"))
def test_the_forced_backend_is_the_one_that_ran(attention):
    ops = ops_of_a_training_step(model_with(attention))
    ran_math, ran_flash = MATH_OP in ops, all(op in ops for op in CPU_FLASH_OPS)
    ran_any_sdpa = any("scaled_dot_product" in op for op in ops)
    if attention == "sdpa-math":
        assert ran_math and not any(op in ops for op in CPU_FLASH_OPS)
    elif attention == "sdpa-flash":  # forward and backward both the CPU flash kernel
        assert ran_flash and not ran_math
    elif attention == "naive":
        assert not ran_any_sdpa and "aten::softmax" in ops
    else:  # the dispatcher's choice: some SDPA backend, which one is its business
        assert ran_any_sdpa and "aten::softmax" not in ops


@pytest.mark.slow
@pytest.mark.parametrize("attention", ("sdpa-math", "sdpa-flash"))
def test_the_knob_reaches_the_model_the_training_loop_trains(attention):
    from accelsweep.trainables.loop.train_loop import run_training

    from accelsweep.trainables.flop_count import count_model_flops
    from accelsweep.trainables.workloads.base import load_workload

    config = TrialConfig.make(model="vit-micro", attention=attention, batch_size=4, warmup_steps=1,
                              window_min_steps=1, window_min_s=0.0, windows=1)
    # The loop counts the model's FLOPs once, on the meta device, where SDPA takes its math
    # path: counted before the profiler starts, the profile holds the trained model's ops only.
    count_model_flops(load_workload(config.workload), config)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run_training(config)
    ops = {event.name for event in profile.events()}
    assert (MATH_OP in ops) == (attention == "sdpa-math")
    assert all(op in ops for op in CPU_FLASH_OPS) == (attention == "sdpa-flash")


@pytest.mark.slow
def test_compiling_keeps_the_forced_backend():
    # Inductor keeps the CPU flash kernel as a call; the math backend is a decomposition
    # it fuses (no SDPA op left), never the flash kernel.
    flash = ops_of_a_training_step(torch.compile(model_with("sdpa-flash")))
    assert all(op in flash for op in CPU_FLASH_OPS)
    math = ops_of_a_training_step(torch.compile(model_with("sdpa-math")))
    assert not any(op in math for op in CPU_FLASH_OPS)


@pytest.mark.parametrize("attention", ("sdpa-efficient", "sdpa-cudnn"))
def test_a_backend_that_cannot_run_raises_instead_of_falling_back(attention):
    model = model_with(attention)  # built past the config's check, which refuses it on a CPU
    with pytest.raises(RuntimeError, match="No viable backend"):
        model(images())


def test_flex_cannot_train_on_a_cpu_which_is_why_it_is_refused_there():
    from accelsweep.kernels.registry import get_op

    flex = get_op("attention").impl("flex").load()
    q = torch.randn(1, 2, 16, 32, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex(q, q, q)
    with pytest.raises(ConfigError, match="no backward pass on a CPU"):
        TrialConfig.make(platform="cpu", model="vit-micro", attention="flex")


@pytest.mark.parametrize("precision", ("fp32", "bf16-autocast"))
def test_every_attention_a_cpu_trains_with_agrees_with_the_hand_written_one(precision):
    x, y = images(4), torch.tensor([0, 1, 2, 3])
    tolerance = 1e-5 if precision == "fp32" else 3e-2
    results = {}
    for attention in CPU_TRAINS:
        model = model_with(attention)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
            out = model(x)
        F.cross_entropy(out.float(), y).backward()
        results[attention] = out.detach().float(), {n: p.grad for n, p in model.named_parameters()}
    out, grads = results["naive"]
    for attention in CPU_TRAINS[1:]:
        other_out, other_grads = results[attention]
        assert (other_out - out).abs().max() <= tolerance * out.abs().max(), attention
        for name, grad in grads.items():
            scale = grad.abs().max() + 1e-12
            assert (other_grads[name] - grad).abs().max() <= tolerance * scale, f"{attention}: {name}"
    # The comparison can fail: a different attention (no softmax scale) is far off.
    model = model_with("naive")
    for module in model.modules():
        if hasattr(module, "attend") and module.attend is not None:
            module.attend = lambda q, k, v: (q @ k.transpose(-2, -1)).softmax(-1) @ v
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
        assert (model(x).detach().float() - out).abs().max() > tolerance * out.abs().max()


def test_what_a_platform_lacks_is_refused_before_any_trial_with_the_reason():
    with pytest.raises(ConfigError, match=r"attention must be one of sdpa, naive, sdpa-math, sdpa-flash on "
                                          r"platform cpu .*got 'sdpa-cudnn'\. sdpa-cudnn runs on cuda only"):
        TrialConfig.make(platform="cpu", model="vit-micro", attention="sdpa-cudnn")
    # CUDA's flash, cuDNN, flash-attn and Transformer Engine kernels take 16-bit inputs only.
    for attention in ("sdpa-flash", "sdpa-cudnn", "flash-attn", "transformer-engine"):
        with pytest.raises(ConfigError, match="bfloat16") as refused:
            TrialConfig.make(platform="cuda", model="vit-micro", precision="fp32", attention=attention)
        assert refused.value.field == "attention"
    for attention in ATTENTIONS:  # the seed's setting: all of them
        TrialConfig.make(platform="cuda", model="vit-micro", precision="bf16-autocast", attention=attention)
    with pytest.raises(ConfigError, match="one of sdpa, naive on platform neuron"):
        TrialConfig.make(platform="neuron", model="vit-micro", attention="sdpa-math")
    with pytest.raises(ConfigError, match="has no attention"):
        TrialConfig.make(model="resnet50", attention="naive")


def test_the_space_keeps_what_the_platform_trains_and_says_why_for_the_rest():
    cpu = study.base_config("cpu", "vit-micro", 8, smoke=False, cpus=2, seed=0)
    attentions, compiles, removed = study.space_axes(cpu, smoke=False, check_installed=True)
    assert attentions == ["naive", "sdpa", "sdpa-flash", "sdpa-math"] and compiles == ["none", "inductor"]
    assert set(removed) == {f"attention={a}" for a in ATTENTIONS if a not in attentions}
    assert "no backward pass on a CPU" in removed["attention=flex"]
    assert study.space_axes(cpu, smoke=True, check_installed=False)[1] == ["none"]

    cuda = study.base_config("cuda", "vit-micro", 8, smoke=False, cpus=2, seed=0)
    attentions, compiles, removed = study.space_axes(cuda, smoke=False, check_installed=False)
    assert sorted(attentions) == sorted(ATTENTIONS) and compiles == ["none", "inductor"] and not removed
    # Checked as installed, a missing stack is removed with what to install.
    attentions, _, removed = study.space_axes(cuda, smoke=False, check_installed=True)
    for name, module in (("flash-attn", "flash_attn"), ("xformers", "xformers"),
                         ("transformer-engine", "transformer_engine")):
        try:
            __import__(module)
        except ImportError:
            assert name not in attentions and "pip install" in removed[f"attention={name}"]

    neuron = study.base_config("neuron", "vit-micro", 8, smoke=False, cpus=2, seed=0)
    attentions, compiles, _ = study.space_axes(neuron, smoke=False, check_installed=False)
    assert attentions == ["naive", "sdpa"] and compiles == ["none"]


def run_script(*args: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_dry_run_shows_the_space_for_cpu_and_cuda(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cpu = run_script("--dry-run", "--platform", "cpu", "--tracking-uri", uri, cwd=tmp_path)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    assert "attention: one of 'naive', 'sdpa', 'sdpa-flash', 'sdpa-math'" in cpu.stdout
    assert "torch_compile: one of 'none', 'inductor'" in cpu.stdout
    assert "removed from the space: attention=flex: " in cpu.stdout
    cuda = run_script("--dry-run", "--platform", "cuda", "--tracking-uri", uri, cwd=tmp_path)
    assert cuda.returncode == 0, cuda.stderr[-3000:]
    assert "'flash-attn', 'transformer-engine', 'xformers', 'flex'" in cuda.stdout
    assert "vit-attn-196, batch 128, bf16-autocast" in cuda.stdout
    assert "not checked whether installed: flash-attn, transformer-engine, xformers" in cuda.stdout


@pytest.mark.slow
def test_the_smoke_study_runs_and_logs_every_attention_to_mlflow(tmp_path, shared_ray):
    from mlflow.tracking import MlflowClient

    run, uri = run_smoke(SCRIPT, tmp_path, *shared_ray.flags)
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == "vit_attention"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED"
    assert all(t.info.status == "FINISHED" and t.data.metrics["step_time_p50_s"] > 0 for t in trials)
    assert sorted(t.data.params["attention"] for t in trials) == sorted(CPU_TRAINS)

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import PLATFORM_NAMES, PLATFORMS, get_platform, resolve_platform
from accelsweep.trainables.platforms.cuda import NVIDIA_DRIVER_FILES
from accelsweep.trainables.platforms.neuron import neuron_cc_flags, neuron_target_for_instance


def test_auto_picks_cpu_here_and_says_why():
    platform, why = resolve_platform("auto")
    assert platform.name == "cpu"
    assert "picked cpu" in why and "no neuron" in why and "no cuda" in why


@pytest.mark.skipif(any(os.path.exists(path) for path in NVIDIA_DRIVER_FILES), reason="an NVIDIA driver is here")
def test_auto_on_a_host_without_an_nvidia_driver_never_imports_torch():
    """A sweep's driver picks its platform before anything else; torch is seconds of CPU it
    would pay only to hear there is no GPU."""
    probe = ("import sys; from accelsweep.trainables.platforms import resolve_platform; "
             "platform, why = resolve_platform('auto'); print(platform.name, 'torch' in sys.modules); print(why)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "cpu False"
    assert "no cuda: no NVIDIA driver on this machine (none of /dev/nvidiactl" in done.stdout


def test_a_host_with_nvidia_driver_files_asks_torch(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    from accelsweep.trainables.platforms import cuda

    monkeypatch.setattr(cuda, "NVIDIA_DRIVER_FILES", (str(tmp_path),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda.CudaPlatform().detect().reason == "torch.cuda.is_available() is False (no NVIDIA GPU or driver)"


def test_asking_for_absent_hardware_is_refused_before_any_trial():
    with pytest.raises(ConfigError, match="platform must be a platform present.*'neuron'.*torch_neuronx"):
        resolve_platform("neuron")


def test_unknown_platform_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="cpu, cuda, xla, neuron.*'gpu'"):
        get_platform("gpu")


@pytest.mark.parametrize("instance, target", [("trn1.2xlarge", "trn1"), ("trn1n.32xlarge", "trn1n"),
                                              ("inf2.xlarge", "inf2"), ("c7i.2xlarge", None), (None, None)])
def test_neuron_target_from_instance_type(instance, target):
    assert neuron_target_for_instance(instance) == target


def test_neuron_flags_seed_000_compiler_experiment():
    config = TrialConfig.make(platform="neuron", neuron_target="inf2", neuron_model_type="transformer",
                              neuron_optlevel=3)
    assert neuron_cc_flags(config) == "--target=inf2 --model-type=transformer --optlevel=3"


def test_neuron_flags_fp8_and_autocast_modes():
    fp8 = TrialConfig.make(platform="neuron", neuron_auto_cast="all", neuron_auto_cast_type="fp8_e4m3")
    assert neuron_cc_flags(fp8) == "--auto-cast=all --auto-cast-type=fp8_e4m3"
    # torch.autocast does the casting: the compiler is told not to cast again.
    amp = TrialConfig.make(platform="neuron", precision="bf16-autocast")
    assert neuron_cc_flags(amp) == "--auto-cast=none"


def test_neuron_environment_and_resources():
    neuron = get_platform("neuron")
    full_bf16 = TrialConfig.make(platform="neuron", precision="bf16")
    assert neuron.trial_env(full_bf16)["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1"
    assert neuron.trial_env(TrialConfig.make(platform="neuron"))["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0"
    assert neuron.resources(TrialConfig.make(platform="neuron", cpus_per_worker=2)) == {"CPU": 2, "neuron_cores": 1}
    assert "XLA_USE_BF16" not in neuron.trial_env(full_bf16)  # deprecated since torch-neuronx 2.5


def test_tpu_trials_hold_a_tpu_chip_and_use_its_pjrt_client():
    tpu = get_platform("tpu")
    assert not tpu.detect().available and "no TPU chips" in tpu.detect().reason
    assert tpu.resources(TrialConfig.make(platform="tpu", cpus_per_worker=4)) == {"CPU": 4, "TPU": 1}
    assert tpu.trial_env(TrialConfig.make(platform="tpu"))["PJRT_DEVICE"] == "TPU"
    with pytest.raises(ConfigError, match="workers must be 1 on platform 'tpu'; got 2"):
        tpu.validate(TrialConfig.make(platform="tpu", workers=2))


def test_cuda_resources_carry_accelerator_type():
    cuda = get_platform("cuda")
    assert cuda.resources(TrialConfig.make(platform="cuda", accelerator_type="H100")) == {
        "CPU": 1, "GPU": 1, "accelerator_type:H100": 0.001}


@pytest.mark.slow
@pytest.mark.parametrize("platform", ("auto",) + PLATFORM_NAMES)
def test_dry_run_works_for_every_platform(platform):
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", platform,
                           "--instance-type", "trn1.2xlarge"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "search space:" in out and "resources per trial:" in out and "trial environment:" in out
    if platform == "neuron":
        assert "NEURON_CC_FLAGS" in out and "--target=trn1" in out and "'neuron_cores': 1" in out


def test_a_pinned_instance_type_becomes_a_marker_resource_on_every_worker():
    neuron = get_platform("neuron")
    pinned = TrialConfig.make(platform="neuron", instance_type="inf2.xlarge", workers=2)
    assert neuron.worker_resources(pinned) == {"CPU": 1, "neuron_cores": 1, "instance_type:inf2.xlarge": 0.0001}
    assert neuron.resources(pinned)["neuron_cores"] == 2  # both workers' cores, for the cost share
    assert get_platform("cpu").worker_resources(TrialConfig.make(instance_type="c7i.2xlarge")) == {
        "CPU": 1, "instance_type:c7i.2xlarge": 0.0001}


def test_instance_types_that_cannot_hold_the_trial_are_refused():
    with pytest.raises(ConfigError, match="instance_type must be an EC2 instance type such as trn1.2xlarge, or None; "
                                          "got 'trn1_2xlarge'"):
        TrialConfig.make(instance_type="trn1_2xlarge")
    with pytest.raises(ConfigError, match="instance_type must be a Neuron instance type .*; got 'g5.2xlarge'"):
        TrialConfig.make(platform="neuron", instance_type="g5.2xlarge")
    with pytest.raises(ConfigError, match="neuron_target must be 'inf2' .or unset. on inf2.xlarge; got 'trn1'"):
        TrialConfig.make(platform="neuron", instance_type="inf2.xlarge", neuron_target="trn1")


@pytest.mark.slow
def test_a_neuron_sweep_on_a_cluster_needs_its_instance_type():
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", "neuron",
                           "--address", "10.0.0.1:6379"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--instance-type must be the Neuron node type to sweep on the cluster (one of " in done.stderr
    assert "trn1.2xlarge" in done.stderr and "got None" in done.stderr


@pytest.mark.slow
def test_on_a_cluster_trials_ask_for_the_named_node_type():
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", "neuron",
                           "--address", "10.0.0.1:6379", "--instance-type", "inf2.xlarge"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'instance_type:inf2.xlarge': 0.0001" in done.stdout and "--target=inf2" in done.stdout


def test_each_precision_is_said_once_and_every_platform_lists_only_known_ones():
    import torch

    from accelsweep.trainables.precision import PRECISIONS, get_precision

    fp32, amp, bf16 = get_precision("fp32"), get_precision("bf16-autocast"), get_precision("bf16")
    assert (fp32.parameter_dtype, fp32.input_dtype, fp32.autocasts) == (torch.float32, torch.float32, False)
    assert (amp.parameter_dtype, amp.input_dtype, amp.autocast) == (torch.float32, torch.float32, "bfloat16")
    assert (bf16.parameter_dtype, bf16.input_dtype, bf16.autocasts) == (torch.bfloat16, torch.bfloat16, False)
    fp16 = get_precision("fp16-autocast")
    assert (fp16.parameter_dtype, fp16.autocast, fp16.scales_loss) == (torch.float32, "float16", True)
    assert not (fp32.scales_loss or amp.scales_loss or bf16.scales_loss)
    for platform in PLATFORMS.values():
        assert set(platform.precisions) <= set(PRECISIONS), platform.name
    with pytest.raises(ConfigError, match="precision must be one of fp32, bf16-autocast, bf16, fp16-autocast; got 'fp16'"):
        get_precision("fp16")


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # cuda's context, built on a CPU
@pytest.mark.parametrize("precision, autocast_dtype", [("fp32", None), ("bf16-autocast", "bfloat16"), ("bf16", None)])
def test_a_platforms_autocast_is_what_the_precision_says(precision, autocast_dtype):
    import torch

    for name, device_type in (("cpu", "cpu"), ("cuda", "cuda"), ("xla", "xla"), ("neuron", "xla")):
        context = get_platform(name).autocast(TrialConfig.make(platform=name, precision=precision))
        if autocast_dtype is None:
            assert not isinstance(context, torch.autocast), name
        else:
            assert isinstance(context, torch.autocast) and context.device == device_type, name
            assert context.fast_dtype == getattr(torch, autocast_dtype)


def test_platforms_apply_their_own_knobs():
    import torch

    cpu, cuda, xla, neuron = (get_platform(name) for name in ("cpu", "cuda", "xla", "neuron"))
    assert cpu.memory_format(TrialConfig.make(channels_last=True)) == torch.channels_last
    assert cpu.memory_format(TrialConfig.make()) == torch.contiguous_format
    assert cuda.memory_format(TrialConfig.make(platform="cuda", channels_last=True)) == torch.channels_last
    assert xla.memory_format(TrialConfig.make(platform="xla")) == torch.contiguous_format
    assert cpu.threads(TrialConfig.make(cpus_per_worker=2)) == 2
    assert cpu.threads(TrialConfig.make(cpus_per_worker=2, threads=1)) == 1
    assert cpu.steps_per_execution(TrialConfig.make()) == 1
    assert xla.steps_per_execution(TrialConfig.make(platform="xla", batches_per_execution=4)) == 4
    assert neuron.steps_per_execution(TrialConfig.make(platform="neuron", batches_per_execution=10)) == 10
    cached = TrialConfig.make(platform="xla", compile_cache="/shared/xla")
    # Under the named root, one directory per torch-xla build (trainables/compile_cache.py).
    assert xla.trial_env(cached)["XLA_PERSISTENT_CACHE_PATH"].startswith("/shared/xla/xla_torch-")

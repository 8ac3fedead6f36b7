"""What each platform's hardware does natively, and the values it only emulates leaving the
search space before a sweep (the baseline's own stay; --keep-emulated keeps them all).

Why: on a 2-core AVX2 AMD EPYC (no avx512_bf16, no amx_bf16) the main job spent most of its
budget on bf16 trials stepping 10-25x slower than fp32; on an AMD EPYC with avx512_bf16,
bf16 was the faster. So the rule is read from the hardware: here from fake /proc/cpuinfo
texts, tables per compute capability and per Neuron target."""

from __future__ import annotations

import pickle
import subprocess
from dataclasses import dataclass
from types import SimpleNamespace

import cloudpickle
import optuna
import pytest
from ray import tune

from accelsweep import Objective, Sweep, SweepConfig, declare_metrics, plan_sweep
from accelsweep.sweeps.driver.run.lifecycle import _searcher
from accelsweep.sweeps.driver.define.cli import common_parser, sweep_options
from accelsweep.sweeps.driver.define.space import SearchSpace
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import Metric, MetricSet
from accelsweep.trainables.platforms import PLATFORM_NAMES, get_platform
from accelsweep.trainables.platforms import cuda
from accelsweep.trainables.platforms.capabilities import BF16_PRECISIONS, Capabilities
from accelsweep.trainables.platforms.cpu import CpuPlatform, cpu_capabilities
from accelsweep.trainables.platforms.neuron import NEURON_AUTO_CAST_TYPES, NEURON_TARGETS, neuron_capabilities
from accelsweep.trainables.platforms.xla import xla_cpu_capabilities

# An AVX2 AMD EPYC (the main job's machine: no bf16 units), a Zen 4 one with AVX512-BF16,
# a Sapphire Rapids Xeon with AMX, and a Graviton2 (Arm, no BF16 extension).
ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx fma avx2\n"
ZEN4 = "model name\t: AMD EPYC 9R14\nflags\t\t: avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
SPR = ("model name\t: Intel Xeon Platinum 8488C\n"
       "flags\t\t: avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n")
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"
NO_BF16 = {"bf16", "bf16-autocast"}


# ---- CPU ----------------------------------------------------------------------------------------------
def test_a_cpu_without_bf16_units_only_emulates_the_bf16_precisions():
    capabilities = cpu_capabilities(ZEN3, cores=2, numa_node_count=1)
    assert set(capabilities.emulated) == {"precision"} and set(capabilities.emulated["precision"]) == NO_BF16
    reason = capabilities.emulated["precision"]["bf16"]
    assert reason == "no native bf16 on this CPU (AMD EPYC 7B13): neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo"
    assert capabilities.facts["bf16_native"] is False and capabilities.facts["avx2"] is True
    assert capabilities.facts["avx512f"] is False and capabilities.facts["cores"] == 2
    assert capabilities.facts["numa_nodes"] == 1
    assert capabilities.known and capabilities.source == "/proc/cpuinfo of this machine"
    assert capabilities.hardware.startswith("AMD EPYC 7B13, 2 cores, 1 NUMA node(s)")


@pytest.mark.parametrize("cpuinfo, flags", [(ZEN4, ["avx512f", "avx512_bf16"]),
                                            (SPR, ["avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"])])
def test_a_cpu_with_avx512_bf16_or_amx_runs_bf16_natively(cpuinfo, flags):
    capabilities = cpu_capabilities(cpuinfo, cores=8, numa_node_count=2)
    assert capabilities.emulated == {} and capabilities.facts["bf16_native"] is True
    assert all(capabilities.facts[flag] is True for flag in flags)
    assert capabilities.facts["numa_nodes"] == 2


@pytest.mark.parametrize("cap, emulated", [("AVX2", True), ("avx512_core", True), ("AVX512_CORE_BF16", False),
                                            ("AVX512_CORE_AMX", False), ("ALL", False)])
def test_onednn_capped_below_its_bf16_instructions_emulates_bf16_on_any_cpu(cap, emulated):
    capabilities = cpu_capabilities(ZEN4, cores=2, numa_node_count=1, onednn_max_isa=cap)
    assert set(capabilities.emulated.get("precision", {})) == (NO_BF16 if emulated else set())
    assert capabilities.facts["onednn_max_cpu_isa"] == cap and f"oneDNN capped at {cap}" in capabilities.hardware
    if emulated:
        assert f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below" in capabilities.emulated["precision"]["bf16"]


def test_the_cpu_platform_reads_the_onednn_cap_from_the_environment(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert set(get_platform("cpu").capabilities(TrialConfig.make()).emulated["precision"]) == NO_BF16


def test_an_arm_cpu_without_the_bf16_extension_says_so():
    reason = cpu_capabilities(GRAVITON2, cores=4, numa_node_count=1).emulated["precision"]["bf16-autocast"]
    assert reason == "no native bf16 on this CPU: no bf16 in /proc/cpuinfo's Features"
    assert cpu_capabilities(GRAVITON2 + "Features\t: asimd bf16\n", 4, 1).emulated == {}


def test_the_cpu_platform_reads_this_machine():
    capabilities = get_platform("cpu").capabilities(TrialConfig.make())
    assert capabilities.known and capabilities.source == "/proc/cpuinfo of this machine"
    assert capabilities.facts["cores"] >= 1 and capabilities.facts["numa_nodes"] >= 1
    assert set(capabilities.emulated.get("precision", {})) in (set(), NO_BF16)
    assert BF16_PRECISIONS == ("bf16-autocast", "bf16")


# ---- XLA on the CPU -----------------------------------------------------------------------------------
def test_xla_on_a_cpu_without_bf16_emulates_it_and_says_xla_upcasts():
    emulated = xla_cpu_capabilities(cpu_capabilities(ZEN3, 2, 1)).emulated["precision"]
    assert set(emulated) == NO_BF16 and "upcasts bf16 ops to f32" in emulated["bf16"]
    assert "neither avx512_bf16 nor amx_bf16" in emulated["bf16"]
    with_units = xla_cpu_capabilities(cpu_capabilities(ZEN4, 2, 1))
    assert with_units.emulated == {} and "cpu_compiler.cc" in with_units.source


def test_xla_on_another_pjrt_device_is_not_known(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "GPU")
    capabilities = get_platform("xla").capabilities(TrialConfig.make(platform="xla"))
    assert not capabilities.known and capabilities.emulated == {}


# ---- CUDA ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sm, bf16, fp8, missing_attention", [
    ((7, 0), False, False, {"sdpa-flash", "sdpa-cudnn", "flash-attn"}),  # V100
    ((7, 5), False, False, {"sdpa-flash", "sdpa-cudnn", "flash-attn"}),  # T4
    ((8, 0), True, False, set()),  # A100
    ((8, 6), True, False, set()),  # A10
    ((8, 9), True, True, set()),  # L4
    ((9, 0), True, True, set()),  # H100
])
def test_the_cuda_table_by_compute_capability(sm, bf16, fp8, missing_attention):
    capabilities = cuda.cuda_capabilities(sm, "GPU", "test")
    assert capabilities.facts["bf16_native"] is bf16 and capabilities.facts["tf32"] is bf16
    assert capabilities.facts["fp8"] is fp8 and capabilities.facts["sdpa_efficient"] is True
    assert set(capabilities.emulated.get("precision", {})) == (set() if bf16 else NO_BF16)
    assert set(capabilities.emulated.get("attention", {})) == missing_attention
    if missing_attention:
        assert capabilities.emulated["attention"]["sdpa-flash"] == (
            f"SDPA's flash backend needs compute capability 8.0 or newer; GPU has {sm[0]}.{sm[1]}")


def test_cuda_reads_a_pinned_gpu_model_from_the_table_else_the_gpu_here(monkeypatch):
    platform = get_platform("cuda")
    t4 = platform.capabilities(TrialConfig.make(platform="cuda", accelerator_type="T4"))
    assert t4.source == "the table for accelerator type T4 (NVIDIA's compute capability list)"
    assert set(t4.emulated["precision"]) == NO_BF16
    unknown = platform.capabilities(TrialConfig.make(platform="cuda", accelerator_type="A10G"))
    assert not unknown.known and unknown.emulated == {}
    assert "'A10G' is not in the compute capability table" in unknown.source
    monkeypatch.setattr(cuda, "local_gpu", lambda: ((9, 0), "NVIDIA H100 80GB HBM3"))
    here = platform.capabilities(SweepConfig(platform="cuda"))  # a user's config: no knobs
    assert here.source == "GPU 0 on this machine (compute capability 9.0)" and here.emulated == {}
    monkeypatch.setattr(cuda, "local_gpu", lambda: "no GPU visible to torch and no nvidia-smi on this machine")
    assert platform.capabilities(SweepConfig(platform="cuda")).source.startswith("not known: no GPU visible")


def test_nvidia_smi_is_asked_when_torch_sees_no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    calls = []

    def fake_run(command, **options):
        calls.append(command)
        return SimpleNamespace(stdout="8.6, NVIDIA A10G\n8.6, NVIDIA A10G\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert cuda.local_gpu() == ((8, 6), "NVIDIA A10G")
    assert calls == [["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"]]
    monkeypatch.setattr(cuda.shutil, "which", lambda name: None)
    assert cuda.local_gpu() == "no GPU visible to torch and no nvidia-smi on this machine"


# ---- Neuron, TPU, and configs without the training fields --------------------------------------------
@pytest.mark.parametrize("target", NEURON_TARGETS)
def test_every_neuron_target_runs_each_auto_cast_type_natively(target):
    capabilities = neuron_capabilities(target)
    assert capabilities.emulated == {} and capabilities.known
    assert all(capabilities.facts[f"{dtype}_native"] for dtype in NEURON_AUTO_CAST_TYPES)
    core = "NeuronCore-v3" if target == "trn2" else "NeuronCore-v2"
    assert capabilities.hardware == f"Neuron target {target} ({core})"
    assert capabilities.source == f"the table for Neuron target {target} (no NeuronCore here to probe)"


def test_neuron_reads_its_target_from_the_config():
    neuron = get_platform("neuron")
    by_instance = neuron.capabilities(TrialConfig.make(platform="neuron", instance_type="trn1.2xlarge"))
    assert by_instance.facts["target"] == "trn1"
    assert neuron.capabilities(TrialConfig.make(platform="neuron", neuron_target="inf2")).facts["target"] == "inf2"
    unknown = neuron.capabilities(TrialConfig.make(platform="neuron"))
    assert not unknown.known and "names no Neuron target" in unknown.source


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_every_platform_answers_for_a_config_without_training_fields(name, monkeypatch):
    monkeypatch.setattr(cuda, "local_gpu", lambda: "no GPU here (test)")
    capabilities = get_platform(name).capabilities(SimpleNamespace(platform=name))  # a kernel config's kind
    assert isinstance(capabilities, Capabilities) and capabilities.hardware and capabilities.source


# ---- the search space without them --------------------------------------------------------------------
EMULATED = {"precision": {"bf16": "no bf16 units", "bf16-autocast": "no bf16 units"},
            "attention": {"sdpa-flash": "no flash backend"}}  # not a knob of these spaces


def precision_space(trial):
    trial.suggest_categorical("batch_size", [8, 16])
    if trial.suggest_categorical("precision", ["fp32", "bf16-autocast", "bf16"]) != "fp32":
        trial.suggest_categorical("channels_last", [False, True])


def proposed(define_by_run, count=300):
    with_sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    values = set()
    for _ in range(count):
        trial = with_sampler.ask()
        define_by_run(trial)
        values.add(trial.params["precision"])
    return values


@pytest.mark.parametrize("spec", [precision_space, {"batch_size": tune.choice([8, 16]),
                                                    "precision": tune.choice(["fp32", "bf16-autocast", "bf16"])}])
def test_emulated_values_are_never_proposed(spec):
    space = SearchSpace(spec, remove=EMULATED, keep={"precision": "fp32"})
    assert space.removed == {"precision": EMULATED["precision"]} and space.kept == {}
    assert space.distributions["precision"].choices == ("fp32",)
    assert proposed(space.define_by_run) == {"fp32"}
    assert {p["precision"] for p in space.sample(200, seed=3)} == {"fp32"}


def test_the_baselines_value_stays_in_the_space():
    space = SearchSpace(precision_space, remove=EMULATED, keep={"precision": "bf16"})
    assert space.removed == {"precision": {"bf16-autocast": "no bf16 units"}}
    assert space.kept == {"precision": {"bf16": "no bf16 units"}}
    assert proposed(space.define_by_run) == {"fp32", "bf16"}
    assert space.point_for({"batch_size": 8, "precision": "bf16", "channels_last": False})["precision"] == "bf16"


def test_a_knob_whose_every_choice_is_emulated_is_refused_with_the_way_to_keep_them():
    def bf16_only(trial):
        trial.suggest_categorical("precision", ["bf16-autocast", "bf16"])

    with pytest.raises(ConfigError, match=r"search space knob precision must be at least one choice this hardware "
                                          r"runs natively; got \['bf16-autocast', 'bf16'\].*no bf16 units.*"
                                          r"--keep-emulated \(Sweep\(keep_emulated=True\)\)"):
        SearchSpace(bf16_only, remove=EMULATED, keep={"precision": "fp32"})


def test_a_pruned_space_still_pickles_and_still_prunes():
    """Tune pickles the searcher, and with it the define-by-run function."""
    choices = ["fp32", "bf16"]

    def closure(trial):
        trial.suggest_categorical("precision", choices)

    space = SearchSpace(closure, remove=EMULATED, keep={"precision": "fp32"})
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        restored = loads(dumps(space.define_by_run))
        assert proposed(restored, count=100) == {"fp32"}


# ---- a sweep: plan, --dry-run, MLflow tags, --keep-emulated ------------------------------------------
@dataclass(frozen=True)
class PrecisionConfig(SweepConfig):
    precision: str = "fp32"
    batch_size: int = 8


@declare_metrics(MetricSet(metrics=(Metric("score", "points", "max", progress="score {:.1f}"),), headline=("score",)))
def score_trainable(searched, base, cost=None):
    pass


def precision_sweep(base=PrecisionConfig(), **options):
    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast", "bf16"])

    return Sweep(name="caps", trainable=score_trainable, base=base, space=space,
                 objectives=[Objective("score", "max")], **options)


@pytest.fixture
def avx2_epyc(monkeypatch):
    """This machine, as the main job's 2-core AVX2 AMD EPYC."""
    monkeypatch.setattr(CpuPlatform, "capabilities", lambda self, config: cpu_capabilities(ZEN3, 2, 1))


def test_the_plan_says_which_values_left_the_space_and_why(avx2_epyc):
    plan = plan_sweep(precision_sweep())
    text = plan.describe()
    assert "hardware: AMD EPYC 7B13, 2 cores, 1 NUMA node(s); avx2 (read from /proc/cpuinfo of this machine)" in text
    assert ("removed from the space (only emulated here; --keep-emulated keeps them): precision bf16-autocast, bf16 "
            "(no native bf16 on this CPU (AMD EPYC 7B13): neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo)") in text
    assert "precision: one of 'fp32'" in text
    tags = plan.capability_tags()
    assert tags["removed_values"] == "precision=bf16-autocast, precision=bf16"
    assert tags["removed.precision"].startswith("bf16-autocast, bf16 (no native bf16 on this CPU (AMD EPYC 7B13)")
    assert tags["capability_source"] == "/proc/cpuinfo of this machine" and "AMD EPYC 7B13" in tags["hardware"]
    grid = plan_sweep(precision_sweep(sampler="grid", scheduler="none"))
    assert _searcher(grid)._sampler._search_space["precision"] == ["fp32"]


def test_the_baselines_emulated_value_is_kept_and_said_so(avx2_epyc):
    text = plan_sweep(precision_sweep(base=PrecisionConfig(precision="bf16"))).describe()
    assert "precision: one of 'fp32', 'bf16'" in text
    assert "kept in the space: precision bf16 (no native bf16 on this CPU" in text
    assert "; kept: the baseline's value)" in text


def test_keep_emulated_keeps_every_value_and_says_so(avx2_epyc):
    plan = plan_sweep(precision_sweep(**sweep_options(common_parser("t", 4).parse_args(["--keep-emulated"]),
                                                      default_samples=4)))
    text = plan.describe()
    assert plan.sweep.keep_emulated and "precision: one of 'fp32', 'bf16-autocast', 'bf16'" in text
    assert "removed from the space" not in text and "; kept, as asked)" in text
    assert plan.capability_tags()["removed_values"] == "none"
    assert sweep_options(common_parser("t", 4).parse_args([]), default_samples=4)["keep_emulated"] is False


@pytest.mark.parametrize("address, pruned", [("127.0.0.1:6379", True), ("localhost:6379", True),
                                              ("10.0.0.5:6379", False)])
def test_a_cluster_on_loopback_is_this_machine_one_elsewhere_is_not_known(avx2_epyc, address, pruned):
    """A cluster on loopback (`accelsweep cluster up`, a `ray start` here) runs its trials on
    this CPU: what it emulates leaves the space as for a local run. Another host's cluster
    may have other hardware: nothing is removed."""
    text = plan_sweep(precision_sweep(address=address)).describe()
    assert ("precision: one of 'fp32'\n" in text) is pruned, text
    assert ("whose nodes may have other hardware" in text) is not pruned, text


def test_nothing_is_removed_where_the_hardware_is_not_known(monkeypatch):
    monkeypatch.setattr(cuda, "local_gpu", lambda: "no GPU visible to torch and no nvidia-smi on this machine")
    text = plan_sweep(precision_sweep(base=PrecisionConfig(platform="cuda"))).describe()
    assert "hardware: NVIDIA GPU (not known: no GPU visible to torch and no nvidia-smi on this machine)" in text
    assert "removed from the space: nothing (what this hardware emulates is not known)" in text
    assert "precision: one of 'fp32', 'bf16-autocast', 'bf16'" in text

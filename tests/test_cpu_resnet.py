"""sweeps/cpu_resnet.py (seed 003's CPU post): what each knob really changes in the trial
process, and the whole study run as CI runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import optuna
import pytest

from accelsweep.sweeps import cpu_resnet
from accelsweep.sweeps.cpu_resnet import make_space, spot_basis
from accelsweep.trainables.fresh_process import run_in_fresh_process
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import cpu as cpu_platform
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.base import PlatformUnavailable
from accelsweep.trainables.workloads.base import import_path
from accelsweep.trainables.workloads.cpu_resnet import CpuResNet
from tests.test_examples import _public_section, accelsweep_imports, run_smoke
from tests.test_platform_knowledge import assert_study_imports

SCRIPT = Path(cpu_resnet.__file__)
TINY = dict(workload=import_path(CpuResNet), model="resnet18", image_size=32, batch_size=4, warmup_steps=1,
            window_min_steps=1, window_min_s=0.0, windows=1, cpus_per_worker=os.cpu_count() or 1)
JEMALLOC = cpu_platform.find_allocator("jemalloc")
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="no jemalloc library here (Ray's wheel has one)")


def test_the_study_composes_the_public_api_its_platform_and_its_workload():
    section = _public_section()
    assert_study_imports(SCRIPT, CpuResNet.__module__)
    for module, name in accelsweep_imports(SCRIPT):
        assert module != "accelsweep" or f"`{name}`" in section  # the front door's names, documented


def test_the_docstring_opens_with_the_seeds_table():
    for figure in ("9.12", "24.34", "37.93", "39.05", "40.73", "$0.357/h", "$0.1291/h", "c7i.2xlarge"):
        assert figure in cpu_resnet.__doc__
    assert PRICE_TABLE["c7i.2xlarge"].usd_per_hour == 0.357 and PRICE_TABLE["c7i.2xlarge"].vcpus == 8


# ---- allocator -------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_jemalloc
def test_the_allocator_knob_puts_the_library_in_the_trial_process():
    jemalloc = TrialConfig.make(**TINY, allocator="jemalloc")
    env = get_platform("cpu").trial_env(jemalloc)
    assert env["LD_PRELOAD"] == JEMALLOC and "background_thread:true" in env["MALLOC_CONF"]
    # The trial's process reads its own /proc/self/maps (CpuPlatform.describe_device, check_allocator).
    [result] = list(run_in_fresh_process(jemalloc))
    assert f"allocator jemalloc {JEMALLOC}" in result["device"], result["device"]
    [result] = list(run_in_fresh_process(jemalloc.replace(allocator="glibc")))
    assert "allocator glibc," in result["device"] and "jemalloc" not in result["device"]


@pytest.mark.slow
@needs_jemalloc
def test_a_process_started_without_the_allocator_refuses_the_trial(monkeypatch):
    config = TrialConfig.make(**TINY, allocator="jemalloc")
    # In this (reused) process: LD_PRELOAD set now changes nothing, so the trial is refused.
    with pytest.raises(PlatformUnavailable, match="reads LD_PRELOAD only when a process starts"):
        get_platform("cpu").check_allocator(config)
    # A fresh process started without it: refused there, raised here under the child's class name.
    monkeypatch.setattr(cpu_platform.CpuKnobs, "process_env", lambda self: {})
    with pytest.raises(RuntimeError, match="allocator 'jemalloc' was asked for") as raised:
        list(run_in_fresh_process(config))
    assert type(raised.value).__name__ == "PlatformUnavailable"


def test_glibc_is_refused_in_a_process_that_has_another_allocator(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /opt/lib/libtcmalloc_minimal.so.4.5.9\n"
                    "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert cpu_platform.loaded_allocators(str(maps)) == {"tcmalloc": "/opt/lib/libtcmalloc_minimal.so.4.5.9"}
    config = TrialConfig.make(**TINY, allocator="glibc")
    with pytest.raises(PlatformUnavailable, match=r"has tcmalloc \(/opt/lib/libtcmalloc_minimal"):
        get_platform("cpu").check_allocator(config, maps=str(maps))


def test_an_allocator_the_machine_lacks_is_refused_before_any_trial(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_platform, "allocator_search_path", lambda: [str(tmp_path)])
    with pytest.raises(ConfigError, match=r"allocator must be one of glibc \(found on this machine\)") as raised:
        TrialConfig.make(**TINY, allocator="tcmalloc")
    assert str(tmp_path) in str(raised.value) and "libtcmalloc-minimal4" in str(raised.value)
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    config = TrialConfig.make(**TINY, allocator="tcmalloc")
    assert get_platform("cpu").trial_env(config) == {"LD_PRELOAD": str(tmp_path / "libtcmalloc_minimal.so.4")}
    assert cpu_resnet.allocators_here("cpu") == ["glibc", "tcmalloc"]  # what the study searches


# ---- threads, torch.compile, bf16 --------------------------------------------------------------------
def test_threads_set_torch_intra_op_threads():
    import torch

    before = torch.get_num_threads()
    try:
        device = get_platform("cpu").device(TrialConfig.make(**TINY, threads=1))
        assert torch.get_num_threads() == 1 and device.type == "cpu"
        assert "1 intra-op threads" in get_platform("cpu").describe_device(device)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value, expected", [("max-autotune", {"backend": "inductor", "mode": "max-autotune"}),
                                             ("inductor", {"backend": "inductor"})])
def test_max_autotune_passes_its_mode_to_torch_compile(monkeypatch, value, expected):
    import torch

    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    model = torch.nn.Linear(2, 2)
    assert get_platform("cpu").compile(model, TrialConfig.make(**TINY, torch_compile=value)) is model
    assert calls == [expected]


def test_bf16_is_refused_where_the_cpu_lacks_it(monkeypatch):
    old = cpu_platform.cpu_capabilities("model name\t: Intel Xeon Platinum 8275CL\nflags\t\t: fpu avx2 avx512f\n",
                                        cores=2, numa_node_count=1)
    monkeypatch.setattr(cpu_platform.CpuPlatform, "capabilities", lambda self, config: old)
    for precision in ("bf16-autocast", "bf16"):
        with pytest.raises(ConfigError, match=r"precision must be fp32 on this hardware.*Platinum 8275CL.*emulate"):
            TrialConfig.make(**TINY, precision=precision)
    TrialConfig.make(**TINY, precision="fp32")
    assert space_choices(make_space(False, False, 2, False, ["glibc"], 1))["precision"] == ("fp32",)
    assert space_choices(make_space(False, False, 2, True, ["glibc"], 1))["precision"] == ("fp32", "bf16-autocast")
    amx = cpu_platform.cpu_capabilities("model name\t: Intel Xeon Platinum 8488C\nflags\t\t: avx512f amx_bf16\n",
                                        cores=2, numa_node_count=1)
    monkeypatch.setattr(cpu_platform.CpuPlatform, "capabilities", lambda self, config: amx)
    TrialConfig.make(**TINY, precision="bf16")


# ---- NUMA ----------------------------------------------------------------------------------------------
def test_numa_nodes_and_workers_across_them(tmp_path):
    for node, cpus in (("node0", "0-3,8-11"), ("node1", "4-7,12-15")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    assert cpu_platform.numa_nodes(str(tmp_path)) == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    (tmp_path / "node2").mkdir()  # memory only (CXL): no CPUs, no worker
    (tmp_path / "node2" / "cpulist").write_text("\n")
    assert len(cpu_platform.numa_nodes(str(tmp_path))) == 2
    assert "workers" not in space_choices(make_space(False, False, 16, True, ["glibc"], 1))
    study = optuna.create_study()
    study.enqueue_trial({"workers": 2})
    fixed = make_space(False, False, 16, True, ["glibc", "jemalloc"], 2)(study.ask())
    assert fixed == {"cpus_per_worker": 8, "threads": 8, "numa_bind": True, "allocator": "glibc"}
    TrialConfig.make(**{**TINY, **fixed, "workers": 2})  # a valid config


@pytest.mark.slow
def test_numa_bind_pins_the_process_to_its_nodes_cpus():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to tell a pinned process from an unpinned one")
    cpus = sorted(os.sched_getaffinity(0))
    code = ("import os; from accelsweep.trainables.platforms import cpu\n"
            f"cpu.numa_nodes = lambda: {{0: [{cpus[0]}], 1: {cpus[1:]}}}\n"
            "cpu.CpuPlatform().bind_to_numa_node(); print(sorted(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"[{cpus[0]}]", out.stderr  # rank 0 (no process group) on node 0


# ---- the trial's process, price, platforms ---------------------------------------------------------------
@pytest.mark.slow
def test_a_stopped_trial_ends_its_process():
    others = set(children_of(os.getpid()))  # an earlier test's Ray may still be winding down
    results = run_in_fresh_process(TrialConfig.make(**{**TINY, "windows": 3}))
    next(results)
    assert set(children_of(os.getpid())) - others
    results.close()  # Tune stopping the trial: fresh_process_trainable closes the generator
    assert not set(children_of(os.getpid())) - others


def test_spot_is_the_seeds_quote_for_its_instance_type():
    args = types.SimpleNamespace(instance_type="c7i.2xlarge", price_per_hour=None)
    basis, note = spot_basis(args)
    assert basis.usd_per_hour == 0.1291 and "spot" in basis.source and basis.units["CPU"] == 8
    assert basis.hourly_rate({"CPU": 2}) == pytest.approx(0.1291 / 4) and "spot prices move" in note
    with pytest.raises(ConfigError, match="--spot"):
        spot_basis(types.SimpleNamespace(instance_type="g5.2xlarge", price_per_hour=None))


@pytest.mark.slow
def test_dry_run_shows_the_cpu_space_and_says_other_platforms_are_not_its(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for line in ("allocator: one of 'glibc'", "torch_compile: one of 'none', 'inductor', 'max-autotune'",
                 "threads: one of", "channels_last", "num_workers", "NUMA nodes"):
        assert line in run.stdout
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--platform", "cuda"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0 and "cpu_resnet is a CPU study" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_the_smoke_study_runs_and_logs_to_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    run, uri = run_smoke(SCRIPT, tmp_path, "--instance-type", "c7i.2xlarge", "--spot")
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    ran = [r for r in trials if r.data.tags["status"] != "reused"]  # a repeated proposal is answered, not run
    assert parent.info.status == "FINISHED" and len(ran) == 4
    for trial in trials:
        assert trial.info.status == "FINISHED", trial.data.tags.get("error")
        assert trial.data.metrics["throughput_samples_per_s"] > 0 and trial.data.metrics["usd_per_1m_samples"] > 0
        # Each trial ran with the allocator it asked for (read from its process's memory map).
        assert f"allocator {trial.data.params['allocator']}" in trial.data.tags["device"]


def space_choices(space) -> dict:
    trial = optuna.create_study().ask()
    space(trial)
    return {name: tuple(d.choices) for name, d in trial.distributions.items()}


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found

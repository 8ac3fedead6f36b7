"""The compile cache a sweep shares across trials (trainables/compile_cache.py): where it
is, what names its subdirectory, the environment each platform gives a trial, and, for
real on the CPU, a second run of the same inductor config loading every graph from it."""

from __future__ import annotations

import os

import pytest

from accelsweep.trainables import compile_cache
from accelsweep.trainables.compile_cache import ENV_VAR, cache_key, cache_location, cache_root, default_root
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import TRAINING_METRICS
from accelsweep.trainables.platforms import get_platform

INDUCTOR_SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


@pytest.fixture
def versions(monkeypatch):
    """Installed versions as the test says (a dict it may change), not as this machine has them."""
    installed = {"torch": "2.14.1", "triton": "3.8.0", "torch-xla": "2.9.0", "libtpu": "0.0.21"}
    monkeypatch.setattr(compile_cache, "installed_version", installed.get)
    return installed


@pytest.fixture
def home(monkeypatch, tmp_path):
    """A clean environment: no root named anywhere, the per-user default under tmp_path."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "accelsweep" / "compile"


# ---- where the cache is -----------------------------------------------------------------------------
def test_the_root_is_the_config_then_the_variable_then_one_directory_per_user(tmp_path):
    env = {"XDG_CACHE_HOME": "/xdg", ENV_VAR: "/from/variable"}
    assert cache_root("/from/config", env) == "/from/config"
    assert cache_root(None, env) == "/from/variable"
    assert cache_root(None, {"XDG_CACHE_HOME": "/xdg"}) == "/xdg/accelsweep/compile"
    assert default_root({}) == os.path.expanduser("~/.cache/accelsweep/compile")
    assert default_root({"XDG_CACHE_HOME": "relative"}) == default_root({})  # the XDG spec ignores a relative one
    assert cache_root("~/cache", {}) == os.path.expanduser("~/cache")
    assert cache_root("s3://bucket/prefix", {}) == "s3://bucket/prefix"
    # "off" in either place: no cache of ours; the config's value wins over the variable's.
    assert cache_root("off", env) is None and cache_root(None, {ENV_VAR: "OFF"}) is None
    assert cache_root("/from/config", {ENV_VAR: "off"}) == "/from/config"
    assert cache_root(None, {}, default=False) is None


@pytest.mark.parametrize("value, hint", [
    ("relative/dir", "a relative path would give each trial a cache of its own"),
    ("gs://bucket/x", "Neuron's also reads S3"),
    ("", ""),
    (3, ""),
])
def test_a_bad_root_is_refused_naming_the_field(value, hint):
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(compile_cache=value)
    assert str(caught.value).startswith(f"compile_cache must be {compile_cache.ALLOWED}; got {value!r}")
    assert hint in str(caught.value)


def test_a_bad_variable_is_refused_by_its_name():
    with pytest.raises(ConfigError, match=f"{ENV_VAR} must be .*; got 'cache'"):
        cache_root(None, {ENV_VAR: "cache"})


def test_s3_only_where_the_compiler_reads_it():
    TrialConfig.make(platform="neuron", compile_cache="s3://bucket/cache")
    for platform in ("cpu", "cuda", "xla", "tpu"):
        with pytest.raises(ConfigError, match="Only Neuron's compiler reads S3 itself"):
            TrialConfig.make(platform=platform, compile_cache="s3://bucket/cache")


# ---- what names its subdirectory ---------------------------------------------------------------------
def test_the_key_changes_with_the_compiler_version_and_flags(versions):
    key = cache_key("cuda", ("torch", "triton"))
    assert key == "cuda_torch-2.14.1_triton-3.8.0"
    assert cache_key("cuda", ("torch", "triton")) == key  # the same build: the same directory
    versions["triton"] = "3.9.0"
    assert cache_key("cuda", ("torch", "triton")) != key
    assert cache_key("cpu", ("torch",)) != cache_key("cuda", ("torch",))
    flagged = cache_key("xla", ("torch-xla",), "--xla_cpu_enable_fast_math=false")
    assert flagged.startswith("xla_torch-xla-2.9.0_flags-")
    assert flagged != cache_key("xla", ("torch-xla",), "--xla_cpu_enable_fast_math=true")
    assert flagged == cache_key("xla", ("torch-xla",), "  --xla_cpu_enable_fast_math=false ")  # spacing is no flag
    assert cache_key("xla", ("torch-xla", "not-installed")) == "xla_torch-xla-2.9.0"
    # Neuron keys its own cache (neuronxcc-<version>/MODULE_<graph>+<flags>): no subdirectory.
    assert cache_key("neuron") == ""
    assert cache_location("s3://b/c/", "cpu", ("torch",), environ={}) == "s3://b/c/cpu_torch-2.14.1"


# ---- the environment each platform gives a trial --------------------------------------------------
def test_inductor_trials_cache_in_the_users_directory_per_torch_build(home, versions):
    cpu, cuda = get_platform("cpu"), get_platform("cuda")
    assert cpu.trial_env(TrialConfig.make()) == {}  # eager: nothing compiles
    compiled = TrialConfig.make(torch_compile="inductor")
    location = str(home / "cpu_torch-2.14.1")
    assert cpu.trial_env(compiled) == {"TORCHINDUCTOR_CACHE_DIR": location, **INDUCTOR_SWITCHES}
    assert cpu.compile_cache(compiled) == location
    assert cpu.trial_env(compiled.replace(torch_compile="max-autotune"))["TORCHINDUCTOR_CACHE_DIR"] == location
    assert cuda.trial_env(TrialConfig.make(platform="cuda", torch_compile="inductor")) == {
        "TORCHINDUCTOR_CACHE_DIR": str(home / "cuda_torch-2.14.1_triton-3.8.0"), **INDUCTOR_SWITCHES}
    assert cpu.trial_env(compiled.replace(compile_cache="/shared/c")) == {
        "TORCHINDUCTOR_CACHE_DIR": "/shared/c/cpu_torch-2.14.1", **INDUCTOR_SWITCHES}
    assert cpu.trial_env(compiled.replace(compile_cache="off")) == {}


def test_the_variable_points_every_trial_elsewhere(home, versions, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "/cluster/compile")
    assert get_platform("cpu").trial_env(TrialConfig.make(torch_compile="inductor"))["TORCHINDUCTOR_CACHE_DIR"] == \
        "/cluster/compile/cpu_torch-2.14.1"
    assert get_platform("neuron").trial_env(TrialConfig.make(platform="neuron"))["NEURON_COMPILE_CACHE_URL"] == \
        "/cluster/compile"
    monkeypatch.setenv(ENV_VAR, "off")
    assert get_platform("cpu").trial_env(TrialConfig.make(torch_compile="inductor")) == {}


def test_the_allocator_and_the_cache_travel_together_on_a_cpu(home, versions, monkeypatch):
    from accelsweep.trainables.platforms import cpu as cpu_platform

    monkeypatch.setattr(cpu_platform, "find_allocator", lambda name: "" if name == "glibc" else f"/lib/{name}.so")
    env = get_platform("cpu").trial_env(TrialConfig.make(torch_compile="inductor", allocator="tcmalloc"))
    assert env == {"LD_PRELOAD": "/lib/tcmalloc.so", "TORCHINDUCTOR_CACHE_DIR": str(home / "cpu_torch-2.14.1"),
                   **INDUCTOR_SWITCHES}


def test_xla_trials_cache_where_their_client_can_load_it(home, versions, monkeypatch):
    xla, tpu = get_platform("xla"), get_platform("tpu")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    # The CPU client cannot load executables back: no cache unless one is named.
    assert xla.trial_env(TrialConfig.make(platform="xla")) == {"PJRT_DEVICE": "CPU"}
    named = TrialConfig.make(platform="xla", compile_cache="/shared/xla")
    assert xla.trial_env(named)["XLA_PERSISTENT_CACHE_PATH"] == "/shared/xla/xla_torch-2.14.1_torch-xla-2.9.0"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert "_flags-" in xla.trial_env(named)["XLA_PERSISTENT_CACHE_PATH"]
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    assert xla.trial_env(TrialConfig.make(platform="xla"))["XLA_PERSISTENT_CACHE_PATH"] == \
        str(home / "xla_torch-2.14.1_torch-xla-2.9.0")
    assert tpu.trial_env(TrialConfig.make(platform="tpu")) == {
        "PJRT_DEVICE": "TPU", "XLA_PERSISTENT_CACHE_PATH": str(home / "tpu_torch-2.14.1_torch-xla-2.9.0_libtpu-0.0.21")}


def test_neuron_trials_share_one_cache_that_neuron_keys_itself(home, versions):
    neuron = get_platform("neuron")
    env = neuron.trial_env(TrialConfig.make(platform="neuron", neuron_optlevel=3))
    assert env["NEURON_COMPILE_CACHE_URL"] == str(home) and "--optlevel=3" in env["NEURON_CC_FLAGS"]
    on_s3 = TrialConfig.make(platform="neuron", compile_cache="s3://bucket/accelsweep")
    assert neuron.trial_env(on_s3)["NEURON_COMPILE_CACHE_URL"] == "s3://bucket/accelsweep"
    assert "NEURON_COMPILE_CACHE_URL" not in neuron.trial_env(on_s3.replace(compile_cache="off"))


def test_the_cache_figures_are_declared_metrics():
    for name in ("fxgraph_cache_hits", "fxgraph_cache_misses", "aotautograd_cache_hits", "aotautograd_cache_misses",
                 "xla_cache_hits"):
        assert TRAINING_METRICS[name].label is None  # figures of a trial, not rows of the summary


# ---- for real: a second run loads what the first compiled -----------------------------------------
@pytest.mark.slow
def test_a_second_run_of_an_inductor_config_loads_every_graph_from_the_cache(tmp_path):
    """Each run in a fresh process started with the trial's environment (as a fresh-process
    trial runs), both with one new cache directory: the first compiles and stores every
    graph, the second finds them all. Counts, not timings."""
    from accelsweep.trainables.fresh_process import run_in_fresh_process

    config = TrialConfig.make(model="vit-micro", torch_compile="inductor", batch_size=8, cpus_per_worker=1,
                              warmup_steps=1, window_min_steps=1, window_min_s=0.0, windows=1,
                              compile_cache=str(tmp_path / "cache"))
    location = get_platform("cpu").compile_cache(config)
    assert location.startswith(str(tmp_path / "cache") + os.sep)
    [first] = list(run_in_fresh_process(config))
    [second] = list(run_in_fresh_process(config))
    assert first["compile_cache_location"] == second["compile_cache_location"] == location
    assert first["fxgraph_cache_misses"] > 0 and first["fxgraph_cache_hits"] == 0
    assert first["aotautograd_cache_misses"] > 0
    assert second["fxgraph_cache_hits"] > 0 and second["fxgraph_cache_misses"] == 0
    assert second["aotautograd_cache_hits"] > 0 and second["aotautograd_cache_misses"] == 0
    assert first["compile_s"] > 0 and second["compile_s"] > 0  # dynamo still traces: compile_s stays a time
    assert os.path.isdir(os.path.join(location, "fxgraph")) and os.path.isdir(os.path.join(location, "aotautograd"))

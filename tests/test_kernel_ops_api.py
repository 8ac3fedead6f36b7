"""Kernel ops from any package: an op named by import path or by an installed entry
point is checked, timed and swept like a built-in one; a bad name says what is allowed;
a kernel sweep is built from plain arguments, never from sys.argv. Fast: no Ray."""

from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest

from accelsweep.kernels import registry
from accelsweep.kernels.registry import ENTRY_POINT_GROUP, OPS, KernelImpl, OpSpec, get_op, importable_module
from accelsweep import plan_sweep
from accelsweep.sweeps.driver.run.kernel_sweep import SMOKE_MEASUREMENT, build_kernel_sweep, kernel_main
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.harness.microbench import KernelConfig, kernel_metrics, kernel_trainable, run_microbench

HERE = __name__  # "tests.test_kernel_ops_api": what a user's package would be
ROW_SUM_PATH = f"{HERE}:ROW_SUM"
FAST = dict(warmup_calls=1, window_min_calls=2, window_min_s=0.0, windows=1)


def make_rows(seed, rows, cols):
    return (np.random.default_rng(seed).normal(size=(rows, cols)),)


def row_sum_reference(x, scale):
    return x.sum(axis=-1) * scale


def row_sum_numpy(x, scale):
    return np.add.reduce(x, axis=-1) * scale


def row_sum_torch(x, scale):
    return x.sum(dim=-1) * scale


ROW_SUM = OpSpec(
    name="row_sum", make_inputs=make_rows, reference=row_sum_reference, shape={"rows": 8, "cols": 16},
    items=lambda rows, cols: rows, options={"scale": 1.0}, tolerance={"float32": 1e-4},
    implementations=(KernelImpl("numpy-sum", f"{HERE}:row_sum_numpy", "numpy", ("cpu",), "numpy"),
                     KernelImpl("torch-sum", f"{HERE}:row_sum_torch", "torch", ("cpu", "cuda"), "torch")))
NOT_A_SPEC = {"name": "row_sum"}


@pytest.fixture
def no_installed_ops_cache():
    """installed_ops() reads entry points once per process: read them again around a test
    that installs some."""
    registry.installed_ops.cache_clear()
    yield
    registry.installed_ops.cache_clear()


@pytest.mark.parametrize("impl", ["numpy-sum", "torch-sum"])
def test_an_op_by_import_path_is_checked_and_timed_like_a_built_in_one(impl):
    config = KernelConfig.make(op=ROW_SUM_PATH, impl=impl, rows=4, cols=32, scale=2.0, **FAST)
    assert config.shape == {"rows": 4, "cols": 32} and config.options == {"scale": 2.0}
    # The name travels in the trial's config as given: a Ray worker loads the op from it.
    assert config.to_dict()["op"] == ROW_SUM_PATH and KernelConfig.from_dict(config.to_dict()) == config
    result = run_microbench(config)
    assert result["impl"] == impl and result["max_abs_error"] <= 1e-4
    assert result["latency_p50_s"] > 0 and result["items_per_s"] > 0


def test_a_wrong_implementation_of_a_users_op_fails_its_check(monkeypatch):
    from accelsweep.trainables.harness.microbench import KernelMismatch

    monkeypatch.setattr(sys.modules[HERE], "row_sum_wrong", lambda x, scale: x.sum(axis=-1), raising=False)
    wrong = KernelImpl("wrong", f"{HERE}:row_sum_wrong", "numpy", ("cpu",), "numpy")
    monkeypatch.setattr(sys.modules[HERE], "ROW_SUM", dataclasses.replace(
        ROW_SUM, implementations=ROW_SUM.implementations + (wrong,)))
    with pytest.raises(KernelMismatch, match="differs from the reference"):
        run_microbench(KernelConfig.make(op=ROW_SUM_PATH, impl="wrong", scale=3.0, **FAST))


def _refused(op: str) -> str:
    with pytest.raises(ConfigError) as caught:
        KernelConfig.make(op=op, impl="numpy-sum")
    assert caught.value.field == "op"
    message = str(caught.value)
    assert message.startswith("op must be ") and repr(op) in message
    return message


def test_an_unknown_name_lists_every_kind_of_name_allowed():
    message = _refused("conv9")
    assert f"one of the built-in ops ({', '.join(OPS)})" in message
    assert f"an op installed under entry point group {ENTRY_POINT_GROUP}" in message
    assert "an import path 'package.module:ATTR' naming an OpSpec; got 'conv9'" in message


def test_bad_import_paths_are_config_errors_with_the_reason(tmp_path, monkeypatch):
    message = _refused("no_such_package_here.ops:SPEC")
    assert "Importing no_such_package_here.ops failed: No module named 'no_such_package_here'" in message
    assert "The module must import on the driver and on every Ray worker" in message
    assert "tests.test_kernel_ops_api has no NO_SUCH_SPEC" in _refused(f"{HERE}:NO_SUCH_SPEC")
    assert "is a dict, not an accelsweep.kernels.registry.OpSpec" in _refused(f"{HERE}:NOT_A_SPEC")
    assert "is a function, not an" in _refused(f"{HERE}:row_sum_numpy")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "broken_user_ops.py").write_text("raise RuntimeError('no licence server')\n")
    assert "Importing broken_user_ops raised RuntimeError: no licence server" in _refused("broken_user_ops:SPEC")
    # An invalid OpSpec fails where it is declared; loaded by path, the reason is kept.
    (tmp_path / "invalid_user_ops.py").write_text(
        "from accelsweep.kernels.registry import KernelImpl, OpSpec\n"
        "impl = KernelImpl('a', 'invalid_user_ops:f', 'numpy', ('cpu',), 'numpy')\n"
        "SPEC = OpSpec('mine', make_inputs=print, reference=print, shape={}, items=len,\n"
        "              implementations=(impl, impl))\n")
    assert "implementation names of op 'mine' must be unique; got ['a']" in _refused("invalid_user_ops:SPEC")


def test_an_implementation_target_without_its_function_is_a_config_error():
    missing = KernelImpl("gone", f"{HERE}:no_such_function", "numpy", ("cpu",), "numpy")
    with pytest.raises(ConfigError, match="target of implementation gone must be 'module:function' naming a "
                                          "function; got .*no_such_function'. Module tests.test_kernel_ops_api"):
        missing.load()


IMPL = KernelImpl("a", f"{HERE}:row_sum_numpy", "numpy", ("cpu",), "numpy")


@pytest.mark.parametrize("make, expected", [
    (lambda: dataclasses.replace(ROW_SUM, implementations=()),
     "implementations of op 'row_sum' must be a non-empty tuple of KernelImpl; got ()"),
    (lambda: dataclasses.replace(ROW_SUM, implementations=(IMPL, IMPL)),
     "implementation names of op 'row_sum' must be unique; got ['a']"),
    (lambda: dataclasses.replace(ROW_SUM, implementations=(dataclasses.replace(IMPL, dtypes=("bfloat16",)),)),
     "dtypes of implementation a of op 'row_sum' must be a tuple of names from float32; got ('bfloat16',)"),
    (lambda: dataclasses.replace(ROW_SUM, tolerance={}),
     "tolerance of op 'row_sum' must be a mapping dtype -> max abs error, at least one dtype; got {}"),
    (lambda: dataclasses.replace(ROW_SUM, tolerance={"fp32": 1e-4}),
     "tolerance of op 'row_sum' must be keyed by numpy dtype names (float32, bfloat16, int8, ...); got 'fp32'"),
    (lambda: dataclasses.replace(ROW_SUM, options={"rows": 1}),
     "shape and options names of op 'row_sum' must be distinct; got ['rows']"),
    (lambda: dataclasses.replace(ROW_SUM, reference=None), "reference of op 'row_sum' must be a function; got None"),
    (lambda: dataclasses.replace(IMPL, platforms=("gpu",)),
     "platforms of implementation a must be a tuple of names from cpu, cuda, xla, neuron, tpu, neuron-standin-cpu; got ('gpu',)"),
    (lambda: dataclasses.replace(IMPL, framework="cupy"),
     "framework of implementation a must be one of numpy, torch, jax; got 'cupy'"),
    (lambda: dataclasses.replace(IMPL, target="tests.test_kernel_ops_api.row_sum_numpy"),
     "target of implementation a must be 'package.module:function'; got 'tests.test_kernel_ops_api.row_sum_numpy'"),
], ids=["no impls", "repeated impl", "impl dtype without tolerance", "no tolerance", "unknown dtype",
        "shape/option clash", "no reference", "unknown platform", "unknown framework", "target without colon"])
def test_an_op_spec_is_checked_where_it_is_declared(make, expected):
    with pytest.raises(ConfigError) as caught:
        make()
    assert str(caught.value) == expected


def test_an_op_whose_names_shadow_config_fields_is_refused(monkeypatch):
    monkeypatch.setattr(sys.modules[HERE], "SEEDED", dataclasses.replace(ROW_SUM, shape={"rows": 8, "seed": 1}),
                        raising=False)
    with pytest.raises(ConfigError, match=r"shape, option and tuning names of op 'row_sum' must be names other "
                                          r"than the config's fields \(.*\); got \['seed'\]"):
        KernelConfig.make(op=f"{HERE}:SEEDED", impl="numpy-sum")


def _install_entry_points(directory, lines: str) -> None:
    """A distribution as pip would leave it: a dist-info folder with entry_points.txt."""
    info = directory / "user_ops_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-ops-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def test_ops_installed_under_the_entry_point_group_are_found_by_name(tmp_path, monkeypatch, no_installed_ops_cache):
    _install_entry_points(tmp_path, f"row_sum = {ROW_SUM_PATH}\nbroken = {HERE}:NOT_A_SPEC\ngiou = {ROW_SUM_PATH}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.installed_ops() == {"row_sum": ROW_SUM_PATH, "broken": f"{HERE}:NOT_A_SPEC"}
    assert get_op("row_sum") is ROW_SUM
    assert get_op("giou").name == "giou"  # a built-in name stays the built-in op
    result = run_microbench(KernelConfig.make(op="row_sum", impl="numpy-sum", **FAST))
    assert result["max_abs_error"] <= 1e-4
    message = _refused("broken")
    assert f"Entry point broken = '{HERE}:NOT_A_SPEC' (group {ENTRY_POINT_GROUP}): " in message
    assert "is a dict, not an accelsweep.kernels.registry.OpSpec" in message
    assert f"group {ENTRY_POINT_GROUP} (broken, row_sum)" in _refused("conv9")


def test_importable_module_names_a_script_by_its_file(monkeypatch):
    assert importable_module("my_package.ops") == "my_package.ops"
    script = types.ModuleType("__main__")
    script.__file__, script.__spec__ = "/somewhere/my_study.py", None  # python /somewhere/my_study.py
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert importable_module("__main__") == "my_study"
    script.__spec__ = types.SimpleNamespace(name="my_package.my_study")  # python -m my_package.my_study
    assert importable_module("__main__") == "my_package.my_study"


def test_a_kernel_sweep_is_built_from_arguments_not_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["some_notebook", "--not-a-flag-of-ours"])
    lines = []
    sweep = build_kernel_sweep(ROW_SUM_PATH, {"rows": [4, 8], "cols": 16}, platform="auto", options={"scale": 2.0},
                               smoke=True, seed=3, print_line=lines.append, tracking_uri=f"sqlite:///{tmp_path}/m.db",
                               storage_path=str(tmp_path / "ray"), experiment="mine")
    assert sweep.name == "row_sum_kernels" and sweep.sampler == "grid" and sweep.scheduler == "none"
    assert sweep.num_samples == 4 and sweep.seed == 3 and sweep.experiment == "mine"  # 2 impls x 2 rows
    assert sweep.base.op == ROW_SUM_PATH and sweep.base.platform == "cpu" and sweep.base.options == {"scale": 2.0}
    assert {k: getattr(sweep.base, k) for k in SMOKE_MEASUREMENT} == SMOKE_MEASUREMENT
    assert "tflops" not in [m.name for m in sweep.metrics.summarised]  # row_sum has no FLOP count
    plan = plan_sweep(sweep)
    assert plan.baseline_point == {"impl": "numpy-sum", "rows": 4, "cols": 16}
    assert "impl: one of 'numpy-sum', 'torch-sum'" in plan.describe()
    assert lines == []  # both implementations load here: nothing skipped


def test_the_builder_refuses_what_the_op_does_not_have():
    with pytest.raises(ConfigError, match=r"shapes must be keyed by the shape parameters of op 'row_sum' "
                                          r"\(rows, cols\); got 'batch'"):
        build_kernel_sweep(ROW_SUM_PATH, {"batch": [1]}, platform="cpu")
    with pytest.raises(ConfigError, match="dtype must be one of float32; got 'int8'. Those are the dtypes op "
                                          "'row_sum' has a tolerance for"):
        build_kernel_sweep(ROW_SUM_PATH, platform="cpu", dtype="int8")
    with pytest.raises(ConfigError, match=r"options must be keyed by the options of op 'row_sum' \(scale\); "
                                          r"got 'causal'"):
        build_kernel_sweep(ROW_SUM_PATH, platform="cpu", options={"causal": True})
    with pytest.raises(ConfigError, match="platform must be one of auto, cpu, .*; got 'gpu'"):
        build_kernel_sweep(ROW_SUM_PATH, platform="gpu")
    with pytest.raises(ConfigError, match="measurement must be keyed by warmup_calls, window_min_calls, "
                                          "window_min_s, windows; got 'seed'"):
        build_kernel_sweep(ROW_SUM_PATH, platform="cpu", measurement={"seed": 1})


def test_measurement_settings_go_over_the_smoke_ones():
    sweep = build_kernel_sweep(ROW_SUM_PATH, platform="cpu", smoke=True, measurement={"windows": 4}, num_samples=1)
    assert (sweep.base.windows, sweep.base.window_min_calls, sweep.num_samples) == (4, 5, 1)


def test_kernel_main_reads_the_arguments_it_is_given(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pytest", "--not-a-flag-of-ours"])
    kernel_main("giou", "GIoU", shapes={"batch": [64]}, smoke_shapes={"batch": [8], "boxes": [64]},
                argv=["--dry-run", "--smoke", "--platform", "cpu"])
    out = capsys.readouterr().out
    assert "sweep 'giou_kernels' on platform 'cpu'" in out and "early stopping: none" in out


def test_the_trainable_declares_its_metrics_per_op():
    assert kernel_trainable.metrics is kernel_metrics
    matmul = KernelConfig.make(op="matmul", impl="torch-matmul", m=128, k=128, n=128)
    assert "tflops" in [m.name for m in kernel_trainable.metrics(matmul).summarised]
    row_sum = KernelConfig.make(op=ROW_SUM_PATH, impl="numpy-sum")
    assert "tflops" not in [m.name for m in kernel_trainable.metrics(row_sum).summarised]
    assert kernel_trainable.metrics(row_sum).measurement == "latency_p50_s"


@pytest.mark.parametrize("module", ["accelsweep.kernels.registry", "accelsweep.trainables.harness.microbench",
                                    "accelsweep.sweeps.driver.run.kernel_sweep"])
def test_public_names_are_listed_and_exist(module):
    import importlib

    loaded = importlib.import_module(module)
    assert loaded.__all__ and all(hasattr(loaded, name) for name in loaded.__all__)

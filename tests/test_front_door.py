"""``import accelsweep`` is the front door: every name a sweep script needs, loaded on first
use; the module paths of the previous release still work for one release, each with a
DeprecationWarning that names the new import (accelsweep/_moved.py)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import accelsweep
from accelsweep._moved import MOVED

ROOT = Path(__file__).resolve().parent.parent
PREVIOUS_EXAMPLES = sorted((ROOT / "tests" / "previous_release").glob("*.py"))


def test_the_names_a_user_needs_are_at_the_top():
    for name in ("Sweep", "Objective", "run_sweep", "plan_sweep", "TrialConfig", "Workload", "WorkloadKnobs", "knob",
                 "Metric", "MetricSet", "declare_metrics", "OpSpec", "KernelImpl", "build_kernel_sweep", "load_sweep",
                 "SweepHistory", "TrialRecord"):
        assert name in accelsweep.__all__
    for name in accelsweep.__all__:
        value = getattr(accelsweep, name)
        assert getattr(value, "__name__", name) == name or not callable(value), name
    from accelsweep.sweeps.driver.define.sweep import Sweep

    assert accelsweep.Sweep is Sweep


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Swep'"):
        accelsweep.Swep  # noqa: B018


def test_importing_the_front_door_loads_no_heavy_stack():
    # A trial's process imports accelsweep.trainables, so accelsweep itself must stay light.
    code = ("import sys, accelsweep; heavy = [m for m in ('ray', 'mlflow', 'optuna', 'torch') if m in sys.modules]; "
            "print(heavy); accelsweep.TrialConfig; print('torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "False False", "the trial config needs neither torch nor Ray"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_new_module_and_warns(old):
    new = MOVED[old]
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
    assert new in str(warning.message)


def test_an_old_path_leaves_the_new_modules_spec_alone():
    sys.modules.pop("accelsweep.sweeps.driver.cluster_hosts", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("accelsweep.sweeps.driver.cluster_hosts")
    assert old.__spec__.name == "accelsweep.sweeps.driver.ops.cluster_hosts"
    assert importlib.util.find_spec("accelsweep.sweeps.driver.ops.cluster_hosts").origin == old.__file__


def test_python_dash_m_on_an_old_path_runs_the_new_module(tmp_path):
    run = subprocess.run([sys.executable, "-m", "accelsweep.sweeps.report", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: accelsweep report")
    assert "FutureWarning: accelsweep.sweeps.report has moved" in run.stderr


def test_a_checkout_on_the_path_imports_without_an_install(tmp_path):
    """The lent GPU machine runs the checkout from PYTHONPATH, with no editable install."""
    code = ("import sys; "
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]; "
            f"sys.path.insert(0, {str(ROOT)!r}); import accelsweep, accelsweep.trainables.config; "
            "print(accelsweep.TrialConfig.__module__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "accelsweep.trainables.config"


def test_the_warning_points_at_the_importing_line(tmp_path):
    script = tmp_path / "old_workload.py"
    script.write_text("from accelsweep.trainables.workload import Workload, WorkloadKnobs, import_path, knob\n"
                      "assert Workload.__module__ == 'accelsweep.trainables.workloads.base'\n"
                      "print(import_path(Workload))\n")
    run = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "accelsweep.trainables.workloads.base:Workload" in run.stdout
    assert f"{script}:1: DeprecationWarning: accelsweep.trainables.workload has moved" in run.stderr, run.stderr


@pytest.mark.parametrize("script", PREVIOUS_EXAMPLES, ids=lambda p: p.stem)
def test_the_previous_releases_examples_still_plan(script, tmp_path):
    """The previous release's examples/, unchanged: each plans its sweep (--dry-run) and is
    told where its imports went."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    run = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script), "--smoke", "--dry-run",
                          "--platform", "cpu", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "accelsweep.sweeps.driver.api has moved: import accelsweep" in run.stderr
    assert "sample 1:" in run.stdout

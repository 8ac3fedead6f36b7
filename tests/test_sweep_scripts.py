"""Sweep scripts beside their workload (issue 27, item 5): a sweep script copied into a
user's folder runs its trials (a fresh process's included), and a sweep that measured
nothing ends its script with a non-zero exit status, after its summary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from accelsweep.sweeps.driver.define.cli import NOTHING_MEASURED_EXIT
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs


def user_folder(tmp_path, *files):
    """A user's folder holding ``files`` (name, text or a path to copy), and another folder
    to run from (neither is the checkout, nor on this process's path)."""
    folder, elsewhere = tmp_path / "my_sweeps", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    for name, text in files:
        if os.path.isfile(text):
            shutil.copy(text, folder / name)
        else:
            (folder / name).write_text(text)
    return folder, elsewhere


@pytest.mark.slow
def test_a_copy_of_cpu_resnet_in_a_users_folder_runs_its_trials_in_fresh_processes(tmp_path):
    """The issue's case: every trial failed with "No module named 'cpu_resnet'", though
    the plan accepted the workload (the driver imports it from the script's folder)."""
    folder, elsewhere = user_folder(tmp_path, ("cpu_resnet.py", os.path.join(REPO, "sweeps", "cpu_resnet.py")))
    uri = f"sqlite:///{tmp_path}/m.db"
    done = subprocess.run([sys.executable, str(folder / "cpu_resnet.py"), "--smoke", "--num-samples", "1",
                           "--tracking-uri", uri, "--storage-path", str(tmp_path / "ray")],
                          cwd=elsewhere, capture_output=True, text=True, timeout=600)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, said
    assert "No module named" not in done.stdout + done.stderr, said
    _, children = mlflow_runs(uri, "cpu_resnet")
    assert [(run.data.tags["status"], run.data.params["workload"]) for run in children] == [
        ("finished", "cpu_resnet:CpuResNet")]
    assert float(children[0].data.metrics["throughput_samples_per_s"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("trials, reason", [
    ("fail", "error: every trial failed (2 of 2): no config was measured"),
    ("measure-nothing", "error: no trial measured the sweep's objective (2 trial(s) ran, 0 failed)"),
])
def test_a_sweep_script_that_measured_nothing_exits_non_zero_after_its_summary(tmp_path, trials, reason):
    folder, elsewhere = user_folder(tmp_path, ("user_sweep.py", os.path.join(REPO, "tests", "user_sweep.py")))
    done = subprocess.run([sys.executable, str(folder / "user_sweep.py"), "--trials", trials, "--scheduler", "none",
                           "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--storage-path", str(tmp_path / "ray")],
                          cwd=elsewhere, capture_output=True, text=True, timeout=300)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == NOTHING_MEASURED_EXIT == 1, said
    assert "== user_sweep on cpu: 2 trials in " in done.stdout, said  # the summary first, which says why
    assert done.stderr.strip().splitlines()[-1].startswith(reason), said
    assert "Traceback" not in done.stderr, said

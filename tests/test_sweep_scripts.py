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


# A user's sweep script with its workload beside it, each trial in a fresh process (as
# sweeps/cpu_resnet.py runs its trials).
USER_MODEL_SWEEP = '''
from accelsweep import Objective, Sweep, TrialConfig, Workload, import_path, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, main_guard, sweep_options
from accelsweep.trainables.fresh_process import fresh_process_trainable


class TinyNet(Workload):
    def build_model(self, config):
        import torch

        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))

    def dataset(self, config, rank, world_size):
        from accelsweep.trainables.workloads.random_images import RandomImageDataset

        return RandomImageDataset(8, 10, seed=config.seed, rank=rank, world_size=world_size)


def space(trial):
    trial.suggest_categorical("batch_size", [4])


def main():
    args = common_parser("a user's model", default_samples=1).parse_args()
    base = TrialConfig.make(workload=import_path(TinyNet), batch_size=4, warmup_steps=1, window_min_steps=2,
                            window_min_s=0.0, windows=1)
    return run_sweep(Sweep(name="user_model", trainable=fresh_process_trainable, base=base, space=space,
                           objectives=[Objective("throughput_samples_per_s", "max")],
                           **sweep_options(args, default_samples=1)))


if __name__ == "__main__":
    main_guard(main)
'''


@pytest.mark.slow
def test_a_users_sweep_with_its_own_workload_runs_its_trials_in_fresh_processes(tmp_path, shared_ray):
    """The issue's case: every trial failed with "No module named 'cpu_resnet'", though
    the plan accepted the workload (the driver imports it from the script's folder)."""
    folder, elsewhere = user_folder(tmp_path, ("user_model.py", USER_MODEL_SWEEP))
    uri = f"sqlite:///{tmp_path}/m.db"
    done = subprocess.run([sys.executable, str(folder / "user_model.py"), "--num-samples", "1",
                           "--tracking-uri", uri, "--storage-path", str(tmp_path / "ray"), *shared_ray.flags],
                          cwd=elsewhere, capture_output=True, text=True, timeout=600)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, said
    assert "No module named" not in done.stdout + done.stderr, said
    _, children = mlflow_runs(uri, "user_model")
    assert [(run.data.tags["status"], run.data.params["workload"]) for run in children] == [
        ("finished", "user_model:TinyNet")]
    assert float(children[0].data.metrics["throughput_samples_per_s"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("trials, reason", [
    ("fail", "error: every trial failed (2 of 2): no config was measured"),
    ("measure-nothing", "error: no trial measured the sweep's objective (2 trial(s) ran, 0 failed)"),
])
def test_a_sweep_script_that_measured_nothing_exits_non_zero_after_its_summary(tmp_path, trials, reason, shared_ray):
    folder, elsewhere = user_folder(tmp_path, ("user_sweep.py", os.path.join(REPO, "tests", "user_sweep.py")))
    done = subprocess.run([sys.executable, str(folder / "user_sweep.py"), "--trials", trials, "--scheduler", "none",
                           "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--storage-path", str(tmp_path / "ray"),
                           *shared_ray.flags],
                          cwd=elsewhere, capture_output=True, text=True, timeout=300)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == NOTHING_MEASURED_EXIT == 1, said
    assert "== user_sweep on cpu: 2 trials in " in done.stdout, said  # the summary first, which says why
    assert done.stderr.strip().splitlines()[-1].startswith(reason), said
    assert "Traceback" not in done.stderr, said

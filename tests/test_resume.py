"""--resume: a sweep whose driver was killed continues where it stopped. Finished
trials are not run again, interrupted ones are, and MLflow ends with exactly one run
per trial and none left RUNNING."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs

TRIALS = 16


def sweep_command(tmp_path, *extra):
    return [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", str(TRIALS), "--scheduler", "none", "--max-concurrent-trials", "1",
            "--tracking-uri", f"sqlite:///{tmp_path}/r.db", "--experiment", "R",
            "--storage-path", str(tmp_path / "ray"), *extra]


def finished_runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name("R")
    if found is None:
        return []
    return [r for r in client.search_runs([found.experiment_id]) if "mlflow.parentRunId" in r.data.tags
            and r.info.status == "FINISHED" and r.data.tags.get("status") != "reused"]


@pytest.mark.slow
def test_a_killed_driver_resumes_with_one_run_per_trial(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/r.db"
    MlflowClient(uri).search_experiments()  # create the store now: two processes must not both migrate it
    # Tune saves its experiment state every second here: a trial that ended 3 s before the
    # kill is in the saved state for sure.
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(sweep_command(tmp_path), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, env=env)
    deadline = time.monotonic() + 300
    while len(finished_runs(uri)) < 3:
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no trial finished in 300 s"
        time.sleep(0.5)
    time.sleep(3.5)  # so that the first ones ended well before the kill
    killed_at_ms = time.time() * 1000
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started, at once
    driver.wait()
    before = {r.data.tags["trial_id"]: r for r in finished_runs(uri) if r.info.end_time < killed_at_ms - 3000}
    assert 1 <= len(before) and len(finished_runs(uri)) < TRIALS

    resumed = subprocess.run(sweep_command(tmp_path, "--resume"), cwd=REPO, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming " in resumed.stdout

    parents, children = mlflow_runs(uri, "R")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    reused = [r for r in children if r.data.tags.get("status") == "reused"]  # repeated proposals: not run
    assert all(r.data.tags["reused_from_trial"] != "unknown" for r in reused)
    children = [r for r in children if r not in reused]
    trial_ids = [r.data.tags["trial_id"] for r in children]
    assert len(trial_ids) == len(set(trial_ids)) == TRIALS  # one run per trial, no duplicates
    assert not [r for r in children if r.info.status == "RUNNING"]  # no orphans
    after = {r.data.tags["trial_id"]: r for r in children}
    for trial_id, run in before.items():  # finished before the kill: not run again
        assert after[trial_id].info.status == "FINISHED"
        assert after[trial_id].info.end_time == run.info.end_time, trial_id
    # The resumed sweep went on writing the same Optuna study: one trial per run.
    import optuna

    tags = parents[0].data.tags
    study = optuna.load_study(study_name=tags["optuna_study"], storage=tags["optuna_storage"])
    assert sorted(t.user_attrs["mlflow_run_id"] for t in study.trials) == sorted(r.info.run_id for r in children)


def test_resume_without_a_stopped_sweep_is_refused(tmp_path):
    done = subprocess.run(sweep_command(tmp_path, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (f"--resume must be a stopped run of sweep 'neuron_vit' under {tmp_path}/ray (a neuron_vit-* directory "
            "with Tune's state that did not finish); got 'none found'") in done.stderr

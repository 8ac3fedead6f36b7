"""What a team reviews on its store (sweeps/driver/ops/team_store.py): ``accelsweep report``
and ``accelsweep compare`` against the MLflow server's URI (http://, basic auth, served
artifacts), reading sweeps' records and their PostgreSQL studies, and logging what they
build back on the server. (The MLflow UI on this server: tests/test_mlflow_ui.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ACCELSWEEP, REPO
from tests.team_store_fixture import needs_postgresql, store  # noqa: F401 - the module's store
from tests.test_sweep_e2e import mlflow_runs

pytestmark = [needs_postgresql, pytest.mark.slow]

EXPERIMENT = "review"

# Two drivers connecting to one Ray instance at the same moment: now and then one dies in
# Ray's C++ as its core worker starts (`plasma_store_provider.cc ... WarmupStore() ... Seal()
# called on an object without a reference to it`, seen once in a fresh-clone CI run). That is
# inside ray.init, before the sweep's parent run exists, so starting it again records nothing
# twice (the check of two parent runs below would say so).
RAY_CONNECT_CRASH = "WarmupStore"


@pytest.fixture(scope="module")
def two_sweeps(store, tmp_path_factory, shared_ray) -> list[str]:
    """Two small sweeps on the store, started together (their report on, as a user runs
    them): their parent runs' names."""
    folder = tmp_path_factory.mktemp("review")
    env = {**os.environ, "PGPASSFILE": store.credentials, "RAY_AUTH_MODE": "disabled"}

    def start(n: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", store.tracking_uri, "--study-storage",
             store.study_storage, "--experiment", EXPERIMENT, "--storage-path", str(folder / f"ray{n}"),
             "--num-samples", "3", "--scheduler", "none", "--max-concurrent-trials", "1", "--windows", "2",
             "--window-s", "0.3", "--seed", str(n), "--price-per-hour", str(0.357 * (n + 1)), *shared_ray.flags],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    sweeps = [start(n) for n in range(2)]
    outputs = [sweep.communicate(timeout=600)[0] for sweep in sweeps]
    for n, output in enumerate(outputs):
        if sweeps[n].returncode != 0 and RAY_CONNECT_CRASH in output:
            sweeps[n] = start(n)  # once more, alone: Ray's crash, not the store's
            outputs[n] = f"{output[-2000:]}\n[started again]\n{sweeps[n].communicate(timeout=600)[0]}"
    # Each output's head too: a driver that died in Ray's C++ says why first, then a long stack.
    assert [sweep.returncode for sweep in sweeps] == [0, 0], "\n\n".join(
        o if len(o) < 5000 else f"{o[:2000]}\n[...]\n{o[-3000:]}" for o in outputs)
    parents, _ = mlflow_runs(store.tracking_uri, EXPERIMENT)
    assert len(parents) == 2, [p.info.run_name for p in parents]
    return [p.info.run_name for p in parents]


def run_tool(store, *args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSFILE": store.credentials}
    env.pop("MLFLOW_TRACKING_URI", None)  # the flag, not the environment, names the server
    return subprocess.run([ACCELSWEEP, *args, "--tracking-uri", store.tracking_uri], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_report_rebuilds_a_sweeps_report_from_the_server_and_logs_it_there(store, two_sweeps, tmp_path):
    from mlflow.tracking import MlflowClient

    name = two_sweeps[0]
    done = run_tool(store, "report", name, "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"logged" in done.stdout and name in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "report.md").exists()
    # Read from PostgreSQL: the report's study section names the study it read.
    parents, _ = mlflow_runs(store.tracking_uri, EXPERIMENT)
    parent = next(p for p in parents if p.info.run_name == name)
    assert parent.data.tags["optuna_study"] in (tmp_path / "report" / "report.md").read_text()
    # Logged on the server, its artifacts served from the store's folder (none written here).
    logged = {a.path for a in MlflowClient(store.tracking_uri).list_artifacts(parent.info.run_id)}
    assert "report.md" in logged, logged
    assert not (tmp_path / "mlartifacts").exists() and not (tmp_path / "mlflow.db").exists()
    _, password = store.mlflow_login()
    assert password not in done.stdout + done.stderr


def test_compare_sets_two_sweeps_side_by_side_from_the_server_and_logs_the_comparison(store, two_sweeps,
                                                                                     tmp_path):
    done = run_tool(store, "compare", *two_sweeps, "--out", str(tmp_path / "compare"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert all(name in done.stdout for name in two_sweeps), done.stdout[-3000:]
    assert "cheaper" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "compare" / "comparison.md").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store.tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    comparisons = client.search_runs([experiment.experiment_id], "tags.kind = 'comparison'")
    assert len(comparisons) == 1, [r.info.run_name for r in comparisons]
    assert "comparison.md" in {a.path for a in client.list_artifacts(comparisons[0].info.run_id)}
    assert not (tmp_path / "mlflow.db").exists()

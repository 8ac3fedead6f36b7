"""A team's record (sweeps/driver/ops/team_store.py): PostgreSQL started from the machine's own
server programs, an MLflow server on it serving the artifacts, the studies in the same
server; a sweep recorded there in full, its password nowhere, the connections bounded."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from accelsweep.sweeps.driver.ops import team_store
from tests.conftest import ACCELSWEEP
from tests.team_store_fixture import needs_postgresql, store  # noqa: F401 - the module's store

pytestmark = needs_postgresql


def test_a_folder_the_server_user_cannot_reach_is_refused_by_name(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root starts the server as another user")
    os.chmod(tmp_path.parent, 0o700)
    with pytest.raises(Exception, match="--dir must be a folder the postgres user can reach"):
        team_store.up(str(tmp_path / "store"), say=lambda line: None)
    assert not os.path.exists(tmp_path / "store")


def test_a_host_that_is_not_an_ip_address_is_refused_by_name(tmp_path):
    with pytest.raises(Exception, match="--host must be an IP address of this machine .*; got 'localhost'"):
        team_store.up(str(tmp_path / "store"), host="localhost", say=lambda line: None)
    assert not os.path.exists(tmp_path / "store")


def test_a_store_bound_beyond_loopback_takes_its_subnets_and_only_then(tmp_path):
    initdb_wrote = "local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n"
    (tmp_path / "pg_hba.conf").write_text(initdb_wrote)
    team_store.allow_clients(str(tmp_path), "10.77.0.254")
    team_store.allow_clients(str(tmp_path), "10.77.0.254")  # each start: once, not once more
    lines = (tmp_path / "pg_hba.conf").read_text().splitlines()
    assert lines.count(team_store.HBA_SAMENET) == 1 and lines[:2] == initdb_wrote.splitlines()
    team_store.allow_clients(str(tmp_path), "127.0.0.1")  # back on loopback: loopback only again
    assert (tmp_path / "pg_hba.conf").read_text() == initdb_wrote


@pytest.mark.slow  # starts a store (20-60 s): not for the quick lane
def test_the_store_is_password_protected_and_its_credentials_private(store):
    import psycopg

    assert oct(os.stat(store.credentials).st_mode & 0o777) == "0o600"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host=store.host, port=store.pg_port, user=team_store.ROLE, dbname="mlflow",
                        password="not-it", connect_timeout=5)
    assert team_store.connections(store) >= 0  # with the credentials file: it connects


@pytest.mark.slow
def test_a_sweep_records_everything_on_the_team_store_with_bounded_connections(store, tmp_path, monkeypatch,
                                                                             shared_ray):
    """A sweep with --tracking-uri on the server and --study-storage on PostgreSQL: every
    trial a run under its parent, its report served from the store's artifact folder (not
    the sweep's), its study in PostgreSQL, the password in none of it, and the store's
    client connections within the bound the server's pool and the driver set."""
    from mlflow.tracking import MlflowClient
    import optuna

    from accelsweep.sweeps.driver.record.optuna_study import DRIVER_CONNECTIONS

    password = open(store.credentials).read().strip().rsplit(":", 1)[1]
    env = {**os.environ, "PGPASSFILE": store.credentials, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    peak, done_flag = [0], threading.Event()

    def watch():
        while not done_flag.wait(0.5):
            try:
                peak[0] = max(peak[0], team_store.connections(store))
            except Exception:  # noqa: BLE001 - a busy moment; the next read counts
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done = subprocess.run([ACCELSWEEP, "run", "neuron_vit", "--smoke", "--num-samples", "3",
                               "--tracking-uri", store.tracking_uri, "--study-storage", store.study_storage,
                               "--experiment", "team", *shared_ray.flags],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        done_flag.set()
        watcher.join(timeout=10)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(store.tracking_uri)
    experiment = client.get_experiment_by_name("team")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(trials) >= 3
    assert all(t.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for t in trials)
    assert all(t.info.status != "RUNNING" for t in runs)
    # Artifacts went to the server: its folder has the report, the sweep's folder none.
    assert any(name.startswith("report") for _, _, files in os.walk(os.path.join(store.folder, "artifacts"))
               for name in files)
    assert not os.path.exists(tmp_path / "mlartifacts")
    monkeypatch.setenv("PGPASSFILE", store.credentials)  # as a team member reading the studies
    study_name = parents[0].data.tags["optuna_study"]
    study = optuna.load_study(study_name=study_name, storage=store.study_storage)
    searched = [t for t in trials if t.data.tags.get("phase") != "confirmation" and t.data.tags.get("status") != "reused"]
    # A trial the rule stopped early is PRUNED in the study; each state must match its run's status.
    states = {"finished": "COMPLETE", "stopped early": "PRUNED", "rejected": "PRUNED"}
    by_run = {t.user_attrs["mlflow_run_id"]: t.state.name for t in study.trials}
    assert by_run == {t.info.run_id: states[t.data.tags["status"]] for t in searched}
    # The password: nowhere in what the sweep printed, nor in its record.
    recorded = [done.stdout, done.stderr, *(str(r.data.params) + str(r.data.tags) for r in runs)]
    assert not any(password in text for text in recorded)
    # Bounded: the server's pools and the driver's study storage.
    assert 0 < peak[0] <= team_store.SERVER_CONNECTIONS + DRIVER_CONNECTIONS, peak[0]

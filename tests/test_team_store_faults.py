"""A team store (sweeps/driver/ops/team_store.py) behind basic auth, and what its faults do to
a sweep writing to it: the MLflow server restarted mid-sweep, PostgreSQL restarted
mid-sweep, the database refusing new connections (its max_connections taken by another
client). Each fault is real: the store's own server processes stopped and started again,
a client holding every connection PostgreSQL gives a non-superuser.

The sweeps are tests/fault_sweep.py (sleeping trials, one at a time) on the store's
server (``--tracking-uri http://...``) and its study database (``--study-storage
postgresql://...``), logged in through MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD
(tests/team_store_fixture.py). After each fault the record must be complete: one FINISHED
run per trial under one FINISHED parent, nothing RUNNING, and one study trial per run.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from accelsweep.sweeps.driver.ops import team_store
from tests.conftest import REPO
from tests.team_store_fixture import environment, needs_postgresql, store  # noqa: F401 - the module's store
from tests.test_sweep_e2e import mlflow_runs

pytestmark = [needs_postgresql, pytest.mark.slow]  # a store starts in 30-60 s: not for the quick lane

TRIALS = 4
SWEEP_S = 400  # two cores shared with other test sessions start a sweep slowly
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


def status_of(url: str, login: tuple[str, str] = None) -> int:
    request = urllib.request.Request(url)
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


# --- basic auth -------------------------------------------------------------------------

def test_the_server_answers_only_its_user_and_keeps_the_password_off_command_lines(store):
    user, password = store.mlflow_login()
    assert status_of(store.tracking_uri + SEARCH) == 401
    assert status_of(store.tracking_uri + SEARCH, (user, "not-it")) == 401
    assert status_of(store.tracking_uri + SEARCH, (user, password)) == 200
    assert status_of(store.tracking_uri + "/health") == 200  # what `team-store status` reads
    assert oct(os.stat(store.mlflow_credentials).st_mode & 0o777) == "0o600"
    assert password not in open(os.path.join(store.folder, "basic_auth.ini")).read()
    # Neither the server nor its workers have it on their command line (ps shows those).
    server_pid = team_store.read(store.folder).mlflow_pid  # the one running now (a test may have restarted it)
    group = [pid for pid in os.listdir("/proc") if pid.isdigit() and _group_of(int(pid)) == server_pid]
    assert len(group) >= 2, group  # the server and its workers
    for pid in group:
        with contextlib.suppress(OSError):
            assert password not in open(f"/proc/{pid}/cmdline").read()


def _group_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def test_a_check_of_the_store_logs_in_from_mlflows_credentials_file(store, tmp_path, monkeypatch):
    """The store's mlflow-credentials, copied to ~/.mlflow/credentials as `team-store up`
    says, is what the check before a sweep logs in with when no variable is set."""
    from accelsweep.sweeps.driver.define.store_checks import check_tracking_store
    from accelsweep.trainables.errors import ConfigError

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="refused our credentials"):
        check_tracking_store(store.tracking_uri)
    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(open(store.mlflow_credentials).read())
    check_tracking_store(store.tracking_uri)  # no error: it logged in


@pytest.mark.slow
def test_no_password_of_the_store_reaches_a_file_an_mlflow_field_or_the_output(store, tmp_path, shared_ray):
    """A sweep on the store with both passwords in play: the MLflow server's from the
    environment, the database's in the --study-storage URI itself
    (postgresql://accelsweep:PASSWORD@...). Neither is in its output, in any file under its
    storage path (Tune's state included), in the server's log or artifacts, nor in any
    MLflow run field."""
    _, mlflow_password = store.mlflow_login()
    database_password = open(store.credentials).read().strip().rsplit(":", 1)[1]
    study_storage = store.study_storage.replace(f"{team_store.ROLE}@", f"{team_store.ROLE}:{database_password}@")
    env = {k: v for k, v in os.environ.items() if k != "PGPASSFILE"}  # the URI's password, not the file's
    done = subprocess.run(sweep_command(store, tmp_path, "leak", "--study-storage", study_storage, *shared_ray.flags), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=SWEEP_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = check_complete_record(store, "leak")
    secrets = {"the MLflow password": mlflow_password, "the database password": database_password}
    texts = {"stdout": done.stdout, "stderr": done.stderr}
    texts.update({f"run {r.info.run_name}": repr((r.data.params, r.data.tags, r.info)) for r in runs})
    for name, value in secrets.items():
        for where, text in texts.items():
            assert value not in text, f"{name} in {where}"
    private = {store.credentials, store.mlflow_credentials}  # where they belong
    written = [os.path.join(d, f) for top in (tmp_path, store.folder) for d, _, files in os.walk(top) for f in files]
    assert any(path.endswith("tuner.pkl") for path in written), "no Tune state was searched"
    assert any(path.endswith("mlflow.log") for path in written)
    for path in written:
        if path in private or os.sep + "pgdata" + os.sep in path:
            continue  # PostgreSQL's files: the MLflow fields were read through the API above
        with contextlib.suppress(OSError), open(path, "rb") as record:
            content = record.read()
        for name, value in secrets.items():
            assert value.encode() not in content, f"{name} in {path}"


# --- faults of the shared store ---------------------------------------------------------

def sweep_command(store, tmp_path, experiment: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", store.tracking_uri,
            "--study-storage", store.study_storage, "--experiment", experiment,
            "--storage-path", str(tmp_path / "ray"), "--num-samples", str(TRIALS), "--scheduler", "none",
            "--max-concurrent-trials", "1", "--windows", "3", "--window-s", "0.4", "--no-report", *extra]


def sweep_env(store, markers) -> dict[str, str]:
    return {**os.environ, "PGPASSFILE": store.credentials, "FAULT_SWEEP_MARKERS": str(markers),
            "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}


def ends(markers) -> int:
    return sum(1 for name in os.listdir(markers) if name.startswith("end-"))


def run_with_fault(store, tmp_path, experiment: str, fault, *extra: str) -> str:
    """The sweep, with ``fault()`` run once its first trial has ended (so that the driver
    holds connections, and the fault lands mid-sweep); its output, after it ended with 0."""
    markers, log = tmp_path / "markers", tmp_path / "sweep.log"
    markers.mkdir()
    with open(log, "w") as out:
        sweep = subprocess.Popen(sweep_command(store, tmp_path, experiment, *extra), cwd=REPO,
                                 env=sweep_env(store, markers), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SWEEP_S
        while ends(markers) < 1:
            assert sweep.poll() is None, f"the sweep ended first:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        assert ends(markers) < TRIALS, "the last trial ended before the fault: not mid-sweep"
        fault()  # it may last past the last trial (a server's start takes 10-30 s here)
        assert sweep.wait(timeout=SWEEP_S) == 0, log.read_text()[-6000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    output = log.read_text()
    assert "Traceback" not in output, output[-6000:]
    return output


def check_complete_record(store, experiment: str) -> list:
    """One FINISHED parent, one FINISHED run per trial under it, nothing RUNNING; the
    sweep's study holds one trial per run, each COMPLETE. The runs."""
    import optuna

    parents, children = mlflow_runs(store.tracking_uri, experiment)
    assert [p.info.status for p in parents] == ["FINISHED"], [(p.info.run_name, p.info.status) for p in parents]
    numbers = [c.data.tags["trial_number"] for c in children]
    assert len(numbers) == len(set(numbers)), f"a trial has two runs: {sorted(numbers)}"
    ran = [c for c in children if c.data.tags.get("status") != "reused"]
    assert len(ran) == TRIALS, [(c.info.run_name, c.data.tags.get("status")) for c in children]
    for child in children:
        assert child.info.status == "FINISHED", (child.info.run_name, child.info.status, child.data.tags)
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    with environment(PGPASSFILE=store.credentials):
        study = optuna.load_study(study_name=parents[0].data.tags["optuna_study"],
                                  storage=store.study_storage)
        by_run = {t.user_attrs["mlflow_run_id"]: t.state.name for t in study.trials}
    assert by_run == {c.info.run_id: "COMPLETE" for c in ran}
    return [*parents, *children]


@pytest.mark.slow
def test_the_mlflow_server_restarted_mid_sweep_loses_nothing(store, tmp_path, shared_ray):
    started = time.monotonic()

    def restart():
        team_store.restart_mlflow(team_store.read(store.folder), down_s=2.0, say=lambda line: None)

    output = run_with_fault(store, tmp_path, "mlflow-restart", restart, *shared_ray.flags)
    check_complete_record(store, "mlflow-restart")
    print(f"mlflow server restarted mid-sweep: {time.monotonic() - started:.0f} s; said:\n"
          + "\n".join(line for line in output.splitlines() if "answer" in line))


@pytest.mark.slow
def test_postgresql_restarted_mid_sweep_loses_nothing(store, tmp_path, shared_ray):
    started = time.monotonic()

    def restart():
        team_store.restart_postgres(store, down_s=2.0, say=lambda line: None)

    output = run_with_fault(store, tmp_path, "postgres-restart", restart, *shared_ray.flags)
    assert "could not be written" not in output, output[-6000:]  # the study was not given up
    check_complete_record(store, "postgres-restart")
    print(f"postgresql restarted mid-sweep: {time.monotonic() - started:.0f} s; said:\n"
          + "\n".join(line for line in output.splitlines() if "answer" in line))


def take_every_connection(store) -> list:
    """What a greedy client does: connections to the store until PostgreSQL refuses one
    ("too many clients"); they are held until closed."""
    import psycopg

    held = []
    while True:
        try:
            held.append(psycopg.connect(host=store.host, port=store.pg_port, user=team_store.ROLE, dbname="optuna",
                                        passfile=store.credentials, connect_timeout=10))
        except psycopg.OperationalError as error:
            assert "too many clients" in str(error) or "reserved" in str(error), error
            return held
        assert len(held) <= team_store.MAX_CONNECTIONS, "PostgreSQL never refused a connection"


def end_the_sweeps_connections(store, held: list) -> int:
    """End every other connection of the store's role (the sweep driver's to its study, the
    MLflow server's to its store), as a proxy's idle timeout or a failover does, so that
    each must connect again; a role may end its own backends. How many were ended."""
    mine = [connection.info.backend_pid for connection in held]
    ended = held[0].execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %s "
                            "AND backend_type = 'client backend' AND NOT (pid = ANY(%s))",
                            (team_store.ROLE, mine)).fetchone()[0]
    return int(ended)


@pytest.mark.slow
def test_a_database_refusing_new_connections_mid_sweep_loses_nothing(store, tmp_path, shared_ray):
    """Another client takes every connection PostgreSQL gives a non-superuser while the
    sweep runs, the connections the sweep's driver and the MLflow server held end, and for
    10 s every new one is refused; then the client lets go. The sweep finishes with its
    record complete."""
    started, held, ended = time.monotonic(), [], []

    def exhaust():
        held.extend(take_every_connection(store))
        ended.append(end_the_sweeps_connections(store, held))
        held.extend(take_every_connection(store))  # the slots those freed, before the sweep takes them
        threading.Timer(10.0, lambda: [connection.close() for connection in held]).start()

    try:
        output = run_with_fault(store, tmp_path, "no-connections", exhaust, *shared_ray.flags)
    finally:
        for connection in held:
            connection.close()
    assert len(held) > 50 and ended[0] > 0, (len(held), ended)
    check_complete_record(store, "no-connections")
    print(f"max_connections reached mid-sweep ({len(held)} taken by another client, {ended[0]} of the sweep's "
          f"and the server's ended): {time.monotonic() - started:.0f} s; said:\n"
          + "\n".join(line for line in output.splitlines() if "answer" in line))


@pytest.mark.slow
def test_a_database_refusing_new_connections_at_the_start_is_said_in_seconds(store, tmp_path):
    """Every connection taken before the sweep starts: refused before anything runs, exit
    status 2, the field named and PostgreSQL's reason given; no traceback."""
    held = take_every_connection(store)
    try:
        started = time.monotonic()
        done = subprocess.run(sweep_command(store, tmp_path, "refused"), cwd=REPO,
                              env=sweep_env(store, tmp_path), capture_output=True, text=True, timeout=SWEEP_S)
        took = time.monotonic() - started
    finally:
        for connection in held:
            connection.close()
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    # Whichever check meets the full database first says so: the MLflow server, itself out
    # of connections, answers 503 (seen in CI) or waits on its pool past the check's 5 s
    # (seen here), or the study's database refuses with PostgreSQL's reason: "too many
    # clients already", or, where only the superuser's reserved slots are left, "remaining
    # connection slots are reserved".
    if done.stderr.startswith("error: tracking_uri"):
        assert ("HTTP 503" in done.stderr and "backend store does not answer" in done.stderr) or \
            "ReadTimeout" in done.stderr, done.stderr[-3000:]
    else:
        assert "study_storage" in done.stderr, done.stderr[-3000:]
        assert "too many clients" in done.stderr or "connection slots are reserved" in done.stderr, done.stderr[-3000:]
    print(f"refused at the start in {took:.1f} s")


@pytest.mark.slow
def test_postgresql_down_past_the_wait_stops_the_sweep_and_resume_completes_it(store, tmp_path, shared_ray):
    """PostgreSQL stopped mid-sweep and not back within --tracking-wait-s (3 s): the sweep
    stops by itself (exit 75) saying why and to --resume, nothing of it left RUNNING once
    the database is back and --resume has run, and the record complete."""
    started, markers = time.monotonic(), tmp_path / "markers"
    markers.mkdir()
    command = sweep_command(store, tmp_path, "postgres-down", "--tracking-wait-s", "3", *shared_ray.flags)
    with open(tmp_path / "sweep.log", "w") as out:
        sweep = subprocess.Popen(command, cwd=REPO, env=sweep_env(store, markers), stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SWEEP_S
        while ends(markers) < 1:
            assert sweep.poll() is None and time.monotonic() < deadline, (tmp_path / "sweep.log").read_text()[-4000:]
            time.sleep(0.1)
        team_store.stop_postgres(store.folder)
        status = sweep.wait(timeout=SWEEP_S)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        team_store.start_postgres(store, say=lambda line: None)
    output = (tmp_path / "sweep.log").read_text()
    assert status == 75, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert "did not answer for 3 s" in output and "--resume" in output, output[-6000:]
    assert ends(markers) < TRIALS, "the sweep ran to its end: it did not stop"

    resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=sweep_env(store, markers), capture_output=True,
                             text=True, timeout=SWEEP_S)
    said = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, said[-6000:]
    assert "Traceback" not in said, said[-6000:]
    check_complete_record(store, "postgres-down")
    print(f"postgresql down past the wait, then --resume: {time.monotonic() - started:.0f} s; the stop said:\n"
          + "\n".join(line for line in output.splitlines() if "answer" in line or "resume" in line))


def test_a_login_costs_the_server_little(store):
    """The server checks the password on every request: MLflow's default hash (scrypt)
    took 300 ms a request on this loaded machine; the admin's is one PBKDF2 round
    (team_store.ADMIN_HASH_METHOD), and the server still takes that login."""
    login = store.mlflow_login()
    started = time.monotonic()
    for _ in range(20):
        assert status_of(store.tracking_uri + "/health") == 200
    health_s = time.monotonic() - started
    started = time.monotonic()
    for _ in range(20):
        assert status_of(store.tracking_uri + SEARCH, login) == 200
    search_s = time.monotonic() - started
    print(f"20 requests: /health {health_s:.2f} s, logged-in search {search_s:.2f} s")
    import sqlite3

    with contextlib.closing(sqlite3.connect(os.path.join(store.folder, "auth.db"))) as database:
        (stored,) = database.execute("SELECT password_hash FROM users WHERE username = ?",
                                     (team_store.MLFLOW_USER,)).fetchone()
    assert stored.startswith(team_store.ADMIN_HASH_METHOD + "$"), stored.split("$")[0]


OPEN_STUDY_STORAGE = """
import sys, time
from accelsweep.sweeps.driver.record.optuna_study import shared_storage
url, start_at = sys.argv[1], float(sys.argv[2])
while time.time() < start_at:
    time.sleep(0.001)
shared_storage(url).get_all_studies()
"""


def test_drivers_opening_a_new_study_database_at_the_same_instant_all_open_it(store):
    """Four drivers open a study database with no tables yet at one instant (four sweeps
    started together on a new team store): Optuna's CREATE TABLEs race, and the losers'
    "duplicate key value violates unique constraint pg_type_typname_nsp_index" ended 3 of 4
    sweeps here. Each must open it. (A schema of its own stands for a new database: the
    role may not create databases.)"""
    import uuid

    import psycopg

    schema = f"race_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(host=store.host, port=store.pg_port, user=team_store.ROLE, dbname="optuna",
                         passfile=store.credentials, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    url = f"{store.study_storage}?options=-csearch_path%3D{schema}"
    start_at = time.time() + 8  # after four interpreters have imported Optuna, on a busy machine
    drivers = [subprocess.Popen([sys.executable, "-c", OPEN_STUDY_STORAGE, url, str(start_at)], cwd=REPO,
                                env={**os.environ, "PGPASSFILE": store.credentials}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    outputs = [driver.communicate(timeout=120)[0] for driver in drivers]
    assert [driver.returncode for driver in drivers] == [0] * 4, "\n\n".join(o[-2000:] for o in outputs)

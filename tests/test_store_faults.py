"""Where a sweep writes, shared or broken: the MLflow store and Optuna study opened by
several processes at once (sweeps/driver/record/sqlite_store.py), tracking stores that cannot take
a sweep's writes (sweeps/driver/define/store_checks.py), and a storage path that is read-only,
full, or fills up mid-sweep (store_checks.py, storage_watch.py).

Every fault is injected for real: processes started at one instant on one new store, a
plain MLflow reader polling it, HTTP servers that refuse, answer 404 or never answer, a
read-only mount, a 1 MiB tmpfs, a tmpfs filled while a trial runs. Mounting needs root
(CI runs as root); without it the mount cases skip, saying so, and the read-only case
uses a chmod-ed folder (which root would ignore)."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import logging
import os
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from accelsweep.sweeps.driver.define.store_checks import MIN_FREE_BYTES, PROBE_BOUND_S, check_tracking_store
from accelsweep.trainables.errors import ConfigError
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs

TRIALS = 3


def sweep_command(tracking_uri, storage, *extra):
    return [sys.executable, "-m", "tests.fault_sweep", "--num-samples", str(TRIALS), "--scheduler", "none",
            "--max-concurrent-trials", "1", "--windows", "2", "--window-s", "0.3",
            "--tracking-uri", tracking_uri, "--storage-path", str(storage), *extra]


def sweep_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(extra)
    return env


def run_sweep_command(command, timeout=300, **env):
    return subprocess.run(command, cwd=REPO, env=sweep_env(**env), capture_output=True, text=True, timeout=timeout)


def said(done) -> str:
    return done.stdout[-3000:] + done.stderr[-3000:]


def assert_no_traceback(done):
    assert "Traceback" not in done.stdout + done.stderr, said(done)


# --- one new store, opened by several processes at once ---------------------------------

OPENER = textwrap.dedent("""
    import os, sys, time
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    uri, start_at, kind = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    import mlflow, optuna
    from mlflow.tracking import MlflowClient
    from accelsweep.sweeps.driver.record.sqlite_store import create_optuna_storage, open_experiment
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    while time.time() < start_at:
        time.sleep(0.001)
    if kind == "plain":  # what mlflow ui or a user's script does: MLflow's own creation, in place
        MlflowClient(uri).search_experiments()
    else:
        open_experiment(uri, kind, None)
        study_url = uri.replace(".db", ".optuna.db")
        create_optuna_storage(study_url)
        optuna.create_study(storage=study_url, study_name=kind)
    print("opened", kind)
""")


@pytest.mark.slow
def test_processes_opening_one_new_store_at_the_same_instant_all_open_it(tmp_path):
    """Three processes at one instant on one new path (two of ours, one plain MLflow
    client): without the build-aside-and-link, one in five such tries left a database
    half-migrated for good, and most had a process die (sqlite_store.py)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    uri = f"sqlite:///{tmp_path}/m.db"
    start_at = time.time() + 8  # after every process's imports (about 3 s here, more under load)
    openers = [subprocess.Popen([sys.executable, "-c", OPENER, uri, str(start_at), kind], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for kind in ("exp-a", "exp-b", "plain")]
    outputs = [opener.communicate(timeout=240)[0] for opener in openers]
    for opener, output in zip(openers, outputs):
        assert opener.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    with sqlite3.connect(tmp_path / "m.db") as database:
        tables = {row[0] for row in database.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        revision = database.execute("SELECT version_num FROM alembic_version").fetchall()
    assert revision == [(_get_latest_schema_revision(),)]
    assert not [table for table in tables if table.startswith("_alembic_tmp_")]
    import optuna

    studies = optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/m.optuna.db")
    assert sorted(s.study_name for s in studies) == ["exp-a", "exp-b"]
    assert not [name for name in os.listdir(tmp_path) if ".creating-" in name]  # no temporary build left


READER = textwrap.dedent("""
    import os, sys, time
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    import mlflow
    uri, stop_file = sys.argv[1], sys.argv[2]
    mlflow.set_tracking_uri(uri)
    polls = errors = 0
    while not os.path.exists(stop_file):
        try:
            mlflow.search_runs(search_all_experiments=True)
            polls += 1
        except Exception as error:
            errors += 1
            print("reader error:", type(error).__name__, error, flush=True)
        time.sleep(0.2)
    print(f"reader: {polls} polls, {errors} errors")
""")


@pytest.mark.slow
def test_two_sweeps_started_together_on_one_new_store_both_finish_beside_a_polling_reader(tmp_path, shared_ray):
    """The issue's case: two sweeps started at the same instant on one new sqlite store
    (each its own experiment and storage path), and a script polling mlflow.search_runs
    on the same path from before they start. Both finish with all their runs, each with
    its own Optuna study, and the reader never fails."""
    uri, stop_file = f"sqlite:///{tmp_path}/m.db", tmp_path / "stop-reading"
    reader = subprocess.Popen([sys.executable, "-c", READER, uri, str(stop_file)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sweeps = {name: subprocess.Popen(sweep_command(uri, tmp_path / f"ray-{name}", "--experiment", name, *shared_ray.flags), cwd=REPO,
                                     env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for name in ("A", "B")}
    try:
        outputs = {name: sweep.communicate(timeout=400)[0] for name, sweep in sweeps.items()}
    finally:
        stop_file.touch()
        for sweep in sweeps.values():
            if sweep.poll() is None:
                sweep.kill()
        reader_output = reader.communicate(timeout=60)[0]
    for name, sweep in sweeps.items():
        assert sweep.returncode == 0, outputs[name][-4000:]
        assert "Traceback" not in outputs[name], outputs[name][-4000:]
    assert reader.returncode == 0 and "reader error" not in reader_output, reader_output[-3000:]
    assert ", 0 errors" in reader_output and not reader_output.startswith("reader: 0 polls"), reader_output

    import optuna

    studies = set()
    for name in ("A", "B"):
        parents, children = mlflow_runs(uri, name)
        assert [p.info.status for p in parents] == ["FINISHED"], name
        assert all(c.info.status == "FINISHED" for c in children), name
        assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
        measured = [c for c in children if c.data.tags.get("status") == "finished"]
        assert len(measured) == TRIALS, (name, [c.data.tags.get("status") for c in children])
        assert parents[0].data.metrics["trials"] == len(children)
        tags = parents[0].data.tags
        study = optuna.load_study(study_name=tags["optuna_study"], storage=tags["optuna_storage"])
        assert len(study.trials) == TRIALS
        studies.add(tags["optuna_study"])
    assert len(studies) == 2  # one study each, even when both started in the same second


def test_sweeps_of_one_name_in_one_second_get_their_own_study_and_experiment_folder(tmp_path):
    from accelsweep.sweeps.driver.define.store_checks import claim_experiment_dir
    from accelsweep.sweeps.driver.record.optuna_study import SweepStudy

    url = f"sqlite:///{tmp_path}/s.optuna.db"
    first, second = (SweepStudy(url, "sweep-20260101-000000", [("x", "max")], {}) for _ in range(2))
    assert (first.claim(), second.claim()) == ("sweep-20260101-000000", "sweep-20260101-000000-2")
    assert claim_experiment_dir(str(tmp_path / "ray"), "sweep-1") == str(tmp_path / "ray" / "sweep-1")
    assert claim_experiment_dir(str(tmp_path / "ray"), "sweep-1") == str(tmp_path / "ray" / "sweep-1-2")


def test_two_drivers_on_one_host_claim_names_of_their_own_across_their_storage_paths(tmp_path):
    """Each user's own storage path, one cluster head: Tune stages both drivers' files in
    the head's Ray session under the experiment's name, so the name is claimed there too."""
    from accelsweep.sweeps.driver.define.store_checks import claim_experiment_dir

    names = str(tmp_path / "session" / "accelsweep-experiments")
    alice = claim_experiment_dir(str(tmp_path / "alice"), "sweep-1", names)
    bob = claim_experiment_dir(str(tmp_path / "bob"), "sweep-1", names)
    assert (alice, bob) == (str(tmp_path / "alice" / "sweep-1"), str(tmp_path / "bob" / "sweep-1-2"))
    assert not (tmp_path / "bob" / "sweep-1").exists()  # claimed on bob's path, given back when taken on the host
    assert sorted(os.listdir(names)) == ["sweep-1", "sweep-1-2"]


# --- tracking stores that cannot take a sweep's writes ----------------------------------

class _Answering(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"{}"

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server(status: int, body: bytes = b"{}"):
    handler = type("Handler", (_Answering,), {"status": status, "body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_listener():
    """A port whose kernel completes TCP handshakes (the listen backlog) but where nothing
    ever reads or answers: a hung server, or a firewall that swallows packets late."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    with listener:
        yield listener.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _bad_store(kind, tmp_path, stack):
    """(tracking URI, a part of the message that says what is wrong) for ``kind``."""
    if kind == "a directory":
        return f"sqlite:///{tmp_path}", f"{tmp_path} is a folder; name a file in it"
    if kind == "a path under /proc":
        return "sqlite:////proc/accelsweep.db", "/proc takes no new file"
    if kind == "a file that is not a database":
        (tmp_path / "m.db").write_text("not a database, a text file\n" * 20)
        return f"sqlite:///{tmp_path}/m.db", "is not a sqlite database (it starts with b'not a database, '"
    if kind == "a read-only database file":
        (tmp_path / "ro").mkdir()
        sqlite3.connect(tmp_path / "ro" / "m.db").execute("CREATE TABLE t (x)").connection.close()
        mount = stack.enter_context(mounted(tmp_path / "ro", "ro,remount,bind"))
        return f"sqlite:///{mount}/m.db", "cannot be opened for reading and writing: Read-only file system"
    if kind == "nothing listening (http)":
        return f"http://127.0.0.1:{closed_port()}/", "ConnectionError: connection refused"
    if kind == "a server that never answers (http)":
        return f"http://127.0.0.1:{stack.enter_context(silent_listener())}", "Nothing answered at"
    if kind == "not an MLflow server (http 404)":
        return stack.enter_context(http_server(404)), "It answered HTTP 404 for"
    if kind == "credentials refused (http 401)":
        return stack.enter_context(http_server(401)), "The server refused our credentials (HTTP 401"
    if kind == "nothing listening (postgresql)":
        port = closed_port()
        return f"postgresql://user:hunter2pw@127.0.0.1:{port}/mlflow", f"Nothing answers at 127.0.0.1:{port}"
    if kind == "a database server that does not answer (postgresql)":
        port = stack.enter_context(silent_listener())
        # SQLAlchemy 2.1 takes psycopg (3) for postgresql://
        expected = ("The database did not accept a connection" if importlib.util.find_spec("psycopg")
                    else "Its driver is not installed here")
        return f"postgresql://user:hunter2pw@127.0.0.1:{port}/mlflow", expected
    if kind == "a dangling symlink":
        (tmp_path / "m.db").symlink_to(tmp_path / "gone" / "m.db")
        return f"sqlite:///{tmp_path}/m.db", f"is a symbolic link, but it points to '{tmp_path}/gone/m.db', which"
    if kind == "a loop of symlinks":
        (tmp_path / "m.db").symlink_to(tmp_path / "n.db")
        (tmp_path / "n.db").symlink_to(tmp_path / "m.db")
        return f"sqlite:///{tmp_path}/m.db", "is a symbolic link, but it is a loop of links"
    if kind == "a database another process holds locked":
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "m.db")], stdout=subprocess.PIPE,
                                  text=True)
        stack.callback(holder.wait)
        stack.callback(holder.kill)
        assert holder.stdout.readline().strip() == "locked"
        return (f"sqlite:///{tmp_path}/m.db",
                f"is locked: another process has held its write lock for 5 s (pid {holder.pid} (")
    raise AssertionError(kind)


# A process that keeps a sqlite database's write lock (an open transaction it never ends).
HOLD_LOCK = """
import sqlite3, sys, time
database = sqlite3.connect(sys.argv[1], isolation_level=None)
database.execute("create table if not exists t (x)")
database.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(120)
"""

BAD_STORES = ["a directory", "a path under /proc", "a file that is not a database", "a read-only database file",
              "nothing listening (http)", "a server that never answers (http)", "not an MLflow server (http 404)",
              "credentials refused (http 401)", "nothing listening (postgresql)",
              "a database server that does not answer (postgresql)", "a dangling symlink", "a loop of symlinks",
              "a database another process holds locked"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BAD_STORES)
def test_a_tracking_store_that_cannot_take_the_sweeps_writes_is_refused_in_seconds(kind, tmp_path):
    with contextlib.ExitStack() as stack:
        uri, expected = _bad_store(kind, tmp_path, stack)
        started = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            check_tracking_store(uri)
        took = time.monotonic() - started
    message = str(refused.value)
    assert refused.value.field == "tracking_uri" and message.startswith("tracking_uri must be "), message
    assert expected in message, message
    assert "hunter2pw" not in message  # a URI password is never shown
    # Bounded by construction (PROBE_BOUND_S around anything that waits on the network),
    # not by this machine's speed: MLflow's own client took 115-260 s for these.
    assert took < PROBE_BOUND_S + 2, f"took {took:.1f} s"


def test_a_store_locked_for_a_moment_is_not_refused(tmp_path):
    """A writer holds the lock for milliseconds: the check waits for it, as sqlite would."""
    store = tmp_path / "mlflow.db"
    database = sqlite3.connect(store, isolation_level=None, check_same_thread=False)
    database.execute("create table experiments (x)")
    database.execute("create table runs (x)")
    database.execute("BEGIN EXCLUSIVE")
    threading.Timer(0.5, lambda: database.execute("COMMIT")).start()
    assert check_tracking_store(f"sqlite:///{store}") is None
    database.close()


def test_a_store_that_answers_is_accepted_and_one_that_cannot_be_checked_is_said():
    with http_server(200, b'{"experiments": []}') as address:
        assert check_tracking_store(address) is None
    assert "not checked before the sweep" in check_tracking_store("databricks")


# The issue's four, and issue 36's three that took 42-108 s of sqlite's own retries.
CLI_STORES = ["a directory", "a path under /proc", "a file that is not a database", "nothing listening (http)",
              "a dangling symlink", "a loop of symlinks", "a database another process holds locked"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLI_STORES)
def test_the_command_line_refuses_each_bad_store_with_exit_status_2(kind, tmp_path):
    """The issue's four, end to end: exit status 2, the message naming tracking_uri, no
    traceback, nothing written."""
    storage = tmp_path / "ray"
    with contextlib.ExitStack() as stack:
        uri, expected = _bad_store(kind, tmp_path, stack)
        started = time.monotonic()
        done = run_sweep_command(sweep_command(uri, storage), timeout=120)
        took = time.monotonic() - started
    assert done.returncode == 2, said(done)
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: tracking_uri must be ") and expected in last_line, said(done)
    assert_no_traceback(done)
    assert not storage.exists() and "started a local Ray instance" not in done.stdout
    assert took < 60, f"took {took:.0f} s"  # imports included (3 s here); MLflow's own retries took minutes


# --- a storage path that is read-only or full -------------------------------------------

@contextlib.contextmanager
def mounted(where, options, size=None):
    """``where`` mounted (tmpfs, or a bind of itself with ``options`` containing bind),
    unmounted after; skips the test with the reason where mounting is not possible."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs or a read-only bind needs root (CI runs as root)")
    os.makedirs(where, exist_ok=True)
    if "bind" in options:
        first = subprocess.run(["mount", "--bind", str(where), str(where)], capture_output=True, text=True)
        command = ["mount", "-o", options, str(where), str(where)] if first.returncode == 0 else None
    else:
        command = ["mount", "-t", "tmpfs", "-o", options + (f",size={size}" if size else ""), "tmpfs", str(where)]
    done = subprocess.run(command, capture_output=True, text=True) if command else first
    if done.returncode != 0:
        if "bind" in options and first.returncode == 0:
            subprocess.run(["umount", str(where)], capture_output=True)
        pytest.skip(f"cannot mount here ({' '.join(command or ['mount', '--bind'])}): {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def read_only_folder(where):
    """A folder no file can be created in: a read-only tmpfs as root (root ignores
    permission bits), else a chmod-ed folder."""
    if os.geteuid() == 0:
        with mounted(where, "ro", size="1m") as folder:
            yield folder, "Read-only file system"
        return
    os.makedirs(where, exist_ok=True)
    os.chmod(where, 0o555)
    try:
        yield where, "Permission denied"
    finally:
        os.chmod(where, 0o755)


@pytest.mark.slow
@pytest.mark.parametrize("resume", [False, True], ids=["start", "--resume"])
def test_a_read_only_storage_path_is_refused_up_front(resume, tmp_path):
    with read_only_folder(tmp_path / "ro") as (folder, why):
        done = run_sweep_command(sweep_command(f"sqlite:///{tmp_path}/m.db", folder / "ray",
                                               *(["--resume"] if resume else [])), timeout=120)
    assert done.returncode == 2, said(done)
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"error: storage_path must be a writable folder with at least "
                                f"{MIN_FREE_BYTES // 2**20} MiB free (--storage-path; default $ACCELSWEEP_STORAGE_PATH, "
                                f"else ~/ray_results); got '{folder / 'ray'}'. {folder} takes no new file: {why}."), said(done)
    assert_no_traceback(done)
    assert not (tmp_path / "m.db").exists()  # refused before the store was opened


@pytest.mark.slow
def test_the_default_storage_path_is_the_environments_else_tunes(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from accelsweep.sweeps.driver.define.resume_check import storage_dir

    monkeypatch.delenv("ACCELSWEEP_STORAGE_PATH", raising=False)
    assert storage_dir(SimpleNamespace(storage_path=None)) == os.path.expanduser("~/ray_results")
    monkeypatch.setenv("ACCELSWEEP_STORAGE_PATH", str(tmp_path / "shared"))
    assert storage_dir(SimpleNamespace(storage_path=None)) == str(tmp_path / "shared")
    assert storage_dir(SimpleNamespace(storage_path=str(tmp_path / "given"))) == str(tmp_path / "given")


def test_a_full_storage_path_is_refused_up_front(tmp_path):
    with mounted(tmp_path / "tiny", "rw", size="1m") as folder:
        done = run_sweep_command(sweep_command(f"sqlite:///{tmp_path}/m.db", folder / "ray"), timeout=120)
    assert done.returncode == 2, said(done)
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: storage_path must be a writable folder") and \
        f"{folder} has 1.0 MiB free" in last_line, said(done)
    assert_no_traceback(done)


@pytest.mark.slow
def test_a_storage_path_that_fills_up_mid_sweep_stops_the_sweep_and_resume_finishes_it(tmp_path):
    """A tmpfs a little over the minimum, filled to 2 MiB free once the first trial has
    started: the sweep stops with exit status 75 and how to resume, nothing RUNNING in
    MLflow, no traceback; with room again, --resume finishes it."""
    from accelsweep.sweeps.driver.run.storage_watch import STOP_FREE_BYTES

    markers, uri = tmp_path / "markers", f"sqlite:///{tmp_path}/m.db"
    markers.mkdir()
    with mounted(tmp_path / "disk", "rw", size=str(MIN_FREE_BYTES + 8 * 2**20)) as disk:
        command = sweep_command(uri, disk / "ray", "--experiment", "F")
        command[command.index("--window-s") + 1] = "1.0"  # a trial long enough to fill the disk during it
        command[command.index("--num-samples") + 1] = "2"  # the stop and the resume need no more
        sweep = subprocess.Popen(command, cwd=REPO, env=sweep_env(FAULT_SWEEP_MARKERS=str(markers)),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 180
        while not any(name.startswith("start-") for name in os.listdir(markers)):
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
            time.sleep(0.2)
        filler = disk / "filler"
        with open(filler, "wb") as fill:
            os.posix_fallocate(fill.fileno(), 0, os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 2 * 2**20)
        stdout, stderr = sweep.communicate(timeout=240)
        done = subprocess.CompletedProcess(command, sweep.returncode, stdout, stderr)
        assert done.returncode == 75, said(done)
        assert re.match(rf"error: the storage path {re.escape(str(disk / 'ray'))} has [0-9.]+ MiB free, under the "
                        rf"{STOP_FREE_BYTES / 2**20:.1f} MiB kept for Tune's saved state\.",
                        stderr.strip().splitlines()[-1]), said(done)
        assert "--resume" in stderr.strip().splitlines()[-1]
        assert_no_traceback(done)
        parents, children = mlflow_runs(uri, "F")
        assert [p.info.status for p in parents] == ["KILLED"]
        assert not [c for c in children if c.info.status == "RUNNING"]

        filler.unlink()
        resumed = run_sweep_command(command + ["--resume"], timeout=300)
    assert resumed.returncode == 0, said(resumed)
    assert_no_traceback(resumed)
    parents, children = mlflow_runs(uri, "F")
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len([c for c in children if c.data.tags.get("status") == "finished"]) == 2
    assert all(c.info.status == "FINISHED" for c in children)


def test_tunes_failed_copy_for_want_of_room_stops_the_sweep_without_its_traceback(tmp_path, caplog):
    """The disk filled between two checks: Tune's copy fails and logs a traceback; the
    watch drops that line and stops the sweep at its next check."""
    from accelsweep.sweeps.driver.run.storage_watch import SYNCER_LOGGER, StorageWatch

    said_lines, stopped = [], []
    watch = StorageWatch(str(tmp_path), said_lines.append)
    with watch.stopping_tune():
        watch._interrupt = lambda: stopped.append(True)  # Tune's own stop, outside a Tune loop here
        with caplog.at_level(logging.WARNING, logger=SYNCER_LOGGER):
            logging.getLogger(SYNCER_LOGGER).warning(
                "Last sync command failed with the following error:\nTraceback (most recent call last):\n"
                "OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
        watch.check()
    assert "Traceback" not in caplog.text
    assert stopped == [True] and watch.tripped
    assert said_lines[0].startswith(f"Tune could not save the sweep's state under {tmp_path}: OSError: [Errno 28]")
    assert "run the same command with --resume" in str(watch.stopped())


def test_tunes_failed_save_of_its_state_is_said_once_without_its_traceback(tmp_path, caplog):
    """Tune's forced save logs an ERROR with the exception attached (not in the message):
    read-only storage. The watch drops it and says what failed in its own line."""
    from accelsweep.sweeps.driver.run.storage_watch import EXPERIMENT_STATE_LOGGER, StorageWatch

    said_lines, stopped = [], []
    watch = StorageWatch(str(tmp_path), said_lines.append)
    with watch.stopping_tune():
        watch._interrupt = lambda: stopped.append(True)
        with caplog.at_level(logging.WARNING, logger=EXPERIMENT_STATE_LOGGER):
            try:
                raise OSError(30, "Read-only file system", str(tmp_path / "experiment_state.json"))
            except OSError:
                logging.getLogger(EXPERIMENT_STATE_LOGGER).error(
                    f"Saving experiment state to storage at '{tmp_path}' failed with exception: ", exc_info=True)
            logging.getLogger(EXPERIMENT_STATE_LOGGER).error("another failure, not for want of room")
        watch.check()
    assert "Traceback" not in caplog.text and "another failure" in caplog.text  # only the storage failure dropped
    assert stopped == [True] and watch.tripped
    assert "Read-only file system" in said_lines[0]


def test_a_new_store_is_a_copy_of_the_schema_built_once_per_library_version(tmp_path, monkeypatch):
    from accelsweep.sweeps.driver.record import sqlite_store

    monkeypatch.setenv(sqlite_store.SCHEMA_CACHE_ENV, str(tmp_path / "schemas"))
    builds = []

    def build(path):  # a schema of one table, stamped at revision "r1"
        builds.append(path)
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.executescript("CREATE TABLE runs (id TEXT); CREATE TABLE alembic_version (version_num TEXT);"
                             "INSERT INTO alembic_version VALUES ('r1');")

    cached = sqlite_store.cached_build("lib-1.0-r1", build, lambda revision: revision == "r1")
    for name in ("a.db", "b.db"):
        assert sqlite_store.build_once(str(tmp_path / name), cached)
    assert len(builds) == 1  # the second database is a copy
    assert sqlite_store.schema_revision(str(tmp_path / "b.db")) == ("r1", frozenset({"runs", "alembic_version"}))
    # A cached schema that is not complete (cut short, another revision) is built again.
    with contextlib.closing(sqlite3.connect(tmp_path / "schemas" / "lib-1.0-r1.db")) as db:
        db.execute("UPDATE alembic_version SET version_num = 'r0'")
        db.commit()
    assert sqlite_store.build_once(str(tmp_path / "c.db"), cached) and len(builds) == 2
    assert sqlite_store.schema_revision(str(tmp_path / "schemas" / "lib-1.0-r1.db"))[0] == "r1"
    # A cache that cannot be written: each database is built, none is lost.
    monkeypatch.setenv(sqlite_store.SCHEMA_CACHE_ENV, str(tmp_path / "c.db" / "not-a-folder"))
    unwritable = sqlite_store.cached_build("lib-1.0-r1", build, lambda revision: revision == "r1")
    assert sqlite_store.build_once(str(tmp_path / "d.db"), unwritable) and len(builds) == 3
    assert sqlite_store.schema_revision(str(tmp_path / "d.db"))[0] == "r1"


def test_another_applications_sqlite_database_is_refused_and_left_untouched(tmp_path):
    """A `sqlite:///` URI naming a database of another application's (its tables, none of
    MLflow's): refused before anything is written, the file byte for byte as it was."""
    from accelsweep.sweeps.driver.define.store_checks import check_study_storage

    theirs = tmp_path / "inventory.db"
    with contextlib.closing(sqlite3.connect(theirs)) as database:
        database.execute("CREATE TABLE parts (id INTEGER PRIMARY KEY, name TEXT)")
        database.execute("INSERT INTO parts (name) VALUES ('bolt')")
        database.commit()
    before, modified = theirs.read_bytes(), theirs.stat().st_mtime_ns
    with pytest.raises(ConfigError) as refused:
        check_tracking_store(f"sqlite:///{theirs}")
    assert str(refused.value).startswith(f"tracking_uri must be a new sqlite file, or an MLflow store; got "
                                         f"'sqlite:///{theirs}'. {theirs} holds another application's tables (parts)")
    with pytest.raises(ConfigError, match=r"^study_storage must be a new sqlite file, or an Optuna study database"):
        check_study_storage(f"sqlite:///{theirs}")
    assert theirs.read_bytes() == before and theirs.stat().st_mtime_ns == modified
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.db"]  # no journal, no lock file left
    # An MLflow store (its tables) and an empty file are accepted.
    ours = tmp_path / "mlflow.db"
    with contextlib.closing(sqlite3.connect(ours)) as database:
        database.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        database.execute("CREATE TABLE runs (run_uuid TEXT)")
    assert check_tracking_store(f"sqlite:///{ours}") is None
    (tmp_path / "empty.db").write_bytes(b"")
    assert check_tracking_store(f"sqlite:///{tmp_path}/empty.db") is None


def test_a_tracking_server_that_answers_503_is_said_to_be_failing_not_misaddressed():
    """The team store's MLflow server with its database out of connections answers 503: the
    check must say the server is up but its store is not, and quote it (in CI it first
    said 'not MLflow's REST API: is this the server's root address?')."""
    from accelsweep.sweeps.driver.define.store_checks import check_tracking_store

    with http_server(503, b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "too many clients"}') as uri:
        with pytest.raises(ConfigError, match=r"tracking_uri") as refused:
            check_tracking_store(uri)
    said = str(refused.value)
    assert "HTTP 503" in said and "backend store does not answer" in said and "too many clients" in said
    assert "root address" not in said

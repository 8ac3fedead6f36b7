"""The MLflow tracking server lost mid-sweep (sweeps/driver/record/tracking_buffer.py).

The buffer alone, against a fake client that stops answering: writes kept in order,
placeholder run ids mapped (also in tags), the file a new driver replays, a refused write
dropped, the give-up. Then for real (``slow``): an ``mlflow server`` on 127.0.0.1 (sqlite
store) is killed with SIGKILL while tests/fault_sweep.py runs against it:

- started again within ``--tracking-wait-s``: the sweep finishes (exit 0) and MLflow has
  every trial as one FINISHED run with its figures, a run created while the server was
  gone included;
- not started again: the sweep stops by itself (exit 75, the message and the resume hint,
  no traceback) with its MLflow writes saved under its experiment dir; with the server
  back, --resume writes them first and ends with each trial one FINISHED run, none RUNNING.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from accelsweep.sweeps.driver.record.tracking_buffer import (BUFFER_DIR, PLACEHOLDER_PREFIX, WRITES_FILE, TrackingBuffer,
                                                   unanswered)
from tests.mlflow_server import MlflowServer, free_port
from tests.test_sweep_e2e import mlflow_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIALS = 3
# Generous: two cores shared with other test sessions start a sweep slowly.
SWEEP_S = 300


class FakeStore:
    """MlflowClient's writes, answered or not (``up``), each recorded in order."""

    def __init__(self):
        self.up, self.created, self.calls = True, 0, []
        self.refuse: set[str] = set()  # run ids whose writes it refuses (answered: no)

    def _answer(self, run_id: str = "") -> None:
        from mlflow.exceptions import MlflowException, RestException

        if not self.up:
            raise MlflowException("API request to http://127.0.0.1:9/api/2.0/mlflow/runs/log-batch failed with "
                                  "exception HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded "
                                  "(Caused by NewConnectionError(\"Failed to establish a new connection: [Errno 111] "
                                  "Connection refused\"))")
        if run_id in self.refuse:
            raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": f"no to {run_id}"})

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        self._answer()
        self.created += 1
        run_id = f"run{self.created}"
        self.calls.append(("create_run", run_id, run_name, dict(tags)))
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._answer(run_id)
        self.calls.append(("log_batch", run_id, {m.key: m.value for m in metrics}, {t.key: t.value for t in tags}))

    def update_run(self, run_id, status=None):
        self._answer(run_id)
        self.calls.append(("update_run", run_id, status))

    def set_terminated(self, run_id, status=None, end_time=None):
        self._answer(run_id)
        self.calls.append(("set_terminated", run_id, status))

    def log_artifact(self, run_id, local_path, artifact_path=None):
        self._answer(run_id)
        with open(local_path) as logged:
            self.calls.append(("log_artifact", run_id, logged.read()))


def buffer_on(store: FakeStore, lines: list, wait_s: float = 60.0) -> TrackingBuffer:
    buffer = TrackingBuffer(store, "http://127.0.0.1:9")
    buffer.wait_s, buffer.say = wait_s, lines.append
    return buffer


def metric(key: str, value: float):
    from mlflow.entities import Metric

    return Metric(key, value, 0, 1)


def tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, value)


def test_writes_go_straight_through_while_the_store_answers(tmp_path):
    store, lines = FakeStore(), []
    buffer = buffer_on(store, lines)
    buffer.keep_in(str(tmp_path))
    assert buffer.create_run("1", "parent", {}) == "run1"
    buffer.log_batch("run1", metrics=[metric("m", 1.0)])
    assert [call[0] for call in store.calls] == ["create_run", "log_batch"]
    assert lines == [] and not (tmp_path / BUFFER_DIR).exists()


def test_writes_are_kept_in_order_and_written_with_the_real_run_ids_when_the_store_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTAGE_API_TOKEN", "hunter2-outage-secret")
    store, lines = FakeStore(), []
    buffer = buffer_on(store, lines)
    buffer.keep_in(str(tmp_path))
    parent = buffer.create_run("1", "parent", {})
    store.up = False
    trial = buffer.create_run("1", "trial-001", {"mlflow.parentRunId": parent, "note": "hunter2-outage-secret"})
    assert trial.startswith(PLACEHOLDER_PREFIX)
    buffer.log_batch(trial, metrics=[metric("throughput", 123.0)], tags=[tag("parent", parent)])
    report = tmp_path / "report.md"
    report.write_text("the report")
    buffer.log_artifact(parent, str(report))
    report.unlink()  # a report's temporary folder is gone by the time the store answers
    buffer.set_terminated(trial, "FINISHED")
    assert "Connection refused" in lines[0] and "kept in order" in lines[0]
    saved = (tmp_path / BUFFER_DIR / WRITES_FILE).read_text()
    assert "hunter2-outage-secret" not in saved and "<redacted>" in saved
    assert [json.loads(line)["op"] for line in saved.splitlines()] == ["create_run", "log_batch", "log_artifact",
                                                                      "set_terminated"]
    store.up = True
    buffer.retry(force=True)
    real = buffer.run_id_of(trial)
    assert real == "run2" and not buffer.pending and buffer.answering
    assert store.calls[1:] == [
        ("create_run", "run2", "trial-001", {"mlflow.parentRunId": "run1", "note": "<redacted>"}),
        ("log_batch", "run2", {"throughput": 123.0}, {"parent": "run1"}),
        ("log_artifact", "run1", "the report"),
        ("set_terminated", "run2", "FINISHED")]
    assert "answers after" in lines[-1] and "4 kept write(s) written" in lines[-1]
    assert [json.loads(line) for line in (tmp_path / BUFFER_DIR / WRITES_FILE).read_text().splitlines()] == [
        {"resolved": {trial: "run2"}}]
    buffer.log_batch(trial, metrics=[metric("late", 1.0)])  # a record still holding the placeholder
    assert store.calls[-1] == ("log_batch", "run2", {"late": 1.0}, {})


def test_a_new_driver_writes_what_the_stopped_one_kept_first(tmp_path):
    store, lines = FakeStore(), []
    first = buffer_on(store, lines)
    first.keep_in(str(tmp_path))
    store.up = False
    trial = first.create_run("1", "trial-001", {})
    first.set_terminated(trial, "KILLED")
    store.up = True  # the store is back; the first driver is gone
    resumed = buffer_on(store, lines)
    resumed.keep_in(str(tmp_path))
    assert [call[0] for call in store.calls] == ["create_run", "set_terminated"]
    assert resumed.run_id_of(trial) == "run1" and not resumed.pending
    assert any("kept by the stopped run" in line for line in lines)


def test_a_refused_kept_write_is_said_and_dropped_and_the_rest_are_written(tmp_path):
    store, lines = FakeStore(), []
    buffer = buffer_on(store, lines)
    buffer.keep_in(str(tmp_path))
    store.up = False
    buffer.update_run("gone", "RUNNING")
    buffer.update_run("run9", "RUNNING")
    store.up, store.refuse = True, {"gone"}
    buffer.retry(force=True)
    assert store.calls == [("update_run", "run9", "RUNNING")]
    assert any("refused a kept write" in line and "no to gone" in line for line in lines)


def test_the_store_not_back_within_the_wait_gives_up_and_says_how_to_resume(tmp_path):
    store, lines = FakeStore(), []
    buffer = buffer_on(store, lines, wait_s=0.2)
    buffer.keep_in(str(tmp_path))
    stops = []
    buffer._interrupt = lambda: stops.append("stop")
    store.up = False
    buffer.update_run("run1", "RUNNING")
    time.sleep(0.3)
    buffer.retry()
    assert buffer.gave_up and stops == ["stop"]
    buffer.set_terminated("run1", "KILLED")  # kept, not tried again
    message = str(buffer.stopped())
    assert "--resume" in message and str(tmp_path / BUFFER_DIR / WRITES_FILE) in message
    assert "2 MLflow write(s)" in message


def test_only_a_store_that_did_not_answer_is_waited_for():
    from mlflow.exceptions import MlflowException, RestException

    assert unanswered(MlflowException("API request to http://h:1/api failed with timeout exception x"))
    assert unanswered(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}))
    assert not unanswered(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no run"}))
    assert not unanswered(MlflowException("Invalid value for param"))
    assert not unanswered(FileNotFoundError("report.md"))


def test_a_store_that_does_not_answer_at_the_start_is_refused_before_anything_starts(monkeypatch):
    from accelsweep.trainables.errors import ConfigError
    from accelsweep.sweeps.driver.record.tracking import open_tracker
    from accelsweep.sweeps.driver.record.tracking_buffer import MLFLOW_REQUEST_SETTINGS

    for name, value in MLFLOW_REQUEST_SETTINGS.items():  # as a sweep sets them
        monkeypatch.setenv(name, value)
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=r"tracking_uri must be an MLflow tracking store that answers; got "
                                          rf"'{uri}'\. It did not \(\[Errno 111\] Connection refused\)"):
        open_tracker(uri, "x")


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    running = MlflowServer(folder).start()
    yield running
    running.kill()


def sweep_command(server, tmp_path, wait_s: float, window_s: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", server.uri,
            "--storage-path", str(tmp_path / "ray"), "--num-samples", str(TRIALS), "--scheduler", "none",
            "--max-concurrent-trials", "1", "--windows", "3", "--window-s", str(window_s),
            "--tracking-wait-s", str(wait_s), "--no-report", *extra]


def sweep_env(markers) -> dict[str, str]:
    return {**os.environ, "FAULT_SWEEP_MARKERS": str(markers), "RAY_AUTH_MODE": "disabled",
            "MLFLOW_DISABLE_TELEMETRY": "true"}


def marker_times(markers, kind: str) -> list[int]:
    return sorted(int(name.rsplit("-", 1)[1]) for name in os.listdir(markers) if name.startswith(f"{kind}-"))


def wait_for_start(markers, sweep, after_ns: int, log) -> None:
    """Until a trial starts after ``after_ns`` (time.time_ns)."""
    deadline = time.monotonic() + SWEEP_S
    while not any(t > after_ns for t in marker_times(markers, "start")):
        assert sweep.poll() is None, f"the sweep ended first:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.1)


def kept_writes(storage) -> tuple[dict, list[dict]]:
    """The sweep's saved MLflow writes: (placeholder -> run id, writes not yet written)."""
    paths = glob.glob(os.path.join(storage, "fault_sweep-*", BUFFER_DIR, WRITES_FILE))
    assert len(paths) == 1, f"expected one {BUFFER_DIR}/{WRITES_FILE}, found {paths}"
    resolved, kept = {}, []
    with open(paths[0]) as saved:
        for line in saved:
            entry = json.loads(line)
            resolved.update(entry.get("resolved", {}))
            if "op" in entry:
                kept.append(entry)
    return resolved, kept


def check_every_trial_one_finished_run(uri: str) -> None:
    parents, children = mlflow_runs(uri, "fault_sweep")
    assert [p.info.status for p in parents] == ["FINISHED"]
    trial_ids = [c.data.tags["trial_id"] for c in children]
    assert len(trial_ids) == len(set(trial_ids)), f"a trial has two runs: {sorted(trial_ids)}"
    ran = [c for c in children if c.data.tags.get("status") != "reused"]
    assert len(ran) == TRIALS, [(c.info.run_name, c.data.tags.get("status")) for c in children]
    for child in children:
        assert child.info.status == "FINISHED", (child.info.run_name, child.info.status, child.data.tags)
        assert child.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
        assert child.data.metrics.get("throughput_samples_per_s", 0) >= 100, (child.info.run_name,
                                                                                child.data.metrics)
        assert child.data.tags.get("status") in ("finished", "reused"), child.data.tags


@pytest.mark.slow
def test_a_server_back_within_the_wait_gets_every_write(server, tmp_path, shared_ray):
    markers, log = tmp_path / "markers", tmp_path / "sweep.log"
    markers.mkdir()
    command = [*sweep_command(server, tmp_path, wait_s=SWEEP_S, window_s=0.3), *shared_ray.flags]
    with open(log, "w") as out:
        sweep = subprocess.Popen(command, cwd=REPO, env=sweep_env(markers), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_start(markers, sweep, 0, log)  # trial 1 runs, its run created
        killed_at = time.time_ns()
        server.kill()
        wait_for_start(markers, sweep, killed_at, log)  # a trial started since: its run has no id yet
        server.start()
        assert sweep.wait(timeout=SWEEP_S) == 0, log.read_text()[-6000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    output = log.read_text()
    assert "Traceback" not in output, output[-6000:]
    assert "did not answer" in output and "kept write(s) written" in output, output[-6000:]
    check_every_trial_one_finished_run(server.uri)
    resolved, kept = kept_writes(tmp_path / "ray")
    assert kept == []
    assert resolved and all(key.startswith(PLACEHOLDER_PREFIX) for key in resolved), resolved


@pytest.mark.slow
def test_a_server_gone_for_good_stops_the_sweep_and_resume_writes_what_it_kept(server, tmp_path, shared_ray):
    markers, log = tmp_path / "markers", tmp_path / "sweep.log"
    markers.mkdir()
    command = [*sweep_command(server, tmp_path, wait_s=3, window_s=0.7), *shared_ray.flags]
    with open(log, "w") as out:
        sweep = subprocess.Popen(command, cwd=REPO, env=sweep_env(markers), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_start(markers, sweep, 0, log)
        server.kill()
        status = sweep.wait(timeout=SWEEP_S)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    output = log.read_text()
    assert status == 75, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert "did not answer for 3 s" in output and "--resume" in output, output[-6000:]
    assert len(marker_times(markers, "end")) < TRIALS, "the sweep ran to its end: it did not stop"
    _, kept = kept_writes(tmp_path / "ray")
    assert {"create_run", "log_batch", "set_terminated"} <= {w["op"] for w in kept}, kept

    server.start()
    resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=sweep_env(markers), capture_output=True,
                             text=True, timeout=SWEEP_S)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert "kept by the stopped run" in output, output[-6000:]
    check_every_trial_one_finished_run(server.uri)
    resolved, kept = kept_writes(tmp_path / "ray")
    assert kept == [] and resolved


@pytest.mark.slow
def test_a_stop_while_waiting_for_a_lost_server_is_honoured_in_seconds(server, tmp_path, shared_ray):
    """The server gone after the last trial: the driver waits for it (up to the 600 s
    --tracking-wait-s). One SIGTERM ends that wait: exit 143 within 10 s, the kept writes
    on disk, the way to open the results said as a server's address; with the server
    back, --resume writes every one of them."""
    import signal

    markers, log = tmp_path / "markers", tmp_path / "sweep.log"
    markers.mkdir()
    command = [*sweep_command(server, tmp_path, wait_s=600, window_s=0.3), *shared_ray.flags]
    with open(log, "w") as out:
        sweep = subprocess.Popen(command, cwd=REPO, env=sweep_env(markers), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SWEEP_S
        while len(marker_times(markers, "end")) < TRIALS:
            assert sweep.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        server.kill()
        while "kept write(s)" not in log.read_text():  # "waiting up to ... s for ... to write N kept write(s)"
            assert sweep.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        stopped_at = time.monotonic()
        sweep.send_signal(signal.SIGTERM)
        status = sweep.wait(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if sweep.poll() is None:
            sweep.kill()
    output = log.read_text()
    assert status == 143, output[-6000:]
    assert took < 10, f"the stop took {took:.1f} s"
    assert "Traceback" not in output, output[-6000:]
    assert "are kept in" in output and "--resume writes them" in output, output[-3000:]
    _, kept = kept_writes(tmp_path / "ray")
    assert kept, "nothing kept: the writes were lost or written"

    server.start()
    resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=sweep_env(markers), capture_output=True,
                             text=True, timeout=SWEEP_S)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-6000:]
    assert f"open {server.uri}" in output, output[-3000:]  # a server is opened at its own address
    check_every_trial_one_finished_run(server.uri)
    assert kept_writes(tmp_path / "ray")[1] == []


class SlowStore(FakeStore):
    """A server that takes ``delay_s`` to answer each write to a run."""

    def __init__(self, delay_s: float):
        super().__init__()
        self.delay_s = delay_s

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        time.sleep(self.delay_s)
        super().log_batch(run_id, metrics, params, tags)

    def set_terminated(self, run_id, status=None, end_time=None):
        time.sleep(self.delay_s)
        super().set_terminated(run_id, status, end_time)


def behind_buffer(store: FakeStore, lines: list, tmp_path) -> TrackingBuffer:
    buffer = TrackingBuffer(store, "http://127.0.0.1:9", behind=True)
    buffer.say = lines.append
    buffer.keep_in(str(tmp_path))
    return buffer


def test_a_servers_writes_to_a_run_go_out_behind_the_driver_in_order(tmp_path):
    store, lines = SlowStore(0.2), []
    buffer = behind_buffer(store, lines, tmp_path)
    run = buffer.create_run("1", "trial-001", {})
    started = time.monotonic()
    buffer.log_batch(run, metrics=[metric("m", 1.0)])
    buffer.set_terminated(run, "FINISHED")
    assert time.monotonic() - started < 0.15  # the driver did not wait for the server's 0.4 s
    assert [call[0] for call in store.calls] == ["create_run"]
    assert buffer.answering  # waits for them: the store can be read
    assert time.monotonic() - started >= 0.35
    assert [call[:2] for call in store.calls] == [("create_run", "run1"), ("log_batch", "run1"),
                                                  ("set_terminated", "run1")]
    assert lines == []


def test_writes_behind_a_store_that_stops_answering_are_kept_ahead_of_later_ones_and_written_in_order(tmp_path):
    store, lines = SlowStore(0.1), []
    buffer = behind_buffer(store, lines, tmp_path)
    run = buffer.create_run("1", "trial-001", {})
    store.up = False  # before the sender reaches them
    buffer.log_batch(run, metrics=[metric("m", 1.0)])
    buffer.set_terminated(run, "FINISHED")
    buffer.settle()
    assert [op["op"] for op in buffer.pending] == ["log_batch", "set_terminated"]
    assert "did not answer" in lines[0] and "kept in order" in lines[0]
    other = buffer.create_run("1", "trial-002", {})  # kept too (it comes after them)
    assert other.startswith(PLACEHOLDER_PREFIX)
    saved = [json.loads(line)["op"] for line in (tmp_path / BUFFER_DIR / WRITES_FILE).read_text().splitlines()
             if "op" in json.loads(line)]
    assert saved == ["log_batch", "set_terminated", "create_run"]  # on disk, for a killed driver's --resume
    store.up = True
    buffer.retry(force=True)
    assert [call[:2] for call in store.calls] == [("create_run", "run1"), ("log_batch", "run1"),
                                                  ("set_terminated", "run1"), ("create_run", "run2")]
    assert not buffer.pending


def test_a_write_refused_behind_the_driver_is_said_and_dropped_and_the_rest_are_written(tmp_path):
    store, lines = FakeStore(), []
    buffer = behind_buffer(store, lines, tmp_path)
    store.refuse = {"gone"}
    buffer.log_batch("gone", metrics=[metric("m", 1.0)])
    buffer.set_terminated("run7", "FINISHED")
    buffer.settle()
    assert store.calls == [("set_terminated", "run7", "FINISHED")] and not buffer.pending
    assert any("refused a write" in line and "no to gone" in line for line in lines)


def test_only_a_server_is_written_behind_the_driver(tmp_path):
    from accelsweep.sweeps.driver.record.tracking import SweepTracker

    assert SweepTracker(f"sqlite:///{tmp_path}/m.db", "e").buffer.behind is False

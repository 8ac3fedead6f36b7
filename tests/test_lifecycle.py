"""A sweep's driver stopped by SIGTERM or SIGINT ends the sweep cleanly and --resume
completes it (stop_signals.py); a local Ray instance does not outlive the driver that
started it, even one killed by SIGKILL, and one left by a driver killed with its reaper
is stopped by the next start (local_ray.py).

The sweeps are tests/fault_sweep.py, started in a session of their own as a user's
terminal or a scheduler would; each signal goes to the driver's pid only. Bounds on
time are generous (2 shared cores): they tell "stopped" from "never stopped"."""

from __future__ import annotations

import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from accelsweep.sweeps.driver.run.local_ray import RECORD, instance_processes, stop_processes
from accelsweep.sweeps.driver.run.stop_signals import StopSignals, SweepInterrupted
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs

TRIALS = 2
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
# Python's traceback, and what Ray's C++ failure handler prints before it aborts.
CRASH_SIGNS = ("Traceback", "*** SIG", "Stack trace", "Aborted", "core dumped")


def sweep_command(tmp_path, *extra):
    # 5 windows of 0.4 s: a trial runs about 2 s, so a signal 0.8 s after it starts lands mid-trial.
    return [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
            "--storage-path", str(tmp_path / "ray"), "--num-samples", str(TRIALS), "--scheduler", "none",
            "--max-concurrent-trials", "1", "--windows", "5", "--window-s", "0.4", "--no-report", *extra]


def start_driver(tmp_path, **env):
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{tmp_path}/m.db").search_experiments()  # the store exists before the sweep opens it
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(sweep_command(tmp_path), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "FAULT_SWEEP_MARKERS": str(markers), **env})
    return driver, markers


def wait_for(found, driver, tmp_path, what, timeout_s=240):
    deadline = time.monotonic() + timeout_s
    while not found():
        log = (tmp_path / "driver.log").read_text()
        assert driver.poll() is None, f"the driver ended before {what}:\n{log[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.2)


def session_of(output: str) -> str:
    found = re.search(r"started a local Ray instance \([^;]*; session (\S+);", output)
    assert found, output[-3000:]
    return found.group(1)


def gone_within(session_dir: str, timeout_s: float) -> list[int]:
    """The instance's processes still there after up to ``timeout_s`` (none: all gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = instance_processes(session_dir)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_driver_ends_the_sweep_cleanly_and_resume_completes_it(tmp_path, signum, shared_ray):
    """SIGHUP too: the terminal or SSH session that started the sweep closing."""
    uri = f"sqlite:///{tmp_path}/m.db"
    driver, markers = start_driver(tmp_path)
    wait_for(lambda: glob.glob(str(markers / "start-*")), driver, tmp_path, "trial start")
    time.sleep(0.8)  # mid-trial
    os.kill(driver.pid, signum)  # the driver alone, not its process group
    status = driver.wait(timeout=180)
    output = (tmp_path / "driver.log").read_text()

    assert status == EXIT_STATUS[signum], output[-3000:]
    assert not [sign for sign in CRASH_SIGNS if sign in output], output[-3000:]
    assert f"stopped: interrupted by {signal.Signals(signum).name} (exit status {EXIT_STATUS[signum]})" in output
    assert "interrupted: run the same command with --resume to continue" in output
    parents, children = mlflow_runs(uri, "fault_sweep")
    assert [(p.info.status, p.data.tags["status"]) for p in parents] == [("KILLED", "interrupted")]
    assert not [r for r in children if r.info.status == "RUNNING"]
    assert [(r.info.status, r.data.tags["status"]) for r in children
            if r.data.tags.get("status") != "finished"] == [("KILLED", "interrupted")], "the running trial"
    (marker,) = glob.glob(str(tmp_path / "ray" / "fault_sweep-*" / "accelsweep-sweep.json"))
    assert json.load(open(marker))["status"] == "interrupted"
    assert gone_within(session_of(output), 10) == [], "the driver's Ray instance outlived it"

    if signum == signal.SIGINT:
        return  # resumed after SIGINT in tests/test_secret_leak.py: the suite's time is spent once
    # The resume needs no instance of its own: it joins the session's, as a resume on a cluster would.
    resumed = subprocess.run(sweep_command(tmp_path, "--resume", *shared_ray.flags), cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming " in resumed.stdout
    parents, children = mlflow_runs(uri, "fault_sweep")
    assert [(p.info.status, p.data.tags["status"]) for p in parents] == [("FINISHED", "finished")]
    trials = [r for r in children if r.data.tags.get("status") != "reused"]  # a repeated proposal: not run
    assert len({r.data.tags["trial_id"] for r in trials}) == len(trials) == TRIALS  # one run per trial
    numbers = [r.data.tags["trial_number"] for r in children]
    assert len(set(numbers)) == len(numbers)
    assert {r.info.status for r in children} == {"FINISHED"}


@pytest.mark.slow
def test_a_driver_killed_alone_takes_its_ray_instance_with_it(tmp_path):
    # The first trial hangs after starting a child of its own (sleep), which must go too.
    driver, markers = start_driver(tmp_path, FAULT_SWEEP_HANG="0")
    wait_for(lambda: (markers / "child-0.pid").exists(), driver, tmp_path, "hung trial's child")
    child = int((markers / "child-0.pid").read_text())
    session = session_of((tmp_path / "driver.log").read_text())
    assert instance_processes(session)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    assert gone_within(session, 60) == []
    assert not running(child)


# A driver that starts a local instance the way a sweep does (connect_ray), says so, then
# waits (to be killed) or shuts it down at once.
START = """
import sys, time
from accelsweep.sweeps.driver.run import local_ray
from accelsweep.sweeps.driver.run.lifecycle import connect_ray
print(connect_ray(None), flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
local_ray.shutdown()
"""


@pytest.mark.slow
def test_a_driver_killed_with_its_reaper_leaves_no_ray_process_and_a_stray_child_goes_at_the_next_start():
    # Ray's temp directory of this test only (short: Ray's socket paths must stay under
    # 108 bytes), holding a `ray start` cluster's record that names a closed port: a bare
    # ray.init() would try to join it; a sweep starts its own instance whatever is there.
    temp = tempfile.mkdtemp(prefix="lc", dir="/tmp")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    os.mkdir(os.path.join(temp, "ray"))  # Ray's temp directory under $RAY_TMPDIR
    with open(os.path.join(temp, "ray", "ray_current_cluster"), "w") as record:
        record.write(f"127.0.0.1:{closed_port}")
    env = {**os.environ, "RAY_TMPDIR": temp}
    env.pop("RAY_ADDRESS", None)
    first = subprocess.Popen([sys.executable, "-c", START, "wait"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             start_new_session=True, env=env)
    session = None
    try:
        # A bare ray.init() would wait on the recorded cluster for minutes: bounded here.
        assert select.select([first.stdout], [], [], 180)[0], "connect_ray(None) did not return in 180 s"
        session = session_of(first.stdout.readline())
        assert session.startswith(f"{temp}/ray/session_")
        with open(os.path.join(session, RECORD)) as record:
            reaper = json.load(record)["reaper_pid"]
        time.sleep(2)  # Ray starts its agents after ray.init returns
        os.kill(reaper, signal.SIGKILL)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        # Ray's own processes go with the driver (parent-death signals: raylet_child.py for
        # the agents, which stayed for good before), though no reaper and no sweep is left.
        assert gone_within(session, 30) == [], "Ray processes of the killed driver's instance stayed"
        # What a trial started in a session of its own has no such signal: one, naming the
        # session as a trial's child may (and orphaned, as the driver's are), is left for
        # the next start to stop.
        subprocess.run([sys.executable, "-c", "import os, time\nif os.fork() == 0:\n    time.sleep(600)", session],
                       start_new_session=True, check=True)
        assert instance_processes(session)

        second = subprocess.run([sys.executable, "-c", START, "shutdown"], cwd=REPO, capture_output=True,
                                text=True, timeout=180, env=env)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        said = re.escape(f"stopped a Ray instance left running by a sweep driver that is gone (pid {first.pid}; "
                         f"session {session}): ") + r"\d+ processes"
        assert re.search(said, second.stdout), second.stdout
        assert instance_processes(session) == []
        assert gone_within(session_of(second.stdout), 10) == []
    finally:
        if first.poll() is None:
            first.kill()  # its reaper stops its instance
        if session:
            stop_processes(instance_processes(session), grace_s=0)
        shutil.rmtree(temp, ignore_errors=True)


# ---- the handlers themselves, in this process ----------------------------------------------

def test_the_handlers_hold_for_the_sweep_only_and_the_previous_ones_come_back():
    def previous(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, previous)
    interrupt_before = signal.getsignal(signal.SIGINT)  # pytest's, or what an earlier test left
    tune_setting = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    try:
        lines = []
        with StopSignals(lines.append) as stop:
            assert signal.getsignal(signal.SIGTERM) == stop._handle == signal.getsignal(signal.SIGINT)
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
            signal.raise_signal(signal.SIGTERM)  # between steps: acted on where the sweep asks
            assert stop.requested and lines
            with pytest.raises(SweepInterrupted) as raised:
                stop.raise_if_requested("result")
            assert (raised.value.exit_status, raised.value.result) == (143, "result")
            with pytest.raises(SweepInterrupted):
                signal.raise_signal(signal.SIGINT)  # a second signal: at once
        assert signal.getsignal(signal.SIGTERM) is previous
        assert signal.getsignal(signal.SIGINT) is interrupt_before
        assert os.environ.get("TUNE_DISABLE_SIGINT_HANDLER") == tune_setting
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_second_signal_raised_in_a_finalizer_is_not_printed_but_delivered_again(monkeypatch, capsys):
    """Python prints an exception raised in a finalizer ("Exception ignored in ...") and
    goes on: the second signal's stop would be lost, and its traceback shown."""
    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the second signal lands in a finalizer

    delivered = []
    with StopSignals(lambda line: None) as stop:
        signal.raise_signal(signal.SIGINT)  # the first: a stop requested
        monkeypatch.setattr(os, "kill", lambda pid, signum: delivered.append((pid, signum)))
        Finalized()  # collected at once: its SweepInterrupted goes to sys.unraisablehook
        monkeypatch.undo()
        assert stop.requested
    assert delivered == [(os.getpid(), signal.SIGINT)]
    assert "Exception ignored" not in capsys.readouterr().err
    assert sys.unraisablehook != stop._unraisable  # the process's own hook is back


def test_a_signal_in_a_step_that_may_be_cut_stops_it_at_once_with_its_exit_status():
    with pytest.raises(SweepInterrupted) as raised:
        with StopSignals(lambda line: None) as stop, stop.at_once():  # e.g. Sweep.before_trials
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("not stopped")
    assert raised.value.exit_status == 130
    assert str(raised.value) == "interrupted by SIGINT (exit status 130)"

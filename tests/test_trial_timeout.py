"""The per-trial progress deadline (sweeps/driver/run/deadline.py, --trial-timeout-s).

The slow test hangs a real trial (tests/fault_sweep.py FAULT_SWEEP_HANG: after its first
window it starts a child ``sleep`` and waits for ever) and checks what the sweep left:
the trial ended and recorded FAILED with cause ``timeout``, not retried, the searcher
told, its child killed before the next trial started, and the other trials finished.
The fast tests pin the stall rule, the process-tree kill and the validation."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from accelsweep.sweeps.driver.run import deadline as deadline_module
from accelsweep.sweeps.driver.run.deadline import (DRIVER_PAUSE_S, StallRule, TrialDeadline, check_trial_timeout,
                                               kill_process_tree)
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.failures import TIMEOUT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie (this container's init may never
    reap an orphan, so a dead child can linger as one)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- the stall rule -------------------------------------------------------------------

def test_a_trial_silent_past_its_deadline_since_it_started_or_last_reported_is_overdue():
    rule = StallRule(timeout_s=10)
    rule.started("a", now=0)
    rule.started("b", now=0)
    rule.reported("b", now=8)
    assert rule.overdue({"a", "b"}, now=9.9) == []
    assert rule.overdue({"a", "b"}, now=10.5) == [("a", 10.5, "it started")]
    for now in range(11, 18):  # the driver checks often (a longer gap is its own pause, below)
        rule.overdue({"a", "b"}, now=now)
    overdue = rule.overdue({"a", "b"}, now=18.5)
    assert sorted(overdue) == [("a", 18.5, "it started"), ("b", 10.5, "its last report")]


def test_a_report_restarts_the_clock_and_a_trial_no_longer_running_is_forgotten():
    rule = StallRule(timeout_s=10)
    rule.started("a", now=0)
    for now in (4, 8, 12, 16):
        rule.reported("a", now=now)
        assert rule.overdue({"a"}, now=now + 1) == []
    assert rule.overdue(set(), now=18) == []  # ended: not watched any more
    assert rule.overdue({"a"}, now=19) == []  # running again (a retry): a fresh clock
    for now in range(20, 29):
        assert rule.overdue({"a"}, now=now) == []
    assert rule.overdue({"a"}, now=29.5)[0][:2] == ("a", 10.5)


def test_a_trial_first_seen_running_starts_its_clock_then():
    rule = StallRule(timeout_s=10)
    assert rule.overdue({"seen-late"}, now=50) == []
    for now in range(51, 60):
        assert rule.overdue({"seen-late"}, now=now) == []
    assert rule.overdue({"seen-late"}, now=60.5) == [("seen-late", 10.5, "it started")]


def test_the_drivers_own_pause_is_not_a_trials_silence():
    # A driver blocked (a slow MLflow write) cannot read reports waiting for it.
    rule = StallRule(timeout_s=10)
    rule.started("a", now=0)
    assert rule.overdue({"a"}, now=2) == []
    back = 2 + DRIVER_PAUSE_S + 30
    assert rule.overdue({"a"}, now=back) == []  # 35+ s later, but the driver was away
    silent_after = [(step, bool(rule.overdue({"a"}, now=back + step))) for step in range(1, 10)]
    # 2 s heard before the pause and 8 after: 10, not past it; 9 after: past it.
    assert [step for step, overdue in silent_after if overdue] == [9]


def test_enforce_ends_an_overdue_running_trial_once_with_no_retries_and_cause_timeout(monkeypatch):
    killed = []
    monkeypatch.setattr(deadline_module, "end_trial_processes",
                        lambda trial: killed.append(trial.trial_id) or "its process (pid 1234) was killed")
    clock = SimpleNamespace(now=0.0)
    deadline = TrialDeadline(5, clock=lambda: clock.now)
    hung = SimpleNamespace(trial_id="hung", status="RUNNING", max_failures=3)
    busy = SimpleNamespace(trial_id="busy", status="RUNNING", max_failures=3)
    waiting = SimpleNamespace(trial_id="waiting", status="PENDING", max_failures=3)
    trials = [hung, busy, waiting]
    deadline.started("hung")
    deadline.started("busy")
    for now in (1, 2, 3, 4, 5, 6):
        clock.now = now
        deadline.reported("busy")
        assert deadline.enforce(trials) == ([hung] if now == 6 else [])
    clock.now = 7
    deadline.reported("busy")
    assert deadline.enforce(trials) == []  # ended already: not killed twice
    assert killed == ["hung"]
    assert hung.max_failures == 0 and busy.max_failures == 3  # Tune does not retry it
    error_class, error, cause = deadline.error_of("hung")
    assert (error_class, cause) == ("TrialTimeout", TIMEOUT)
    assert "deadline of 5 s" in error and "since it started" in error and "pid 1234" in error
    assert deadline.error_of("busy") is None


def test_enforce_waits_for_a_running_trial_that_has_no_actor_yet(monkeypatch):
    monkeypatch.setattr(deadline_module, "end_trial_processes", lambda trial: None)
    clock = SimpleNamespace(now=0.0)
    deadline = TrialDeadline(5, clock=lambda: clock.now)
    starting = SimpleNamespace(trial_id="starting", status="RUNNING", max_failures=3)
    deadline.started("starting")
    for now in range(1, 8):
        clock.now = now
        assert deadline.enforce([starting]) == []
    assert starting.max_failures == 3 and deadline.error_of("starting") is None


# --- killing a process tree -----------------------------------------------------------

def test_kill_process_tree_kills_the_process_its_children_and_one_that_left_its_group(tmp_path):
    pids = tmp_path / "pids"
    # A leader of its own group (as Ray makes each worker) with a child in its group and a
    # child that left it (setsid: a process-group kill alone would miss it).
    root = subprocess.Popen(["bash", "-c", f"sleep 1000 & echo $! >> {pids}; setsid sleep 1000 & "
                                           f"echo $! >> {pids}; wait"], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    children = [int(pid) for pid in pids.read_text().split()]
    assert all(_alive(pid) for pid in children)
    try:
        assert kill_process_tree(root.pid) >= 2
        root.wait(timeout=10)
        deadline = time.monotonic() + 10  # SIGKILL is delivered at once; the kernel may take a moment
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children)
    finally:
        for pid in children:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_kill_process_tree_refuses_itself_and_init():
    with pytest.raises(ValueError):
        kill_process_tree(os.getpid())
    with pytest.raises(ValueError):
        kill_process_tree(1)


# --- validation -----------------------------------------------------------------------

@pytest.mark.parametrize("given", [0, -1, float("nan"), float("inf"), "60", True])
def test_a_bad_trial_timeout_is_a_config_error_naming_the_field(given):
    with pytest.raises(ConfigError) as refused:
        check_trial_timeout(given)
    assert refused.value.field == "trial_timeout_s"
    assert "a number of seconds > 0" in str(refused.value) and repr(given) in str(refused.value)


def test_plan_sweep_checks_trial_timeout_and_the_flag_refuses_zero():
    from accelsweep import Objective, Sweep, plan_sweep
    from accelsweep.sweeps.driver.define.cli import common_parser, sweep_options
    from tests.fault_sweep import FaultSweepConfig, sleepy_trainable

    def sweep(timeout):
        return Sweep(name="t", trainable=sleepy_trainable, base=FaultSweepConfig(),
                     space=lambda trial: {"x": trial.suggest_categorical("x", [0, 1])},
                     objectives=[Objective("throughput_samples_per_s", "max")], trial_timeout_s=timeout)

    for fine in (None, 0.5, 600):
        plan_sweep(sweep(fine))
    with pytest.raises(ConfigError, match="trial_timeout_s must be a number of seconds > 0"):
        plan_sweep(sweep(0))
    parser = common_parser("t", default_samples=2)
    assert sweep_options(parser.parse_args(["--trial-timeout-s", "90"]), default_samples=2)["trial_timeout_s"] == 90
    assert sweep_options(parser.parse_args([]), default_samples=2)["trial_timeout_s"] is None
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["--trial-timeout-s", "0"])
    assert refused.value.code == 2


# --- a real hung trial ------------------------------------------------------------------

TIMEOUT_S = 6  # 10x a healthy trial's longest silence (its start plus a 0.5 s window), on 2 loaded cores
HUNG_X = 0  # the baseline's knob: run first, so certainly proposed


@pytest.mark.slow
@pytest.mark.alone  # TIMEOUT_S: a healthy trial's silence, measured with no other test beside it
def test_a_hung_trial_is_ended_killed_recorded_and_not_retried_and_the_sweep_goes_on(tmp_path):
    import mlflow
    import ray.cloudpickle as cloudpickle

    markers = tmp_path / "markers"
    markers.mkdir()
    # Its child detached (a session of its own): only a walk of the trial's process tree finds
    # it; a kill of its process group, or Ray's cleanup of a dead worker's, would not.
    env = {**os.environ, "FAULT_SWEEP_HANG": str(HUNG_X), "FAULT_SWEEP_MARKERS": str(markers),
           "FAULT_SWEEP_HANG_DETACHED": "1",
           "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", uri, "--storage-path",
               str(tmp_path / "ray"), "--num-samples", "3", "--scheduler", "none", "--max-concurrent-trials", "1",
               "--retries", "2", "--trial-timeout-s", str(TIMEOUT_S)]
    log = open(tmp_path / "driver.log", "w")
    # Its own session: should it fail, it is killed with the Ray instance it started.
    driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    child_pid, child_alive_when_next_started, returncode = None, None, None

    def hung_starts() -> list[str]:
        return glob.glob(str(markers / f"start-{HUNG_X}-*"))

    try:
        # One trial at a time: the next trial starts only after the hung one has been ended,
        # so its child must be dead by then (not merely when the sweep's Ray shuts down).
        give_up = time.monotonic() + 150  # ~25 s alone; a deadline that never fires hangs for ever
        while driver.poll() is None and time.monotonic() < give_up and len(hung_starts()) < 2:
            pid_file = markers / f"child-{HUNG_X}.pid"
            if child_pid is None and pid_file.exists() and pid_file.read_text():
                child_pid = int(pid_file.read_text())
            later = [m for m in glob.glob(str(markers / "start-*")) if m not in hung_starts()]
            if child_pid is not None and later and child_alive_when_next_started is None:
                child_alive_when_next_started = _alive(child_pid)
            time.sleep(0.05)
        returncode = driver.poll()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
            driver.wait()
        if child_pid is not None and _alive(child_pid):
            os.kill(child_pid, 9)
        log.close()
    output = (tmp_path / "driver.log").read_text()
    assert len(hung_starts()) == 1, "the timed-out trial was run again"
    assert child_pid is not None, "the hung trial never started its child"
    assert child_alive_when_next_started is False, "the hung trial's child outlived it"
    assert returncode == 0, output[-3000:]
    assert f"deadline of {TIMEOUT_S} s" in output

    mlflow.set_tracking_uri(uri)
    runs = [r for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
            if "trial_number" in r.data.tags]
    hung = [r for r in runs if r.data.tags["searched"] == f'{{"x": {HUNG_X}}}']
    assert len(hung) == 1
    tags = hung[0].data.tags
    assert hung[0].info.status == "FAILED"
    assert (tags["error_cause"], tags["error_class"]) == ("timeout", "TrialTimeout")
    assert f"past its deadline of {TIMEOUT_S} s" in tags["error"] and "since its last report" in tags["error"]
    assert "retries" not in tags  # --retries 2 restarts lost processes; not this one
    others = [r for r in runs if r is not hung[0]]
    assert others and all(r.info.status == "FINISHED" for r in others)
    assert sum(r.data.tags["status"] == "finished" for r in others) >= 1

    # The searcher was told: its Optuna study (in Tune's saved searcher state) has it FAILED.
    [searcher_state] = glob.glob(str(tmp_path / "ray" / "fault_sweep-*" / "searcher-state-*.pkl"))
    with open(searcher_state, "rb") as saved:
        study = cloudpickle.load(saved)["_ot_study"]
    assert [t.state.name for t in study.trials if t.params == {"x": HUNG_X}] == ["FAIL"]

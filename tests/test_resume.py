"""--resume: a sweep whose driver was killed continues where it stopped.

The driver (and the local Ray it started) is killed with SIGKILL at each of several
moments, as a loop: the same command with --resume continues, and is itself killed at
the next moment, up to a last --resume that must finish the sweep. Each moment is
chosen by what the sweep has done (marker files of its trials, its MLflow runs, Tune's
saved state), never by a sleep. Tune saves its state once as each launch starts and no
more (a resumed run keeps the save period of the run it resumes): every trial a launch
starts or ends after that is one a killed driver leaves unknown to Tune, the case
--resume must rebuild from MLflow. After every kill,
and then at the end, MLflow must hold exactly one run per proposed config (reused
proposals aside: bookkeeping), no trial number twice, no config measured twice, no run
measured again after it ended; at the end none RUNNING, each with its own result, and
the Optuna study one trial per run."""

import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import pytest

from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs

TRIALS = 8
WINDOW_S = 0.5
SAVE_PERIOD_S = "100000"  # TUNE_GLOBAL_CHECKPOINT_S: Tune's state stays as the first step of a launch saved it
ENDED = ("finished", "stopped early", "rejected", "failed", "cut by time budget")


def sweep_command(tmp_path, *extra):
    return [sys.executable, "-m", "tests.fault_sweep", "--num-samples", str(TRIALS), "--scheduler", "none",
            "--max-concurrent-trials", "1", "--windows", "2", "--window-s", str(WINDOW_S),
            "--tracking-uri", f"sqlite:///{tmp_path}/r.db", "--experiment", "R",
            "--storage-path", str(tmp_path / "ray"), *extra]


class Sweep:
    """What a test reads of a running sweep to choose the moment of a kill."""

    def __init__(self, tmp_path):
        from mlflow.tracking import MlflowClient

        self.tmp_path, self.markers = tmp_path, tmp_path / "markers"
        self.markers.mkdir()
        self.client = MlflowClient(f"sqlite:///{tmp_path}/r.db")
        self.client.search_experiments()  # the store created now: two processes must not both migrate it
        self.launched_ns = 0

    def launch(self, *extra):
        self.launched_ns, self.saves_before = time.time_ns(), self.saves()
        env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": SAVE_PERIOD_S, "FAULT_SWEEP_MARKERS": str(self.markers)}
        log = open(self.tmp_path / "driver.log", "a")
        return subprocess.Popen(sweep_command(self.tmp_path, *extra), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)

    def experiment_dir(self):
        found = glob.glob(str(self.tmp_path / "ray" / "fault_sweep-*" / "accelsweep-sweep.json"))
        return os.path.dirname(found[0]) if found else None

    def starts(self) -> list[int]:
        """When the trials of this launch started (ns)."""
        stamps = [int(name.rsplit("-", 1)[1]) for name in os.listdir(self.markers) if name.startswith("start-")]
        return sorted(s for s in stamps if s > self.launched_ns)

    def trial_runs(self):
        found = self.client.get_experiment_by_name("R")
        if found is None:
            return []
        return [r for r in self.client.search_runs([found.experiment_id], max_results=1000)
                if "mlflow.parentRunId" in r.data.tags and r.data.tags.get("status") != "reused"]

    def ended_since_launch(self) -> int:
        return sum(r.info.status == "FINISHED" and r.info.end_time * 1_000_000 > self.launched_ns
                   for r in self.trial_runs())

    def saves(self) -> set:
        """Tune's saved experiment states: one file per launch, each written again at each save."""
        return set(glob.glob(os.path.join(self.experiment_dir() or "/nonexistent", "experiment_state-*.json")))

    def saved_by_this_launch(self) -> bool:
        return bool(self.saves() - self.saves_before)


@dataclass
class KillMoment:
    name: str
    ready: Callable[[Sweep], bool]
    report: bool = False  # the sweep's report at its end: a few seconds in which it is finishing


# In the order one sweep meets them; each launch is the --resume of the one killed before.
KILL_MOMENTS = [
    # Its parent run and marker written, Tune not yet saved: the resume starts Tune afresh.
    KillMoment("during the driver's start, before any trial", lambda s: s.experiment_dir() is not None),
    # Tune saved the first trial pending; it has ended since, and the next one, unknown to
    # Tune, has just started.
    KillMoment("just after a trial starts", lambda s: len(s.starts()) >= 2),
    # The trial Tune saved pending (the one cut off above, proposed again) after one window.
    KillMoment("mid-trial", lambda s: bool(s.starts()) and time.time_ns() - s.starts()[0] > 1.5 * WINDOW_S * 1e9),
    # Two ended, their results in MLflow: the one Tune saved pending, and the next, unknown to Tune.
    KillMoment("just after a trial ends", lambda s: s.ended_since_launch() >= 2),
    KillMoment("just after a save", lambda s: s.saved_by_this_launch()),
    # Every trial ended: the driver is closing the sweep (its report, its parent run).
    KillMoment("while the sweep finishes", lambda s: s.ended_since_launch() >= 1 and len(s.trial_runs()) >= TRIALS
               and all(r.info.status == "FINISHED" for r in s.trial_runs()), report=True),
]


def check_runs(sweep: Sweep, finished_before: dict, at: str) -> None:
    """What holds whenever the driver stops: no trial number twice (its runs' names say
    the same), no config with two results, no ended run measured again."""
    found = sweep.client.get_experiment_by_name("R")
    runs = [r for r in sweep.client.search_runs([found.experiment_id], max_results=1000)
            if "mlflow.parentRunId" in r.data.tags]
    numbers = [int(r.data.tags["trial_number"]) for r in runs]
    assert len(numbers) == len(set(numbers)), f"{at}: a trial number given twice: {sorted(numbers)}"
    for run in runs:
        assert run.info.run_name.startswith(f"trial-{int(run.data.tags['trial_number']):03d}"), (at, run.info.run_name)
    measured = [r.data.tags["searched"] for r in runs
                if r.data.tags.get("status") in ENDED and r.data.tags.get("error_class") != "Lost"]
    assert len(measured) == len(set(measured)), f"{at}: a config measured twice: {sorted(measured)}"
    for run in runs:
        if run.info.run_id in finished_before:  # ended earlier: kept as it was, not run again
            assert (run.info.status, run.info.end_time) == finished_before[run.info.run_id], (at, run.info.run_name)
        elif run.info.status == "FINISHED":
            finished_before[run.info.run_id] = (run.info.status, run.info.end_time)


@pytest.mark.slow
def test_a_driver_killed_at_any_moment_resumes_with_one_run_per_config(tmp_path):
    sweep = Sweep(tmp_path)
    finished_before: dict = {}
    for index, moment in enumerate(KILL_MOMENTS):
        extra = ([] if index == 0 else ["--resume"]) + ([] if moment.report else ["--no-report"])
        driver = sweep.launch(*extra)
        deadline = time.monotonic() + 180
        while not moment.ready(sweep):
            assert driver.poll() is None, (f"the driver ended before the kill {moment.name!r}:\n"
                                           + (tmp_path / "driver.log").read_text()[-3000:])
            assert time.monotonic() < deadline, f"no moment {moment.name!r} in 180 s"
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started, at once
        driver.wait()
        with open(tmp_path / "driver.log", "a") as log:  # for a failure's message
            log.write(f"-- killed {moment.name} at {time.time():.2f}: {len(sweep.starts())} trial(s) started, "
                      f"{sweep.ended_since_launch()} ended in this launch\n")
        check_runs(sweep, finished_before, f"killed {moment.name}")

    resumed = subprocess.run(sweep_command(tmp_path, "--resume", "--no-report"), cwd=REPO, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "FAULT_SWEEP_MARKERS": str(sweep.markers)})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming " in resumed.stdout
    check_runs(sweep, finished_before, "at the end")

    parents, children = mlflow_runs(f"sqlite:///{tmp_path}/r.db", "R")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    reused = [r for r in children if r.data.tags.get("status") == "reused"]  # repeated proposals: not run
    assert all(r.data.tags["reused_from_trial"] != "unknown" and r.info.status == "FINISHED" for r in reused)
    trials = [r for r in children if r not in reused]
    configs = [r.data.tags["searched"] for r in trials]
    assert len(trials) == len(set(configs)) == TRIALS, sorted(configs)  # one run per proposed config
    for run in trials:  # each ended with its own result
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "finished", run.info.run_name
        x = json.loads(run.data.tags["searched"])["x"]
        assert run.data.metrics["throughput_samples_per_s"] == 100.0 + x, run.info.run_name
    # The resumed sweeps went on writing the same Optuna study: one trial per run.
    import optuna

    tags = parents[0].data.tags
    study = optuna.load_study(study_name=tags["optuna_study"], storage=tags["optuna_storage"])
    assert sorted(t.user_attrs["mlflow_run_id"] for t in study.trials) == sorted(r.info.run_id for r in trials)


def neuron_vit_command(tmp_path, *extra):
    return [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", "4", "--scheduler", "none",
            "--tracking-uri", f"sqlite:///{tmp_path}/r.db", "--experiment", "R",
            "--storage-path", str(tmp_path / "ray"), *extra]


@pytest.mark.slow
def test_resume_without_a_stopped_sweep_is_refused(tmp_path):
    done = subprocess.run(neuron_vit_command(tmp_path, "--resume"), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert (f"--resume must be a stopped run of sweep 'neuron_vit' under {tmp_path}/ray (a neuron_vit-* directory "
            "with Tune's state that did not finish); got 'none found'") in done.stderr


def test_a_resumed_searcher_learns_what_the_killed_driver_measured_and_proposes_its_cut_off_configs_first():
    from ray.tune.search import Searcher

    from accelsweep.sweeps.driver.run.searchers import (FailureAwareOptunaSearch, MeasuredRun, ResumeNews, take_reuses,
                                                    tell_resumed)

    def space(trial):
        trial.suggest_categorical("x", list(range(32)))

    searcher = FailureAwareOptunaSearch(space, metric="y", mode="max", points_to_evaluate=[{"x": 0}], seed=0,
                                        sweep_token="unit", budget=5)
    assert searcher.suggest("t1") == {"x": 0}
    searcher.suggest("t2")  # in flight when Tune saved; the kill came after it ended
    x2 = searcher._ot_trials["t2"].params["x"]
    searcher.on_trial_complete("t1", {"y": 100.0})
    # After Tune's save the killed driver ran x=7 to its end (its run has y=107) and started x=9.
    measured_after_save = MeasuredRun("gone", {"x": 7}, {"y": 107.0}, failed=False)
    tell_resumed("unit", ResumeNews(measured=[measured_after_save, MeasuredRun("t2", {"x": x2}, {"y": 50.0}, False)],
                                    again=[{"x": 9}]))
    assert searcher.suggest("t3") == {"x": 9}  # the cut-off trial's config first; x=7 is not run again
    assert searcher._outcomes[json.dumps({"x": 7})] == ("gone", 107.0)
    assert searcher._outcomes[json.dumps({"x": x2})] == ("t2", 50.0)  # told to Optuna: Tune will not
    values = sorted(t.value for t in searcher._ot_study.trials if t.value is not None)
    assert values == [50.0, 100.0, 107.0]
    fourth = searcher.suggest("t4")
    assert fourth not in ({"x": 0}, {"x": 7}, {"x": 9}, {"x": x2})
    # Five proposals in all: t1 t2 x=7 t3 t4; the search is over.
    assert searcher.suggest("t5") == Searcher.FINISHED
    take_reuses("unit")  # TPE's repeats on the way, answered as reuses: not this test's

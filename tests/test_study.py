"""The sweep's Optuna study (sweeps/driver/record/optuna_study.py): what each trial's outcome becomes
there, read back through Optuna's own API."""

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from accelsweep.sweeps.driver.run.callbacks import TrialRecord
from accelsweep.sweeps.driver.record.optuna_study import SweepStudy, default_study_storage, validate_study_storage
from accelsweep.trainables.errors import ConfigError

SPACE = {"batch_size": CategoricalDistribution([8, 16]), "precision": CategoricalDistribution(["fp32", "bf16"])}


def record(number, status, throughput=float("nan"), cost=float("nan"), error=""):
    return TrialRecord(number, f"t{number}", {"batch_size": 8 * number % 24 or 8, "precision": "bf16"}, {}, {},
                       number == 1, 0.0, run_id=f"run-{number}", status=status, error=error,
                       result={"throughput_samples_per_s": throughput, "usd_per_1m_samples": cost})


def test_each_outcome_becomes_its_optuna_state(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    study = SweepStudy(url, "s-1", [("throughput_samples_per_s", "max")], SPACE)
    assert study.record(record(1, "finished", 100.0), {1: 90.0, 2: 100.0})
    assert study.record(record(2, "stopped early", 50.0), {1: 50.0})
    assert study.record(record(3, "rejected", 10.0))
    assert study.record(record(4, "failed", error="OutOfMemoryError: x"))
    assert not study.record(record(5, "reused", 100.0))  # ran nothing: MLflow only
    assert not study.record(record(6, "interrupted"))  # runs again on --resume
    assert not study.record(record(1, "finished", 100.0))  # a resumed sweep: recorded once

    loaded = optuna.load_study(study_name="s-1", storage=url)
    trials = {t.user_attrs["trial_number"]: t for t in loaded.trials}
    assert sorted(trials) == [1, 2, 3, 4]
    assert trials[1].state == TrialState.COMPLETE and trials[1].value == 100.0
    assert trials[1].intermediate_values == {1: 90.0, 2: 100.0} and trials[1].user_attrs["baseline"] is True
    assert trials[2].state == TrialState.PRUNED and trials[2].value == 50.0
    assert trials[3].state == TrialState.PRUNED and trials[3].user_attrs["status"] == "rejected"
    assert trials[4].state == TrialState.FAIL and "OutOfMemoryError" in trials[4].user_attrs["error"]
    assert trials[1].params == {"batch_size": 8, "precision": "bf16"}
    assert loaded.best_trial.user_attrs["mlflow_run_id"] == "run-1"


def test_several_objectives_and_an_unmeasured_one(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    study = SweepStudy(url, "s-2", [("throughput_samples_per_s", "max"), ("usd_per_1m_samples", "min")], SPACE)
    study.record(record(1, "finished", 100.0, 0.5))
    study.record(record(2, "finished", 120.0))  # no price basis: NaN cost
    loaded = optuna.load_study(study_name="s-2", storage=url)
    assert [d.name for d in loaded.directions] == ["MAXIMIZE", "MINIMIZE"]
    first, second = sorted(loaded.trials, key=lambda t: t.user_attrs["trial_number"])
    assert first.state == TrialState.COMPLETE and first.values == [100.0, 0.5]
    assert second.state == TrialState.FAIL and "usd_per_1m_samples" in second.user_attrs["error"]


def test_the_study_survives_pickling_as_tune_saves_it(tmp_path):
    import pickle

    study = SweepStudy(f"sqlite:///{tmp_path}/o.db", "s-3", [("throughput_samples_per_s", "max")], SPACE)
    study.record(record(1, "finished", 1.0))
    again = pickle.loads(pickle.dumps(study))
    assert again.record(record(2, "finished", 2.0)) and len(again.study.trials) == 2


def test_where_the_study_is_kept():
    assert default_study_storage("sqlite:////data/mlflow.db", "~/ray") == "sqlite:////data/mlflow.optuna.db"
    assert default_study_storage("http://127.0.0.1:5000", "/tmp/ray") == "sqlite:////tmp/ray/optuna.db"
    assert validate_study_storage("postgresql://u:p@db/optuna").startswith("postgresql")
    with pytest.raises(ConfigError, match="study_storage must be .*; got 'postgresql://u:<redacted>@db:x'"):
        validate_study_storage("postgresql://u:secret@db:x")  # a bad port; the password is not shown
    with pytest.raises(ConfigError, match="a file: the study must outlive the sweep"):
        validate_study_storage("sqlite://")


class FlakyStudy:
    """A SweepStudy whose database answers or not (``up``), the trials it took in order
    and their per-window values."""

    def __init__(self):
        self.up, self.taken, self.windows = True, [], {}

    def record(self, record, intermediate=()):
        from sqlalchemy.exc import OperationalError

        if not self.up:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from \
                OperationalError("INSERT ...", {}, Exception("connection to server failed: Connection refused"))
        self.taken.append(record.run_id)
        self.windows[record.run_id] = dict(intermediate)
        return True

    def describe(self):
        return "Optuna study 's' in postgresql://db/optuna"


def study_callback(study, said):
    from types import SimpleNamespace

    from accelsweep.sweeps.driver.run.callbacks import SweepCallback

    tracker = SimpleNamespace(tracking_uri="sqlite:///unused.db", experiment="e", parent_run_id="p",
                              buffer=SimpleNamespace(run_id_of=lambda run_id: run_id),
                              log_metrics=lambda run_id, metrics, step: None, reopen=lambda run_id, tags: None)
    return SweepCallback(tracker, dict, lambda searched: {}, {}, None, {}, 4, print_line=said.append, study=study)


def test_a_study_database_that_does_not_answer_keeps_the_trials_and_gets_them_in_order():
    from accelsweep.sweeps.driver.record.tracking_buffer import PLACEHOLDER_PREFIX

    study, said = FlakyStudy(), []
    callback = study_callback(study, said)
    for number in (1, 2, 3):
        callback.records[f"t{number}"] = record(number, "finished", 100.0)
    callback._record_in_study(callback.records["t1"])
    study.up = False
    callback._record_in_study(callback.records["t2"])
    assert study.taken == ["run-1"] and callback.study_pending == ["t2"]
    assert "did not answer" in said[-1] and "kept" in said[-1], said
    assert "Connection refused" in said[-1] and "invalid data" not in said[-1], said  # the database's words, not Optuna's
    # A run created while MLflow's store was away: its study trial waits for the real id.
    callback.records["t3"].run_id = PLACEHOLDER_PREFIX + "abc"
    study.up = True
    callback._record_in_study(callback.records["t3"])
    assert study.taken == ["run-1", "run-2"] and callback.study_pending == ["t3"]
    assert "answers again" in said[-1]
    callback.records["t3"].run_id = "run-3"  # as adopt_run_ids sets it once MLflow took the creation
    callback.write_pending_study()
    assert study.taken == ["run-1", "run-2", "run-3"] and callback.study_pending == []
    assert callback.get_state()["study_pending"] == []


def test_a_study_that_refuses_a_write_is_given_up_once_and_the_pending_kept_for_resume():
    study, said = FlakyStudy(), []
    callback = study_callback(study, said)
    callback.records["t1"] = record(1, "finished", 100.0)
    study.record = lambda record, intermediate=(): (_ for _ in ()).throw(ValueError("value out of range"))
    callback._record_in_study(callback.records["t1"])
    assert callback.study is None and callback.study_pending == []
    assert "could not be written" in said[-1] and "value out of range" in said[-1]
    # Pending writes travel with Tune's state: --resume writes them.
    other = study_callback(FlakyStudy(), [])
    other.set_state({"records": {"t1": record(1, "finished", 100.0)}, "parent_run_id": "p",
                     "study_pending": ["t1"]})
    other.write_pending_study(force=True)
    assert other.study.taken == ["run-1"] and other.study_pending == []


def test_each_windows_figures_travel_with_tunes_state_to_the_study_and_the_scheduler():
    """Tune saves the callback's state, not the scheduler's: --resume gives the restored
    scheduler the windows of every trial that had ended (schedulers.TrustedWindowsOnly.replay),
    and a study write left pending by the stopped driver still has the trial's per-window
    values. A window keeps only what they read; a trial that starts again reports anew."""
    import pickle
    from types import SimpleNamespace

    import numpy

    callback = study_callback(FlakyStudy(), [])
    callback.records["t1"] = record(1, "finished", 110.0)
    callback.records["t2"] = record(2, "running", 50.0)  # running at the stop: Tune runs it again
    trial, running = SimpleNamespace(trial_id="t1"), SimpleNamespace(trial_id="t2")
    for step, figure in ((1, 90.0), (2, numpy.float32(110.0))):  # a user's trainable may report numpy's
        callback.on_trial_result(step, [], trial, {"training_iteration": step, "throughput_samples_per_s": figure,
                                                   "window_contended": 0.0, "node_ip": "10.0.0.1", "date": "today",
                                                   "step_time_p50_s": 0.1})
    callback.on_trial_result(3, [], trial, {"training_iteration": 3, "windows_done": 2, "nan_capture_path": "x",
                                            "throughput_samples_per_s": 0.0})  # a NaN capture's: not a window
    callback.on_trial_result(1, [], running, {"training_iteration": 1, "throughput_samples_per_s": 50.0})
    state = pickle.loads(pickle.dumps(callback.get_state()))  # as Tune saves it

    class Scheduler:
        replayed = None

        def replay(self, windows):
            self.replayed = windows

    resumed = study_callback(FlakyStudy(), [])
    resumed.scheduler = Scheduler()
    resumed.set_state({**state, "study_pending": ["t1"]})
    assert resumed.scheduler.replayed == {"t1": {1: {"training_iteration": 1, "throughput_samples_per_s": 90.0,
                                                     "window_contended": 0.0},
                                                 2: {"training_iteration": 2, "throughput_samples_per_s": 110.0,
                                                     "window_contended": 0.0}}}
    resumed.write_pending_study(force=True)
    assert resumed.study.windows == {"run-1": {1: 90.0, 2: 110.0}}
    assert "scheduler" not in {k for k, v in resumed.__getstate__().items() if v is not None}  # this driver's
    assert set(resumed.window_results) == {"t1", "t2"}
    resumed.on_trial_start(1, [], running)  # t2 runs again, in its run, from its first window
    assert set(resumed.window_results) == {"t1"}
    # A callback pickled before it kept windows (a sweep an earlier version started) still takes results.
    saved_then = {k: v for k, v in callback.__getstate__().items()
                  if k not in ("window_results", "window_figures", "scheduler")}
    old = type(callback).__new__(type(callback))
    old.__setstate__(saved_then)  # what unpickling it does
    old._tracker = callback._tracker
    old.on_trial_result(1, [], trial, {"training_iteration": 1, "throughput_samples_per_s": 1.0})
    assert old.window_results == {"t1": {1: {"training_iteration": 1.0, "throughput_samples_per_s": 1.0}}}

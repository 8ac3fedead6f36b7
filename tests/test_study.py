"""The sweep's Optuna study (sweeps/driver/study.py): what each trial's outcome becomes
there, read back through Optuna's own API."""

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from accelsweep.sweeps.driver.callbacks import TrialRecord
from accelsweep.sweeps.driver.study import SweepStudy, default_study_storage, validate_study_storage
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

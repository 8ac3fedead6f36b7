"""The recording-cost benchmark (benchmarks/recording_cost.py) at tiny sizes, on sqlite
only: it reports trials/s and the driver's write seconds per trial, counts a write that
fails (and a study the driver gives up on) as failed, and judges both against the target.
No timing is asserted: on 2 shared cores it is noise."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import recording_cost
from benchmarks.recording_cost import TARGET_TRIALS_PER_S, main, measure_writes, open_store, passes


@pytest.mark.slow  # 15-25 s here, most of it describing the machine (torch's import): the next test is quick
def test_a_quick_run_reports_trials_per_second_and_no_failed_writes(tmp_path, capsys, monkeypatch):
    from accelsweep.sweeps.driver.record import tracking

    monkeypatch.setattr(tracking, "HOLD_S", 600.0)  # a slow write must not split a trial's batch here
    out = tmp_path / "recording.json"
    report = main(["--quick", "--stores", "sqlite", "--modes", "writes", "--concurrency", "1,2", "--reruns", "0",
                   "--out", str(out)])
    rows = report["rows"]
    assert [(r["store"], r["mode"], r["concurrency"]) for r in rows] == [("sqlite", "writes", 1),
                                                                          ("sqlite", "writes", 2)]
    for row in rows:
        assert "error" not in row, row
        assert row["trials"] == 4 and row["study_records"] == 4
        assert row["failed_writes"] == 0, row["failures"]
        assert row["trials_per_s"] > 0 and math.isfinite(row["trials_per_s"])
        assert 0 < row["write_s_per_trial"] <= row["wall_s"] / row["trials"] + 1e-9
        assert row["recording_limited_trials_per_s"] == pytest.approx(1 / row["write_s_per_trial"])
        # 4 trials, each a create, one batch (its params, both windows and its final
        # figures, held together: tracking.HOLD_S) and the end
        assert row["writes_sent"] == 4 * 3
        assert row["passed"] is (row["recording_limited_trials_per_s"] >= TARGET_TRIALS_PER_S)
        assert {"load_1m_before", "load_1m_after", "others_cores_mean"} <= set(row)
    saved = json.loads(out.read_text())
    assert saved["machine"]["cpu_model"] and saved["machine"]["versions"]["mlflow"]
    table = (tmp_path / "recording.txt").read_text()
    assert "rec-limited/s" in table and "trials/s" in table and table.count("sqlite        writes") == 2
    assert "target: recording-limited rate >= 10 trials/s" in capsys.readouterr().out


def test_a_write_that_fails_and_a_study_given_up_are_counted(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from accelsweep.sweeps.driver.record.optuna_study import SweepStudy

    store = open_store("sqlite", str(tmp_path), print)
    calls = {"n": 0}
    log_batch = MlflowClient.log_batch

    def second_batch_refused(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # refused, not unanswered: the buffer does not keep it
            raise MlflowException("refused by the test", error_code="INVALID_PARAMETER_VALUE")
        return log_batch(self, *args, **kwargs)

    def study_down(self, record, intermediate=()):
        raise RuntimeError("the study's database is gone")

    monkeypatch.setattr(MlflowClient, "log_batch", second_batch_refused)
    monkeypatch.setattr(SweepStudy, "record", study_down)
    row = measure_writes(store, concurrency=2, trials=2, windows=2, scratch=str(tmp_path))
    failed = row["failed_by_kind"]
    assert failed["raised"] >= 2  # the refused batch (its tracker call) and the study's write
    assert row["sends_failed"] >= 1
    # one trial has no run (its start's batch refused), the other's run lacks its study trial
    assert failed["runs_missing"] >= 1 and failed["study_dropped"] == 1 and failed["study_trials_missing"] == 2
    assert row["failed_writes"] == sum(failed.values()) > 0
    assert any("refused by the test" in line for line in row["failures"])
    assert passes(row) is False
    # still a rate: what was written, it was written in
    assert row["trials"] == 2 and row["trials_per_s"] > 0 and row["write_s_per_trial"] > 0


def test_clean_writes_are_a_rate_with_no_failures(tmp_path, monkeypatch):
    from accelsweep.sweeps.driver.record import tracking

    monkeypatch.setattr(tracking, "HOLD_S", 600.0)  # a trial's writes after its create: one batch, the end
    row = measure_writes(open_store("sqlite", str(tmp_path), print), concurrency=2, trials=2, windows=2,
                         scratch=str(tmp_path))
    assert row["failed_writes"] == 0 and row["sends_failed"] == 0, row["failures"]
    assert row["study_records"] == 2 and row["writes_sent"] == 2 * 3
    assert row["trials_per_s"] > 0 and row["recording_limited_trials_per_s"] == pytest.approx(
        1 / row["write_s_per_trial"])


def test_an_unknown_store_or_mode_is_refused():
    from accelsweep.trainables.errors import ConfigError

    with pytest.raises(ConfigError, match="--stores"):
        main(["--stores", "sqlite,nosuch"])
    with pytest.raises(ConfigError, match="--modes"):
        main(["--modes", "fast"])
    assert recording_cost.STORES == ("sqlite", "server-sqlite", "team-store")

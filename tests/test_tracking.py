import pytest

from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.record.tracking import SweepTracker, validate_tracking_uri


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "http://127.0.0.1:5000", "https://mlflow.example.com",
                                 "postgresql+psycopg2://u@db/mlflow", "databricks"])
def test_accepted_uris(uri):
    if uri == "databricks":
        pytest.skip("a bare profile name has no scheme; use databricks://profile")
    assert validate_tracking_uri(uri) == uri


@pytest.mark.parametrize("uri, fragment", [
    ("./mlruns", "refuses the file store"),
    ("file:///tmp/mlruns", "refuses the file store"),
    ("sqlite://mlflow.db", "three slashes"),
    ("sqlite:///no/such/dir/m.db", "does not exist"),
    ("htp://host:5000", "scheme sqlite, http"),
    ("http://", "http(s)://host:port"),
    ("", "scheme sqlite"),
])
def test_refused_uris_say_why(uri, fragment):
    with pytest.raises(ConfigError) as caught:
        validate_tracking_uri(uri)
    assert caught.value.field == "tracking_uri"
    assert fragment in str(caught.value) and repr(uri) in str(caught.value)


def test_parent_and_nested_runs(tmp_path):
    tracker = SweepTracker(f"sqlite:///{tmp_path}/m.db", "exp")
    parent = tracker.start_sweep("sweep", {"seed": 0}, {"kind": "sweep"})
    child = tracker.start_trial("trial-001", {"batch_size": 8}, {"status": "running"})
    tracker.log_metrics(child, {"throughput_samples_per_s": 10.0, "device": "cpu"}, step=1)
    tracker.finish(child, "FINISHED", metrics={"final_loss": float("nan")}, tags={"status": "finished"})
    run = tracker.client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.params["batch_size"] == "8"
    assert run.data.metrics["throughput_samples_per_s"] == 10.0
    assert "device" not in run.data.metrics  # strings are not metrics
    assert run.info.status == "FINISHED"

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


def test_a_trials_params_and_windows_go_out_with_its_next_write(tmp_path, monkeypatch):
    """Held (tracking.HOLD_S): a trial's params and window results wait for its next write
    (three requests a short trial, not six); held longer than HOLD_S, the step sends them;
    the sweep's end sends everything held, and every value arrives."""
    from accelsweep.sweeps.driver.record import tracking

    tracker = SweepTracker(f"sqlite:///{tmp_path}/m.db", "exp")
    parent = tracker.start_sweep("sweep", {"seed": 0}, {"kind": "sweep"})
    sent: list[str] = []
    apply = tracker.buffer._apply
    monkeypatch.setattr(tracker.buffer, "_apply", lambda op: (sent.append(op["op"]), apply(op))[1])

    short = tracker.start_trial("trial-001", {"batch_size": 8}, {"status": "running"})
    tracker.log_metrics(short, {"throughput_samples_per_s": 10.0}, step=1)
    tracker.log_metrics(short, {"throughput_samples_per_s": 12.0}, step=2)
    tracker.flush_due()  # within HOLD_S: nothing goes out
    assert sent == ["create_run"]
    tracker.finish(short, "FINISHED", metrics={"throughput_samples_per_s": 12.0, "wall_s": 3.0}, step=2,
                   tags={"status": "finished"})
    assert sent == ["create_run", "log_batch", "set_terminated"]
    history = tracker.client.get_metric_history(short, "throughput_samples_per_s")
    assert sorted((m.step, m.value) for m in history)[:2] == [(1, 10.0), (2, 12.0)]
    assert tracker.client.get_run(short).data.params["batch_size"] == "8"

    sent.clear()
    long = tracker.start_trial("trial-002", {"batch_size": 16}, {"status": "running"})
    monkeypatch.setattr(tracking, "HOLD_S", 0.0)  # its params have waited long enough
    tracker.flush_due()
    assert sent == ["create_run", "log_batch"]
    assert tracker.client.get_run(long).data.params["batch_size"] == "16"  # seen in the UI while it runs
    monkeypatch.setattr(tracking, "HOLD_S", 600.0)
    tracker.log_metrics(long, {"throughput_samples_per_s": 20.0}, step=1)
    tracker.finish(parent, "KILLED")  # the sweep ends (stopped): what the trial held goes out first
    assert [m.value for m in tracker.client.get_metric_history(long, "throughput_samples_per_s")] == [20.0]
    assert sent[-2:] == ["log_batch", "set_terminated"] and sent.count("log_batch") == 2


def test_outside_databricks_mlflow_stops_asking_before_each_request_whether_it_runs_there():
    from mlflow.tracking.request_header import registry
    from mlflow.tracking.request_header.databricks_request_header_provider import DatabricksRequestHeaderProvider

    from accelsweep.sweeps.driver.record.tracking import drop_databricks_probe

    providers = registry._request_header_provider_registry._registry
    kept = list(providers)
    try:
        assert any(isinstance(p, DatabricksRequestHeaderProvider) for p in providers)
        drop_databricks_probe()
        assert not any(isinstance(p, DatabricksRequestHeaderProvider) for p in providers)
        assert "User-Agent" in registry.resolve_request_headers()  # MLflow's own headers still sent
    finally:
        providers[:] = kept


def test_on_databricks_its_request_headers_are_kept(monkeypatch):
    from mlflow.tracking.request_header import registry
    from mlflow.tracking.request_header.databricks_request_header_provider import DatabricksRequestHeaderProvider

    from accelsweep.sweeps.driver.record.tracking import drop_databricks_probe

    monkeypatch.setattr(DatabricksRequestHeaderProvider, "in_context", lambda self: True)
    providers = registry._request_header_provider_registry._registry
    kept = list(providers)
    try:
        drop_databricks_probe()
        assert any(isinstance(p, DatabricksRequestHeaderProvider) for p in providers)
    finally:
        providers[:] = kept

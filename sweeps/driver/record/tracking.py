"""MLflow: one parent run per sweep, one nested run per trial.

The sweep's writes to MLflow go through here, in the driver's process, so a sqlite store
has one writer and trial processes never open it. Every param and
tag passes ``secrets.scrub`` on its way out: no credential from the
environment, and no URI password, reaches the store. Its writes go through a
TrackingBuffer (tracking_buffer.py): kept in order, and saved, while the store does not
answer. A trial's params and window results are held up to ``HOLD_S`` and go out with its
next write: one request instead of several.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time
from typing import Any, Callable, Mapping, Optional
from urllib.parse import urlparse

from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.record.secrets import (credentials_to_environment, redact_text, redact_uri, scrub,
                                                     secret_values, shown_uri)
from accelsweep.sweeps.driver.record.sqlite_store import open_experiment
from accelsweep.sweeps.driver.record.tracking_buffer import DEFAULT_WAIT_S, TrackingBuffer, said_of, unanswered

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# MLflow prints "View run NAME at: URL" and "View experiment at: URL" on stdout each time
# a run against a server ends (mlflow/tracking/_tracking_service/client.py, _log_url,
# called by set_terminated; MLflow 3.17.2), the URL built from the tracking URI: one line
# per trial, and the URI may carry credentials. It honours this variable.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

# Backends MLflow 3.17 accepts for tracking. The file store (./mlruns, file://) is
# refused by MLflow itself, so it is refused here, before any trial runs.
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
_MAX_PARAM_LENGTH = 6000
_MAX_TAG_LENGTH = 8000
# How long a trial's params and window results may wait to go out with its next write
# (the cut of Tune's loop, the callback's step, sends them at the latest). A short
# trial's six writes (run, params, two results, final figures, end) become three: less of
# the driver's time through an MLflow server on sqlite, none measurable on the team store,
# whose cost is each request's database work (docs/team-store.md has the figures). In the
# UI a window shows a second late.
HOLD_S = 1.0


def validate_tracking_uri(uri: str) -> str:
    allowed = f"a URI with scheme {', '.join(TRACKING_SCHEMES)} (e.g. sqlite:///mlflow.db)"
    if not isinstance(uri, str) or not uri:
        raise ConfigError("tracking_uri", allowed, uri)
    shown = redact_uri(uri)  # error messages end up in logs
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0]  # postgresql+psycopg2://...
    if scheme in ("", "file") or re.match(r"^[A-Za-z]:[\\/]", uri):
        mangled = re.match(rf"^({'|'.join(TRACKING_SCHEMES)})(?=[:/])", uri)
        hint = (f"It starts with {mangled.group(1)!r} but not {mangled.group(1) + '://'!r}: a character is "
                "missing." if mangled and scheme == "" else
                "MLflow 3.17 refuses the file store; use sqlite:///mlflow.db for a local file.")
        raise ConfigError("tracking_uri", allowed, shown, hint)
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError("tracking_uri", allowed, shown)
    if scheme == "sqlite":
        if not uri.startswith("sqlite:///") or len(uri) == len("sqlite:///"):
            raise ConfigError("tracking_uri", "sqlite:///<path> (three slashes, then a file path)", shown)
        directory = os.path.dirname(os.path.abspath(uri[len("sqlite:///"):])) or "."
        if not os.path.isdir(directory):
            raise ConfigError("tracking_uri", "a sqlite file in an existing directory", shown,
                              f"Directory {directory!r} does not exist.")
    elif scheme in ("http", "https") and not parsed.netloc:
        raise ConfigError("tracking_uri", "http(s)://host:port", shown)
    return uri


DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # where $MLFLOW_TRACKING_URI names no store


def add_tracking_uri_flag(parser: argparse.ArgumentParser) -> None:
    """``--tracking-uri``, the same in every command that reads or writes the record."""
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI,
                        help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI})")


def mlflow_client(tracking_uri: str):
    """An MlflowClient on ``tracking_uri`` (checked first): how what reads the record after
    a sweep (its history, reports, comparisons, a study's own figures, benchmarks) reaches
    the store."""
    from mlflow.tracking import MlflowClient  # MLflow loads when the record is read, not with this module

    return MlflowClient(tracking_uri=validate_tracking_uri(tracking_uri))


def param_value(value: Any) -> str:
    """A value as an MLflow param: its text, cut to the length MLflow keeps."""
    return str(value)[:_MAX_PARAM_LENGTH]


def _metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a result, as MLflow metrics (NaN kept: it means unknown)."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v)}


def drop_databricks_probe() -> None:
    """Before each request to a server, MLflow asks whether it runs on Databricks: its
    header provider tries to import Databricks' runtime and PySpark, which are searched for
    again at every try (1.3 ms a request in a sweep's driver, with three a trial). Outside
    Databricks the answer cannot change within a process: asked once here, the provider is
    dropped where it is no. (MLflow's registry is private: where it has moved, nothing is
    dropped.)"""
    try:
        from mlflow.tracking.request_header import registry
        from mlflow.tracking.request_header.databricks_request_header_provider import \
            DatabricksRequestHeaderProvider

        providers = registry._request_header_provider_registry._registry
    except (ImportError, AttributeError):
        return
    for provider in list(providers):
        if isinstance(provider, DatabricksRequestHeaderProvider) and not provider.in_context():
            providers.remove(provider)


class SweepTracker:
    def __init__(self, tracking_uri: str, experiment: str):
        import mlflow

        # A server's user and password go to MLflow's own variables (secrets.py): the URI
        # kept, and copied into Tune's pickled state by the sweep callback, has none.
        self.tracking_uri = credentials_to_environment(validate_tracking_uri(tracking_uri))
        self._entities = mlflow.entities
        # Safe against other processes opening, or creating, the same store (sqlite_store.py).
        self.client, self.experiment_id = open_experiment(self.tracking_uri, experiment,
                                                          artifact_location(self.tracking_uri))
        self.experiment = experiment
        self.parent_run_id: Optional[str] = None
        self._held: dict[str, _Held] = {}  # run id -> what waits for its next write
        # Every write goes through it: kept in order while the store does not answer. A
        # server's answers are waited for behind the driver (tracking_buffer.py), so a trial's
        # requests through the team store cost the driver little of its time (measured in
        # docs/team-store.md); a database the driver writes itself is its own CPU either way.
        behind = urlparse(self.tracking_uri).scheme in ("http", "https", "databricks")
        if behind:
            drop_databricks_probe()
        self.buffer = TrackingBuffer(self.client, redact_uri(self.tracking_uri), behind=behind)

    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        self.parent_run_id = self.buffer.create_run(self.experiment_id, name, scrub(tags))
        self._log(self.parent_run_id, params=params)
        return self.parent_run_id

    def start_trial(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        tags = {"mlflow.parentRunId": self.parent_run_id, **tags}
        run_id = self.buffer.create_run(self.experiment_id, name, scrub(tags))
        self._hold(run_id, params=params)
        return run_id

    def reopen(self, run_id: str, tags: Mapping[str, str] = ()) -> None:
        """A run that goes on (a resumed sweep or a restarted trial): RUNNING again."""
        self.flush(run_id)
        self.buffer.update_run(run_id, "RUNNING")
        self._log(run_id, tags=dict(tags))

    def trial_runs(self, only_running: bool = False) -> dict[str, dict[str, str]]:
        """This sweep's trial runs (run id -> tags); ``only_running``: those still
        RUNNING, of which none may be left when the sweep ends."""
        self.flush()
        self.buffer.settle()
        query = f"tags.mlflow.parentRunId = '{self.parent_run_id}'"
        if only_running:
            query += " and attributes.status = 'RUNNING'"
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=10000)
        return {run.info.run_id: dict(run.data.tags) for run in runs}

    def log_artifact(self, run_id: str, path: str, artifact_path: Optional[str] = None) -> None:
        self.flush(run_id)
        self.buffer.log_artifact(run_id, path, artifact_path)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        """``text`` as the run's artifact ``name``. Written to a file first, beside the
        buffer's own (the sweep's experiment dir), which outlasts the call: a write kept
        while the store is away is made from it later."""
        import tempfile

        folder = os.path.join(self.buffer.folder or tempfile.gettempdir(), "artifacts", run_id)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w") as out:
            out.write(redact_text(text, secret_values()))  # a trial may print what it was given
        self.log_artifact(run_id, path)

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
        """A window's figures: held, to go out with the run's next write (``HOLD_S``)."""
        self._hold(run_id, metrics=metrics, step=step)

    def finish(self, run_id: str, status: str, metrics: Mapping[str, Any] = (),
               tags: Mapping[str, str] = (), step: int = 0) -> None:
        """End a run; its final figures are logged at ``step`` (a trial's last window).
        The parent's end is the sweep's: every run's held writes go out before it."""
        assert status in RUN_STATUSES, status
        if run_id == self.parent_run_id:
            self.flush()
        self._log(run_id, metrics=dict(metrics), tags=dict(tags), step=step)
        self.buffer.set_terminated(run_id, status)
        if run_id == self.parent_run_id:
            self.buffer.settle()  # the sweep's record is whole when its end returns

    def flush(self, run_id: Optional[str] = None) -> None:
        """Send what is held, for ``run_id`` or for every run."""
        for held_run in [run_id] if run_id is not None else list(self._held):
            if held_run in self._held:
                self._log(held_run)

    def flush_due(self) -> None:
        """Send what has been held ``HOLD_S`` or longer (the callback calls this each step)."""
        now = time.monotonic()
        for run_id in [run for run, held in self._held.items() if now - held.since >= HOLD_S]:
            self._log(run_id)

    def _hold(self, run_id: str, params: Mapping[str, Any] = (), metrics: Mapping[str, Any] = (),
              step: int = 0) -> None:
        held = self._held.setdefault(run_id, _Held(time.monotonic()))
        held.add(self._batch(params=params, metrics=metrics, step=step))

    def _log(self, run_id: str, params: Mapping[str, Any] = (), metrics: Mapping[str, Any] = (),
             tags: Mapping[str, str] = (), step: int = 0) -> None:
        """One log_batch: what is held for the run, then these; none when both are empty."""
        batch = self._held.pop(run_id, _Held(0.0))
        batch.add(self._batch(params=params, metrics=metrics, tags=tags, step=step))
        if batch.metrics or batch.params or batch.tags:
            self.buffer.log_batch(run_id, metrics=list(batch.metrics.values()), params=list(batch.params.values()),
                                  tags=list(batch.tags.values()))

    def _batch(self, params: Mapping[str, Any] = (), metrics: Mapping[str, Any] = (),
               tags: Mapping[str, str] = (), step: int = 0) -> "_Held":
        entities = self._entities
        now = int(time.time() * 1000)
        batch = _Held(0.0)
        batch.metrics = {(k, step, now): entities.Metric(k, v, now, step) for k, v in _metrics(dict(metrics)).items()}
        batch.params = {k: entities.Param(k, param_value(v)) for k, v in scrub(dict(params)).items()}
        batch.tags = {k: entities.RunTag(k, str(v)[:_MAX_TAG_LENGTH]) for k, v in scrub(dict(tags)).items()}
        return batch

    def ui_command(self) -> str:
        return ui_command(self.tracking_uri)


def ui_command(tracking_uri: str) -> str:
    """How to open the store in MLflow's UI. Printed at the end of every sweep, so it lands
    in terminals and CI logs: a database password in the URI is shown as <redacted>, for
    the user to fill in. A tracking server serves the UI itself, at its own address."""
    scheme = tracking_uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        return f"open {shown_uri(tracking_uri)} in a browser (the tracking server serves MLflow's UI)"
    if scheme == "databricks":
        return "open the experiment in your Databricks workspace (Machine Learning > Experiments)"
    return f"mlflow ui --backend-store-uri {redact_uri(tracking_uri)} --host 127.0.0.1 --port 5000"


def artifact_location(tracking_uri: str) -> Optional[str]:
    """Where a new experiment of a sqlite store keeps its artifacts (reports, plots, NaN
    captures): a folder beside the database, so that the store and its artifacts move
    together and ``mlflow ui`` finds them from any directory. None (MLflow's default)
    for a server or a database server, which have their own."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = os.path.abspath(tracking_uri[len("sqlite:///"):])
    return "file://" + os.path.join(os.path.dirname(database), "mlartifacts")


class _Held:
    """A run's writes not sent yet, keyed so that one batch never names a param or tag twice,
    nor a metric twice at one step and instant (MLflow refuses those); the later value wins."""

    def __init__(self, since: float):
        self.since = since  # monotonic: when the first of them was held
        self.metrics: dict[tuple[str, int, int], Any] = {}
        self.params: dict[str, Any] = {}
        self.tags: dict[str, Any] = {}

    def add(self, other: "_Held") -> None:
        self.metrics.update(other.metrics)
        self.params.update(other.params)
        self.tags.update(other.tags)


def open_tracker(tracking_uri: str, experiment: str, wait_s: float = DEFAULT_WAIT_S,
                 say: Optional[Callable[[str], None]] = None):
    """The sweep's SweepTracker, its buffer waiting ``wait_s`` for a lost store. A store
    that does not answer now is bad input, said before anything starts."""
    try:
        tracker = SweepTracker(tracking_uri, experiment)
    except Exception as error:  # noqa: BLE001 - sorted: only an unanswered store is said so
        if not unanswered(error):
            raise
        raise ConfigError("tracking_uri", "an MLflow tracking store that answers", redact_uri(tracking_uri),
                          f"It did not ({said_of(error)}). Start it or correct the URI, then run the command again "
                          "(with --resume to go on with a stopped sweep).") from None
    tracker.buffer.wait_s = wait_s
    if say is not None:
        tracker.buffer.say = say
    return tracker

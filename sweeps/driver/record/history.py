"""A sweep read back from MLflow alone: its parent run, and its trial runs as TrialRecords.

The report (report_artifacts.py) and the comparison of sweeps (comparison.py) read sweeps this
way, also at the end of a sweep that has just run: what they show is what the store
holds, and a report rebuilt a month later from the store is the same report.

A sweep is named by its parent run's id or its run name (``neuron_vit-20261123-170102``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import TRAINING_METRICS, Metric, MetricSet
from accelsweep.sweeps.driver.record.tracking import mlflow_client, ui_command

__all__ = ["SweepHistory", "find_sweep_run", "load_sweep", "metrics_tag"]

# Parent-run tags the driver writes for the report to read back (lifecycle.py _start/_finish).
METRICS_TAG = "report.metrics"  # the trainable's MetricSet, as JSON: the table's rows and formats
KNOBS_TAG = "report.knobs"  # the searched knobs, in the space's order
SEARCHED_OUT_TAG = "searched_out"
GOAL_REACHED_TAG = "goal_reached"  # why Sweep.stop_at_utilisation ended the sweep (sweeps/driver/run/goal.py)
PHASE_TAG, CONFIRMATION = "phase", "confirmation"  # the tag and value of a confirmation trial
CONFIRM_NOTE_TAG = "confirmation_note"  # why a planned confirmation phase did not run


def metrics_tag(metrics: MetricSet) -> str:
    """A MetricSet as the parent run keeps it (METRICS_TAG)."""
    return json.dumps({"metrics": [dataclasses.asdict(m) for m in metrics.metrics],
                       "headline": list(metrics.headline)})


def _metric_set(text: Optional[str]) -> MetricSet:
    if not text:
        return TRAINING_METRICS
    declared = json.loads(text)
    return MetricSet(metrics=tuple(Metric(**m) for m in declared["metrics"]), headline=tuple(declared["headline"]))


def _value(text: str) -> Any:
    """An MLflow param back as the value it was (params are stored as str(value))."""
    for literal, value in (("True", True), ("False", False), ("None", None)):
        if text == literal:
            return value
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class SweepHistory:
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    name: str  # the parent run's name
    params: dict[str, str]
    tags: dict[str, str]
    figures: dict[str, float]  # the parent run's metrics
    records: list[TrialRecord]  # the search's trials, by trial number
    objectives: list[tuple[str, str]]  # (metric, mode), the first ranks
    knobs: list[str]
    metrics: MetricSet
    elapsed_s: float
    started_ms: int
    # The confirmation phase's trials (confirm.py), by number; and why there are none when
    # the sweep planned some (its parent run's CONFIRM_NOTE_TAG).
    confirmations: list[TrialRecord] = dataclasses.field(default_factory=list)

    @property
    def confirm_note(self) -> str:
        return self.tags.get(CONFIRM_NOTE_TAG, "")

    @property
    def title(self) -> str:
        return f"{self.tags.get('sweep', self.name)} on {self.tags.get('platform', 'unknown')}"

    @property
    def instance_type(self) -> str:
        return self.tags.get("instance_type", "unknown")

    @property
    def cost_note(self) -> str:
        return self.tags.get("cost_basis", "")

    @property
    def planned_trials(self) -> Optional[int]:
        value = _value(self.params.get("num_samples", "None"))
        return value if isinstance(value, int) else None

    @property
    def searched_out(self) -> bool:
        return self.tags.get(SEARCHED_OUT_TAG) == "true"

    @property
    def goal_reached(self) -> str:
        return self.tags.get(GOAL_REACHED_TAG, "")

    @property
    def ui_command(self) -> str:
        return ui_command(self.tracking_uri)

    def curve(self, record: TrialRecord, metric: str) -> list[tuple[int, float]]:
        """A trial's per-window values of ``metric``: (window, value), by window."""
        history = mlflow_client(self.tracking_uri).get_metric_history(record.run_id, metric)
        return sorted((point.step, point.value) for point in history)


def find_sweep_run(tracking_uri: str, ref: str):
    """The parent run of the sweep ``ref`` names (a run id, or a run name), in any
    experiment of the store. ConfigError when none or several match."""
    client = mlflow_client(tracking_uri)
    if not isinstance(ref, str) or not ref:
        raise ConfigError("sweep", "a sweep's parent run id or run name", ref)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               filter_string=f"tags.kind = 'sweep' and attributes.run_name = '{ref}'",
                               max_results=10)
    if not found:
        try:
            run = client.get_run(ref)
        except Exception:  # MLflow raises its own exception for an unknown id
            run = None
        if run is not None and run.data.tags.get("kind") == "sweep":
            found = [run]
    if len(found) != 1:
        sweeps = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                    filter_string="tags.kind = 'sweep'", max_results=20)
        names = ", ".join(r.info.run_name for r in sweeps) or "none"
        raise ConfigError("sweep", f"the run id or run name of one sweep's parent run (the newest: {names})", ref,
                          "Several runs have that name: give the run id." if found else "")
    return found[0]


def _record(run, measured_by: str) -> TrialRecord:
    tags = dict(run.data.tags)
    searched = json.loads(tags.get("searched") or "{}")
    result: dict[str, Any] = {k: v for k, v in tags.items() if not k.startswith("mlflow.")}
    result.update(run.data.metrics)
    reused_from = tags.get("reused_from_trial", "")
    return TrialRecord(
        number=int(tags.get("trial_number", 0)), trial_id=tags.get("trial_id", run.info.run_id), searched=searched,
        config={k: _value(v) for k, v in run.data.params.items()},
        resources={k[len("resource."):]: float(v) for k, v in tags.items() if k.startswith("resource.")},
        is_baseline=tags.get("baseline") == "true", created_at=run.info.start_time / 1000, run_id=run.info.run_id,
        status=tags.get("status", "unknown"), result=result, error=tags.get("error", ""),
        error_class=tags.get("error_class", ""), error_cause=tags.get("error_cause", ""),
        wall_s=float(run.data.metrics.get("wall_s", float("nan"))), retries=int(tags.get("retries", 0)),
        measured_by=measured_by, reused_from=int(reused_from) if reused_from.isdigit() else None)


def load_sweep(tracking_uri: str, ref: str) -> SweepHistory:
    """The sweep ``ref`` names (its parent run id or run name), read from the store."""
    parent = find_sweep_run(tracking_uri, ref)
    client = mlflow_client(tracking_uri)
    params, tags = dict(parent.data.params), dict(parent.data.tags)
    objectives = []
    for part in (params.get("objectives") or "max throughput_samples_per_s").split(","):
        mode, metric = part.split()
        objectives.append((metric, mode))
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=50000)
    every = sorted((_record(run, objectives[0][0]) for run in runs), key=lambda r: r.number)
    confirmations = [r for r in every if r.result.get(PHASE_TAG) == CONFIRMATION]
    records = [r for r in every if r.result.get(PHASE_TAG) != CONFIRMATION]
    knobs = json.loads(tags[KNOBS_TAG]) if KNOBS_TAG in tags else list(
        dict.fromkeys(k for r in records for k in r.searched))
    end = parent.info.end_time or parent.info.start_time
    return SweepHistory(tracking_uri=tracking_uri, experiment_id=parent.info.experiment_id,
                        parent_run_id=parent.info.run_id, name=parent.info.run_name, params=params, tags=tags,
                        figures=dict(parent.data.metrics), records=records, objectives=objectives, knobs=knobs,
                        metrics=_metric_set(tags.get(METRICS_TAG)),
                        # The driver's own count (from its start, Ray's start included), as its console said it;
                        # the run's clock for a sweep recorded before it kept one.
                        elapsed_s=parent.data.metrics.get("elapsed_s", (end - parent.info.start_time) / 1000),
                        started_ms=parent.info.start_time, confirmations=confirmations)

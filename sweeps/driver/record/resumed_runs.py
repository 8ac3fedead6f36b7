"""--resume after a killed driver: what it did after Tune's last save, read back from MLflow.

Tune saves its experiment (trials, searcher, our callback's records) every
TUNE_GLOBAL_CHECKPOINT_S; MLflow has every trial as it happened. A driver killed between two
saves leaves MLflow ahead of Tune's state: a trial Tune saved in flight may have ended since
(Tune's saved state and the searcher are told so); a trial proposed after the save may have
ended with its result (its run becomes a record of the sweep again, ``recovered``, and the
searcher learns it); or it was cut off by the kill (its config is proposed first, and the
trial of that config continues in its run, under its number). Trial numbers go on after the
highest one MLflow has (reused proposals' included), so none is given twice.

``read_stopped_sweep`` runs in lifecycle._resume, before Tune restores anything; ``take_over``
when our callback gets its saved records (or, for a sweep killed before Tune's first save, at
its first step).
"""

from __future__ import annotations

import filecmp
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Optional

from accelsweep.sweeps.driver.record.trial_record import (CUT_BY_BUDGET, FAILED, FINISHED, INTERRUPTED, REJECTED,
                                                          REUSED, STOPPED_EARLY, TrialRecord, config_key)
from accelsweep.trainables import ray_adapter

__all__ = ["LOST", "MeasuredRun", "ResumeNews", "StoppedRun", "StoppedSweep", "keep_tuner_file", "read_stopped_sweep",
           "restore_tuner_file", "resume_news", "take_over", "tell_resumed"]

# The statuses of a trial that ended with a result of its own (a failure is one: the
# config was tried); an interrupted one was cut off and runs again.
ENDED_STATUSES = (FINISHED, STOPPED_EARLY, REJECTED, FAILED, CUT_BY_BUDGET)
# How lifecycle._finish closes a run its sweep never ran again (error_class): not a result.
LOST = "Lost"
# Tune's tuner.pkl (what Tuner.restore reads), as Tune wrote it at the sweep's start. A
# resumed sweep's Tune copies it again, in place, with every save: a kill then can cut it
# short. Not named .pkl or .json: Tune's copies leave it alone.
TUNER_FILE, TUNER_COPY = "tuner.pkl", "accelsweep-tuner.copy"


@dataclass
class MeasuredRun:
    """A trial a killed driver measured after Tune's last save: its MLflow run has its
    result, Tune's saved state (and so the restored searcher) has not."""

    trial_id: str
    config: dict
    result: dict  # its MLflow metrics
    failed: bool


@dataclass
class ResumeNews:
    """What a resumed sweep's searcher must learn before its first proposal
    (sweeps/driver/record/resumed_runs.py): results its saved state lacks, and the configs of
    trials cut off by the kill, to be proposed again first."""

    measured: list[MeasuredRun] = field(default_factory=list)
    again: list[dict] = field(default_factory=list)
    # The trials in Tune's saved state (None: it saved none): the proposals that count.
    tune_trials: Optional[set[str]] = None


# ResumeNews by sweep, left by the resumed callback for the searcher it cannot reach.
_RESUME_NEWS: dict[str, ResumeNews] = {}


def tell_resumed(sweep_token: str, news: ResumeNews) -> None:
    """Have the sweep's (resumed) searcher learn ``news`` before it proposes again."""
    _RESUME_NEWS[sweep_token] = news


def resume_news(sweep_token: str) -> Optional[ResumeNews]:
    """The news left for the sweep's searcher by ``tell_resumed`` (once; None: none)."""
    return _RESUME_NEWS.pop(sweep_token, None)


def keep_tuner_file(experiment_dir: str) -> None:
    """Keep Tune's tuner.pkl aside (lifecycle._start, once the Tuner is made)."""
    shutil.copyfile(os.path.join(experiment_dir, TUNER_FILE), os.path.join(experiment_dir, TUNER_COPY + ".tmp"))
    os.replace(os.path.join(experiment_dir, TUNER_COPY + ".tmp"), os.path.join(experiment_dir, TUNER_COPY))


def restore_tuner_file(experiment_dir: str) -> None:
    """Put back the tuner.pkl kept aside where Tune's is not that one (cut short)."""
    kept, used = os.path.join(experiment_dir, TUNER_COPY), os.path.join(experiment_dir, TUNER_FILE)
    if os.path.exists(kept) and not (os.path.exists(used) and filecmp.cmp(kept, used, shallow=False)):
        shutil.copyfile(kept, used + ".tmp")
        os.replace(used + ".tmp", used)


@dataclass
class StoppedRun:
    """One trial run of the stopped sweep, as MLflow has it."""

    run_id: str
    status: str  # MLflow's: RUNNING, FINISHED, FAILED, KILLED
    tags: dict[str, str]
    metrics: dict[str, float]

    @property
    def number(self) -> int:
        try:
            return int(self.tags.get("trial_number", 0))
        except ValueError:
            return 0

    @property
    def trial_id(self) -> str:
        return self.tags.get("trial_id", "")

    @property
    def searched(self) -> Optional[dict]:
        """The config the search proposed (its ``searched`` tag); None where unreadable."""
        try:
            searched = json.loads(self.tags.get("searched", ""))
        except ValueError:
            return None
        return searched if isinstance(searched, dict) else None

    @property
    def reused(self) -> bool:
        """A reused proposal: bookkeeping (nothing ran), not a trial."""
        return self.tags.get("status") == REUSED

    @property
    def has_own_result(self) -> bool:
        """It ended with its result: finished, stopped early, rejected, cut by the time
        budget, or failed with its own error. A run still RUNNING whose final status tag
        was written counts (its driver died before closing it)."""
        if self.tags.get("error_class") == LOST:
            return False
        return self.tags.get("status") in ENDED_STATUSES

    @property
    def mlflow_status(self) -> str:
        """What it ends as in MLflow (as SweepCallback._finish closes a trial)."""
        return {FAILED: "FAILED", CUT_BY_BUDGET: "KILLED", INTERRUPTED: "KILLED"}.get(self.tags.get("status"),
                                                                                     "FINISHED")


@dataclass
class StoppedSweep:
    runs: list[StoppedRun]
    # Tune's saved state: trial id -> status; None: Tune never saved (no trial had started).
    saved_trials: Optional[dict[str, str]]


def read_stopped_sweep(experiment_dir: str, tracker) -> StoppedSweep:
    """The stopped sweep's trial runs and Tune's newest whole save (ray_adapter), repaired:
    the trials it has in flight whose runs have ended are marked ended in it, so that Tune
    does not run them again (call before ``Tuner.fit`` reads it)."""
    found = tracker.client.search_runs([tracker.experiment_id],
                                       filter_string=f"tags.mlflow.parentRunId = '{tracker.parent_run_id}'",
                                       max_results=50000)
    runs = [StoppedRun(r.info.run_id, r.info.status, dict(r.data.tags), dict(r.data.metrics)) for r in found]
    saved = ray_adapter.saved_trial_statuses(experiment_dir)
    if saved is not None:
        ray_adapter.repair_saved_state(experiment_dir, {run.trial_id for run in runs
                                                        if run.trial_id in saved and run.has_own_result})
    return StoppedSweep(runs, saved)


def take_over(callback, stopped: StoppedSweep) -> None:
    """Bring ``callback`` (a SweepCallback with the records Tune saved) up to what MLflow
    has, and leave the searcher its news (searchers.ResumeNews)."""
    callback.runs_of_saved_trials, callback.cut_off_runs = {}, []
    callback.number_floor = max([getattr(callback, "number_floor", 0), *(run.number for run in stopped.runs)])
    saved = stopped.saved_trials or {}
    for trial_id, record in list(callback.records.items()):
        if stopped.saved_trials is not None and trial_id not in saved and record.status != REUSED \
                and not record.recovered:
            # Saved a moment after Tune's trials (a kill in the midst of Tune's save): its run
            # is read back below as any run of a trial Tune does not know.
            del callback.records[trial_id]
    records_by_run = {r.run_id: r for r in callback.records.values() if r.run_id is not None}
    news = ResumeNews()
    for run in sorted(stopped.runs, key=lambda r: r.number):
        if run.reused:
            if run.status == "RUNNING":  # its driver died between the reuse's two writes
                callback.tracker.finish(run.run_id, "FINISHED", tags={"status": REUSED})
            continue
        record = records_by_run.get(run.run_id) or callback.records.get(run.trial_id)
        if run.trial_id in saved:  # a trial Tune saved
            if run.has_own_result and (record is None or record.status not in ENDED_STATUSES):
                record = _recovered(callback, run, record)  # ended after the save
            elif record is not None:
                record.run_id = run.run_id  # started after the save of its record: its run
            else:  # created in the step Tune saved, before the callback recorded it
                callback.runs_of_saved_trials[run.trial_id] = run
            continue
        if record is not None:
            continue  # a record of ours already (recovered by an earlier resume)
        if run.has_own_result:
            _recovered(callback, run, None)
        elif run.searched is not None:
            # Cut off by the kill: its config is proposed again first, and the trial of that
            # config continues in this run (SweepCallback._record).
            callback.cut_off_runs.append(run)
            news.again.append(run.searched)
            if run.tags.get("error_class"):  # closed as lost by an earlier resume: it runs now
                callback.tracker.reopen(run.run_id, tags={"error_class": "", "error": "", "error_cause": ""})
    news.measured = [MeasuredRun(r.trial_id, dict(r.searched), dict(r.result), r.status == FAILED or bool(r.error))
                     for r in callback.records.values() if r.recovered]
    news.tune_trials = None if stopped.saved_trials is None else set(stopped.saved_trials)
    tell_resumed(callback.sweep_token, news)


def _recovered(callback, run: StoppedRun, record: Optional[TrialRecord]) -> TrialRecord:
    """``run`` ended with its result after Tune's last save: the sweep's record of it, as
    MLflow has it (closed, and in the Optuna study, if the kill came before)."""
    searched = run.searched or {}
    if record is None:
        try:
            config, resources = callback.complete_config(searched), callback.resources_of(searched)
        except ValueError:
            config, resources = dict(searched), {}
        record = TrialRecord(number=run.number, trial_id=run.trial_id or run.run_id, searched=searched,
                             config=config, resources=resources, is_baseline=run.tags.get("baseline") == "true",
                             created_at=time.monotonic())
        callback.records[record.trial_id] = record
    record.number = run.number or record.number
    record.run_id, record.status, record.recovered = run.run_id, run.tags["status"], True
    record.measured_by = callback.measured_by
    record.result = {**record.result, **run.metrics}
    record.error, record.error_class = run.tags.get("error", ""), run.tags.get("error_class", "")
    record.error_cause = run.tags.get("error_cause", "")
    record.wall_s = run.metrics.get("wall_s", math.nan)
    record.curves_logged = True
    if run.status == "RUNNING":  # its driver died between its last figures and closing it
        callback.tracker.finish(run.run_id, run.mlflow_status)
    callback._record_in_study(record)  # the study skips a run it has
    callback._offer_best(record)
    return record


def run_for(callback, trial_id: str, searched: dict) -> Optional[StoppedRun]:
    """The stopped sweep's run a new Tune trial continues: its own (a trial Tune saved
    before the callback recorded it), else the first run of the same config the kill cut
    off. Taken: no other trial gets it."""
    if trial_id in callback.runs_of_saved_trials:
        return callback.runs_of_saved_trials.pop(trial_id)
    key = config_key(searched)
    for index, run in enumerate(callback.cut_off_runs):
        if config_key(run.searched or {}) == key:
            return callback.cut_off_runs.pop(index)
    return None

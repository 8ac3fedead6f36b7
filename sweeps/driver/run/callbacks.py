"""The Tune callback that turns trials into records, MLflow runs and progress lines.

It runs in the driver. It also measures what only the driver can see: a trial's wall
time from the moment Tune created it (actor start and imports included) to its end,
and from that the trial's overhead (wall time outside the training loop) and its cost.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import statistics
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ray.tune import Callback
from ray.tune.result import AUTO_RESULT_KEYS

from accelsweep.sweeps.driver.record.database_errors import database_unanswered
from accelsweep.sweeps.driver.run import fair_share
from accelsweep.sweeps.driver.run.deadline import TrialDeadline
from accelsweep.sweeps.driver.define.first_guess import LABEL as GUESS_LABEL
from accelsweep.sweeps.driver.record.trial_record import (CUT_BY_BUDGET, FAILED, FINISHED, INTERRUPTED, NOISE_METRICS,
                                                          REJECTED, REUSED, STOPPED_EARLY, TrialRecord, config_key,
                                                          host_loaded, host_slowdown)
from accelsweep.sweeps.driver.run.searchers import local_proposals, take_reuses
from accelsweep.trainables.cost import CostBasis, trial_cost_usd
from accelsweep.trainables.loop.failures import ERROR, failure_cause, one_line
from accelsweep.trainables.metrics import CONTENTION_METRICS, TRAINING_METRICS, MetricSet
from accelsweep.trainables.harness.microbench import NOISY_CV
from accelsweep.sweeps.driver.record.resumed_runs import ENDED_STATUSES, run_for, take_over
from accelsweep.sweeps.driver.record.secrets import redact_text, redact_uri, secret_values
from accelsweep.sweeps.driver.record.tracking import SweepTracker
from accelsweep.sweeps.driver.record.tracking_buffer import PLACEHOLDER_PREFIX, RETRY_EVERY_S

# What Tune adds to every result (iteration counts, pid, host, clocks): its bookkeeping,
# not the trial's figures; kept out of MLflow.
TUNE_BOOKKEEPING = frozenset(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "should_checkpoint"}

__all__ = ["CUT_BY_BUDGET", "FAILED", "FINISHED", "INTERRUPTED", "REJECTED", "REUSED", "STOPPED_EARLY",
           "SweepCallback", "TrialRecord", "result_tags", "trial_figures"]


def _error_of(trial) -> tuple[str, str, str]:
    """(exception class, last line of its message, cause) for a failed Tune trial, read from
    the error files Tune has just written in the driver's staging directory (they reach
    the storage path only at the next sync)."""
    import ray.cloudpickle as cloudpickle

    error = None
    path = trial.pickled_error_file
    if path and os.path.exists(path):
        with open(path, "rb") as pickled:
            error = cloudpickle.load(pickled)
    cause = getattr(error, "cause", None) or error  # RayTaskError wraps the trial's exception
    if cause is not None:
        name = type(cause).__name__
        if name.startswith("RayTaskError(") and name.endswith(")"):
            name = name[len("RayTaskError("):-1]
        return name, one_line(cause), failure_cause(cause)
    return "UnknownError", "the trial failed and Tune left no error file", ERROR


def _step_of(result: Mapping[str, Any]) -> int:
    """The MLflow step of a result: its window (Tune's iteration); 0 before any report."""
    return int(result.get("windows_done", result.get("training_iteration", 0)) or 0)


def trial_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result without Tune's bookkeeping: what the trial itself measured and said."""
    return {k: v for k, v in result.items() if k not in TUNE_BOOKKEEPING}


def result_tags(result: Mapping[str, Any]) -> dict[str, str]:
    """The text a trainable reported (a device name, a timer, a reason): MLflow tags, as
    numbers are metrics. A trainable sets a tag of its own by reporting a string."""
    return {k: v for k, v in trial_figures(result).items() if isinstance(v, str)}


# A trial's output as an artifact of its run (trainables/trial_progress.py).
TRIAL_OUTPUT = "trial-output.log"
# How often a quiet trial's phase is said, and after how long quiet.
PROGRESS_EVERY_S = 10.0
SHOWN_OUTPUT_LINES = 30


def shown_output(output: str, whole: bool = False) -> str:
    """A trial's output for the console, indented under its line: its last
    SHOWN_OUTPUT_LINES lines (a failure's reason is at the end), or all of it."""
    lines = output.rstrip().splitlines()
    head = f"  | {TRIAL_OUTPUT} (kept in the trial's MLflow run)"
    if not whole and len(lines) > SHOWN_OUTPUT_LINES:
        head += f": its last {SHOWN_OUTPUT_LINES} of {len(lines)} lines"
        lines = lines[-SHOWN_OUTPUT_LINES:]
    return "\n".join([head, *(f"  | {line}" for line in lines)])


def _first_cause(error: BaseException) -> BaseException:
    """What went wrong first: Optuna wraps a database's error in a StorageInternalError
    that blames "invalid data", and SQLAlchemy wraps the driver's (``orig``), whose own
    words say why (``connection refused``, ``too many clients``)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return getattr(error, "orig", None) or error


def window_figure_names(curves: Sequence[str]) -> tuple[str, ...]:
    """What a window's result keeps for --resume (SweepCallback.window_results): what the
    schedulers (schedulers.py) and the study read of it, not all of its figures: it is
    pickled at each of Tune's saves."""
    return tuple(dict.fromkeys(["training_iteration", "windows_done", "window_contended", "host_probe_s",
                                *NOISE_METRICS, *curves]))


def _searched_key(searched: Mapping[str, Any]) -> str:
    return json.dumps(dict(searched), sort_keys=True, default=str)


class SweepCallback(Callback):
    def __init__(self, tracker: SweepTracker, complete_config: Callable[[Mapping], dict],
                 resources_of: Callable[[Mapping], dict], baseline: Mapping[str, Any],
                 cost: Optional[CostBasis], trial_tags: Mapping[str, str], total_trials: int,
                 print_line: Optional[Callable[[str], None]] = None, time_budget_s: Optional[float] = None,
                 metrics: Optional[MetricSet] = None, objective_metrics: Sequence[str] = (),
                 board_name: Optional[str] = None, sweep_token: str = "", study=None):
        self._tracker = tracker
        self.metrics = metrics or TRAINING_METRICS  # the sweep's (its trainable's): curves, progress lines
        # The first objective ranks a trial (TrialRecord.has_measurement); every objective
        # is an MLflow curve, declared one or not.
        self.measured_by = objective_metrics[0] if objective_metrics else self.metrics.measurement
        # Every trial's windows carry their contention (trainables/contention.py), whatever its trainable declares.
        self.curves = tuple(dict.fromkeys([*self.metrics.curves, *objective_metrics,
                                           *(m.name for m in CONTENTION_METRICS if m.curve)]))
        self.window_figures = window_figure_names([self.measured_by, *self.curves])
        self.tracking_uri, self.experiment = tracker.tracking_uri, tracker.experiment
        self.parent_run_id = tracker.parent_run_id
        self.time_budget_s = time_budget_s
        self.started_at = time.time()
        self.complete_config = complete_config
        self.resources_of = resources_of
        self.baseline = dict(baseline)
        self.cost = cost
        self.trial_tags = dict(trial_tags)
        self.total_trials = total_trials
        self.print_line = print_line
        self.records: dict[str, TrialRecord] = {}
        # On --resume (resumed_runs.py): what a killed driver did after Tune's last save, read
        # from MLflow (set by lifecycle._resume, taken with the saved records); the runs that new
        # Tune trials continue (their own, by trial id; one cut off by the kill, by config);
        # the highest trial number MLflow has (numbers go on after it: none is given twice).
        self.stopped = None
        self.runs_of_saved_trials: dict[str, Any] = {}
        self.cut_off_runs: list = []
        self.number_floor = 0
        # The sweep's best so far, for its trials' rejection rule (trainables/loop/rejection.py),
        # a Ray actor looked up by name; and where its searcher leaves reused proposals.
        self.board_name, self._board = board_name, None
        self.sweep_token = sweep_token
        # The sweep's Optuna study in a database (optuna_study.py SweepStudy): each ended trial is
        # written there too, with its first objective's per-window values.
        self.study = study
        # Trials ended whose study write waits: for its MLflow run's real id (created while
        # MLflow's store did not answer), or for the study's database to answer again.
        # Written in order as soon as it can be (write_pending_study); kept with Tune's state,
        # so --resume writes what a stopped driver could not.
        self.study_pending: list[str] = []
        self._study_tried_at = -math.inf
        self._study_lost_said = False
        # trial id -> window -> the numbers its result held: kept with Tune's state, so that
        # --resume hands the scheduler (which Tune does not save) and the study what they had.
        self.window_results: dict[str, dict[int, dict[str, float]]] = {}
        self.scheduler = None  # on --resume, the restored scheduler (lifecycle._resume): replays them
        self._peak: dict[str, float] = {}  # trial id -> the most contention_cpus of its windows
        self._beside: dict[str, int] = {}  # trial id -> most trials seen running beside it on its node
        # Sweep.stop_at_utilisation (set by run_sweep): the first trial to end at or above this
        # share of the hardware's peak ends the sweep; ``goal_reached`` then says which and why.
        self.stop_at_utilisation: Optional[float] = None
        self.goal_reached: Optional[str] = None
        # Why the search stopped short of its budget for the confirmation (confirm.ConfirmationReserve).
        self.reserve_reached: Optional[str] = None
        # Ends a trial silent past Sweep.trial_timeout_s (deadline.py); set by run_sweep, None: no deadline.
        self.deadline: Optional[TrialDeadline] = None
        # Stops the sweep before its storage path fills up (storage_watch.py); set by run_sweep.
        self.storage_watch = None
        # Each running trial's phase and output (trainables/trial_progress.py): the actor's
        # handle, set by run_sweep; with ``verbose`` every trial's output is shown as it ends.
        self._progress = None
        self.verbose = False
        self._phase_said_at = time.monotonic()

    def __getstate__(self):
        # Tune pickles its callbacks with the experiment state. The MLflow client, the
        # output function and the board's handle belong to this driver process. A
        # database URI's password stays here (a server's is not in the URI: secrets.py):
        # --resume gets the URI from its flag again (lifecycle._resume).
        return {**self.__dict__, "_tracker": None, "print_line": None, "_board": None, "_progress": None,
                "scheduler": None, "tracking_uri": redact_uri(self.tracking_uri)}

    def __setstate__(self, state: dict) -> None:
        # A callback pickled by an earlier accelsweep (a sweep it started, resumed by this one).
        self.__dict__.update({"window_results": {}, "scheduler": None, **state})
        if "window_figures" not in state:
            self.window_figures = window_figure_names([self.measured_by, *self.curves])

    def _offer_best(self, record: TrialRecord) -> None:
        """A measured result: the board keeps the best for the trials that start next."""
        import ray

        if self.board_name is None or not record.measured(self.measured_by):
            return
        if self._board is None:
            try:
                self._board = ray.get_actor(self.board_name)
            except ValueError:  # the board is gone: trials then run without a best to beat
                self.board_name = None
                return
        # Waited for: the next trial may start as soon as this returns, and must read it.
        ray.get(self._board.offer.remote(record.metric(self.measured_by), record.metric("host_probe_s")), timeout=30)

    @property
    def tracker(self) -> SweepTracker:
        # A callback restored by Tuner.restore (--resume) opens its own client.
        if self._tracker is None:
            self._tracker = SweepTracker(self.tracking_uri, self.experiment)
            self._tracker.parent_run_id = self.parent_run_id
        return self._tracker

    # Tune checkpoints this with the experiment and hands it back on --resume: which
    # trial has which MLflow run, so a resumed trial continues its own run.
    def get_state(self) -> Optional[dict]:
        return {"records": self.records, "parent_run_id": self.parent_run_id, "study_pending": self.study_pending,
                "window_results": self.window_results}

    def set_state(self, state: dict) -> None:
        self.records = state["records"]
        self.parent_run_id = state["parent_run_id"]
        self.study_pending = list(state.get("study_pending", ()))  # a state saved before it had them: none
        self.window_results = state.get("window_results", {})
        ended = {trial_id: windows for trial_id, windows in self.window_results.items()
                 if trial_id in self.records and self.records[trial_id].status in ENDED_STATUSES}
        if self.scheduler is not None and ended:  # Tune adds the trials back after this
            self.scheduler.replay(ended)
            self._say(f"early stopping given back the windows of the {len(ended)} trials that had ended "
                      f"(Tune saves none of its state): it stops as it did before the stop")
        self.adopt_run_ids()  # before the runs Tune never saved are told apart by run id
        now = time.monotonic()  # clocks of the old driver mean nothing here
        for record in self.records.values():
            record.created_at = now
            self._offer_best(record)  # this driver's board starts empty
        self._take_over_stopped_runs()

    def _take_over_stopped_runs(self) -> None:
        """--resume: what the killed driver did after Tune's last save (resumed_runs.py)."""
        stopped, self.stopped = self.stopped, None
        if stopped is not None:
            take_over(self, stopped)

    def _next_number(self) -> int:
        """After every number given, MLflow's own included (a killed driver's runs)."""
        return max([self.number_floor, *(r.number for r in self.records.values())]) + 1

    def adopt_run_ids(self) -> None:
        """A run created while MLflow's store did not answer has a placeholder id until
        its creation is written (sweeps/driver/record/tracking_buffer.py): the id MLflow gave it."""
        buffer = self.tracker.buffer
        self.parent_run_id = buffer.run_id_of(self.parent_run_id)
        for record in self.records.values():
            record.run_id = buffer.run_id_of(record.run_id)

    # Tune creates a trial when a slot frees; its clock starts then, so actor start-up
    # and imports count toward the trial's wall time and overhead.
    def on_step_begin(self, iteration, trials, **info):
        self._take_over_stopped_runs()  # a sweep killed before Tune's first save has no set_state
        for trial in trials:
            if trial.trial_id not in self.records:
                self._record(trial)
        self._record_reuses()
        if self.deadline is not None:  # checked here: this runs even while a trial is wedged
            for trial in self.deadline.enforce(trials):
                self._say(f"[trial {self.records[trial.trial_id].number}/{self.total_trials}] ended: "
                          f"{self.deadline.error_of(trial.trial_id)[1]}")
        if self.storage_watch is not None:
            self.storage_watch.check()
        self._say_phases()
        # MLflow writes kept while its store does not answer: tried again here too, which
        # Tune's loop passes while no trial reports (tracking_buffer.py); a trial's held
        # params and windows go out here at the latest (tracking.HOLD_S).
        self.tracker.buffer.retry()
        self.tracker.flush_due()
        self.adopt_run_ids()
        self.write_pending_study()

    def _say_phases(self) -> None:
        """What each trial quiet for PROGRESS_EVERY_S is doing (compiling, warming up,
        window k of n), at most every PROGRESS_EVERY_S: a long compile is not a hang."""
        now = time.monotonic()
        if self._progress is None or now - self._phase_said_at < PROGRESS_EVERY_S:
            return
        self._phase_said_at = now
        quiet = {record.trial_id: record for record in self.records.values()
                 if record.status == "running" and now - max(record.created_at, record.reported_at) >= PROGRESS_EVERY_S}
        if not quiet:
            return
        import ray

        try:
            phases = ray.get(self._progress.phases.remote(), timeout=2)
        except Exception:  # noqa: BLE001 - a busy or lost actor: the trials go on, said next time
            return
        for trial_id, record in sorted(quiet.items(), key=lambda item: item[1].number):
            if getattr(record, "placed_at", True) is None:  # Tune holds it pending: no process yet
                self._say(f"{self.label(record)} {self._waiting_for_a_place(record, now)}")
                continue
            phase, since = phases.get(trial_id, ("starting (process, imports)", None))
            running_s = now - record.created_at
            in_phase = f", {time.time() - since:.0f} s in it" if since is not None else ""
            self._say(f"{self.label(record)} running {running_s:.0f} s: {phase}{in_phase}")

    def _waiting_for_a_place(self, record: TrialRecord, now: float) -> str:
        """What a trial with no process yet waits for, and who holds it when the cluster's
        arbiter knows (fair_share.py): not "running", and not the tool's overhead."""
        need = ", ".join(f"{amount:g} {name}" for name, amount in record.resources.items() if amount) or "its resources"
        text = f"waiting {now - record.created_at:.0f} s for a place: {need}"
        gate = fair_share.gate_of(self.sweep_token)
        if gate is not None and gate.last is not None:
            holding = [(label, n) for label, n in gate.last.others if n]
            if holding:
                text += (f"; the cluster's other trials are {len(holding)} other sweep(s)'s: "
                         + ", ".join(f"{label} {n}" for label, n in holding))
        return text

    def _take_output(self, record: TrialRecord) -> str:
        """The trial's output (trainables/trial_progress.py), kept in its run as
        trial-output.log; '' when it printed nothing or it cannot be had."""
        if self._progress is None or record.run_id is None:
            return ""
        import ray

        try:
            output = ray.get(self._progress.take_output.remote(record.trial_id), timeout=10)
        except Exception:  # noqa: BLE001 - the actor lost: the result itself is on record
            return ""
        if output.strip():
            self.tracker.log_text(record.run_id, output, TRIAL_OUTPUT)
        return output

    def _record_reuses(self) -> None:
        """Each proposal the searcher answered from an earlier trial becomes a run of its
        own, tagged with the trial it reused: the search's path stays complete in MLflow,
        and nothing ran (no cost, no time)."""
        for searched, original_id in take_reuses(self.sweep_token):
            original = self.records.get(original_id)
            number = self._next_number()
            try:
                config = self.complete_config(searched)
            except ValueError:
                config = dict(searched)
            record = TrialRecord(number=number, trial_id=f"{original_id}-reuse-{number}", searched=dict(searched),
                                 config=config, resources={}, is_baseline=False, created_at=time.monotonic(),
                                 measured_by=self.measured_by, status=REUSED, wall_s=0.0,
                                 reused_from=original.number if original else None)
            if original is not None:
                record.result = {k: v for k, v in original.result.items() if k not in ("wall_s", "overhead_s")}
                record.error, record.error_class, record.error_cause = (original.error, original.error_class,
                                                                       original.error_cause)
            record.result.update({"wall_s": 0.0, "trial_cost_usd": 0.0})
            self.records[record.trial_id] = record
            of = f"trial {original.number}" if original else "an earlier trial"
            tags = {**self.trial_tags, "trial_id": record.trial_id, "trial_number": str(number),
                    "searched": config_key(searched), "baseline": "false", "status": REUSED,
                    "reused_from_trial": str(original.number) if original else "unknown",
                    "reused_from_run": (original.run_id or "") if original else ""}
            record.run_id = self.tracker.start_trial(f"trial-{number:03d} (reuse of {of})", config, tags)
            self.tracker.finish(record.run_id, "FINISHED", metrics=trial_figures(record.result),
                                tags={**result_tags(record.result), "status": REUSED})
            self._say(self.progress_line(record))

    def _record(self, trial) -> TrialRecord:
        searched = dict(trial.config)
        try:
            config = self.complete_config(searched)
            resources = self.resources_of(searched)
        except ValueError:
            config, resources = dict(searched), {}
        # On --resume, a trial of a killed driver's goes on in its run, under its number.
        stopped_run = None
        if self.runs_of_saved_trials or self.cut_off_runs:
            stopped_run = run_for(self, trial.trial_id, searched)
        record = TrialRecord(
            number=stopped_run.number if stopped_run else self._next_number(), trial_id=trial.trial_id,
            searched=searched, config=config, ordinal=sum(r.status != REUSED for r in self.records.values()) + 1,
            resources=resources, created_at=time.monotonic(), measured_by=self.measured_by,
            is_baseline=(stopped_run.tags.get("baseline") == "true" if stopped_run else
                         not any(r.is_baseline for r in self.records.values()) and searched == self.baseline),
            run_id=stopped_run.run_id if stopped_run else None,
        )
        self.records[trial.trial_id] = record
        return record

    def on_trial_start(self, iteration, trials, trial, **info):
        if self.deadline is not None:
            self.deadline.started(trial.trial_id)
        record = self.records.get(trial.trial_id) or self._record(trial)
        gate = fair_share.gate_of(self.sweep_token)
        if gate is not None:
            gate.placed(trial.trial_id)
        if record.run_id is not None:
            # A restart (retry after a lost process or node, or --resume: also a trial the
            # killed driver started after Tune's last save, proposed again): same run.
            record.status, record.created_at = "running", time.monotonic()
            record.placed_at = record.created_at
            self.window_results.pop(trial.trial_id, None)  # it reports from its first window again
            self.tracker.reopen(record.run_id, tags={"status": "running", "retries": str(record.retries),
                                                     "trial_id": trial.trial_id})
            return
        record.placed_at = time.monotonic()
        tags = {**self.trial_tags, "trial_id": trial.trial_id, "trial_number": str(record.number),
                "searched": _searched_key(record.searched),
                "baseline": str(record.is_baseline).lower(), "status": "running"}
        if self.cost is not None and record.resources:
            tags["cost_basis"] = self.cost.describe(record.resources)
        tags.update({f"resource.{k}": f"{v:g}" for k, v in record.resources.items()})
        own = self.run_tags(record)
        tags.update(own)
        if "local_step" in own:  # the summary reads it as a run's tags are read back (an edge moved)
            record.result.setdefault("local_step", own["local_step"])
        record.run_id = self.tracker.start_trial(self.run_name(record), record.config, tags)

    def hourly_rate(self, record: TrialRecord) -> float:
        """What the trial's resources cost per hour: as the trial priced them on the node it
        ran on (its ``usd_per_hour``), else at the sweep's basis; NaN with neither."""
        if "usd_per_hour" in record.result:
            return record.metric("usd_per_hour")
        return self.cost.hourly_rate(record.resources) if self.cost and record.resources else float("nan")

    def label(self, record: TrialRecord) -> str:
        """How a line about a running trial names it."""
        return f"[trial {record.number}/{self.total_trials}]"

    def run_name(self, record: TrialRecord) -> str:
        """Its MLflow run's name."""
        return f"trial-{record.number:03d}" + (" (baseline)" if record.is_baseline else "")

    def run_tags(self, record: TrialRecord) -> dict[str, str]:
        """Tags of its run beyond the common ones (a phase's own: confirm.py)."""
        step = self.local_step(record)
        if step == GUESS_LABEL:
            return {"proposed_as": GUESS_LABEL}
        return {"local_step": step} if step else {}

    def local_step(self, record: TrialRecord) -> str:
        """What the trial's config changed from the leader, when the local search proposed it
        (searchers.py); else ""."""
        for key, step in local_proposals(self.sweep_token).items():
            params = json.loads(key)
            if params and all(record.searched.get(name) == value for name, value in params.items()):
                return step
        return ""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.deadline is not None:
            self.deadline.reported(trial.trial_id)
        record = self.records[trial.trial_id]
        record.reported_at = time.monotonic()
        if result.get("trial_failed"):
            # The trial caught its own error and reported it (trainables/loop/failures.py run_isolated).
            record.error_class, record.error = result["error_class"], result["error"]
            record.error_cause = result.get("error_cause", ERROR)
            record.result = {**record.result, **{k: v for k, v in result.items() if k in ("loop_s",)}}
            return
        record.result = {**{k: record.result[k] for k in ("local_step",) if k in record.result}, **result}
        if not result.get("rejected"):
            self._offer_best(record)
        if "nan_capture_path" not in result:  # a capture's report is not a window (trainables/loop/nan_capture.py)
            self.window_results.setdefault(trial.trial_id, {})[_step_of(result)] = {
                name: float(result[name]) for name in self.window_figures
                if isinstance(result.get(name), numbers.Real)}  # numpy's included (a user's trainable)
        excess = result.get("contention_cpus")
        if isinstance(excess, (int, float)) and math.isfinite(excess):
            self._peak[trial.trial_id] = max(excess, self._peak.get(trial.trial_id, 0.0))
        # On a cluster node, trials share the host's CPUs, memory bandwidth and network.
        node = result.get("node_ip")
        beside = sum(1 for other in self.records.values() if other is not record and other.status == "running"
                     and other.result.get("node_ip") == node) if node else 0
        self._beside[trial.trial_id] = max(beside, self._beside.get(trial.trial_id, 0))
        window_metrics = {name: result[name] for name in self.curves if name in result}
        if window_metrics:
            self.tracker.log_metrics(record.run_id, window_metrics, step=_step_of(result))
            record.curves_logged = True

    def on_trial_complete(self, iteration, trials, trial, **info):
        record = self.records[trial.trial_id]
        if record.error:
            self._finish(record, FAILED)
            return
        # A trainable of a user's own may count its reports only through Tune's iteration.
        done = record.result.get("windows_done", record.result.get("training_iteration", 0))
        expected = record.config.get("windows", done)
        if record.result.get("rejected"):
            self._finish(record, REJECTED)
        else:
            self._finish(record, FINISHED if done >= expected else STOPPED_EARLY)

    def on_trial_error(self, iteration, trials, trial, **info):
        record = self.records.get(trial.trial_id) or self._record(trial)
        timed_out = self.deadline.error_of(trial.trial_id) if self.deadline is not None else None
        record.error_class, record.error, record.error_cause = timed_out or _error_of(trial)
        if record.run_id is None:  # failed before it started: it still gets its run
            self.on_trial_start(iteration, trials, trial)
        self._finish(record, FAILED)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Its process or node went away; Tune runs it again (FailureConfig.max_failures).
        record = self.records.get(trial.trial_id) or self._record(trial)
        record.retries += 1
        error_class, error, _ = _error_of(trial)
        self._say(f"[trial {record.number}/{self.total_trials}] lost ({error_class}: {error}); retrying "
                  f"(retry {record.retries})")

    def on_experiment_end(self, trials, **info):
        self._record_reuses()
        # Trials still running at the end: the time budget ran out (keep what they
        # measured), or the sweep was interrupted (--resume will run them again).
        out_of_time = self.time_budget_s is not None and self.budget_spent_s() >= self.time_budget_s * 0.98
        # Cut, like the budget's end: nothing to resume.
        out_of_time = out_of_time or self.goal_reached is not None or self.reserve_reached is not None
        for record in self.records.values():
            if record.status == "running" and record.run_id is not None:
                self._finish(record, CUT_BY_BUDGET if out_of_time else INTERRUPTED)

    def budget_spent_s(self) -> float:
        """The sweep's time so far, less what it waited for a place with no trial running
        (its turn on a cluster other sweeps share, fair_share.py)."""
        gate = fair_share.gate_of(self.sweep_token)
        return time.time() - self.started_at - (gate.waited_s if gate is not None else 0.0)

    def _finish(self, record: TrialRecord, status: str) -> None:
        record.status = status
        record.wall_s = time.monotonic() - record.created_at
        final = trial_figures(record.result)
        if record.curves_logged:  # each curve's last point is already its final value
            final = {k: v for k, v in final.items() if k not in self.curves}
        final["wall_s"] = record.wall_s
        final.update(self._window_figures(record))
        # Its wait for a place (Tune holding it pending until its process started) is
        # neither the tool's overhead nor time it held, and paid for, its resources.
        wait_s = (getattr(record, "placed_at", None) or time.monotonic()) - record.created_at
        final["wait_s"] = wait_s
        if "loop_s" in record.result:
            final["overhead_s"] = record.wall_s - wait_s - record.result["loop_s"]
        final["trial_cost_usd"] = trial_cost_usd(self.hourly_rate(record), record.wall_s - wait_s)
        record.result.update(final)
        tags = {**result_tags(record.result), "status": status}
        if record.error:
            tags.update({"error_class": record.error_class, "error": record.error,
                         "error_cause": record.error_cause or ERROR})
        if record.retries:
            tags["retries"] = str(record.retries)
        if self.host_loaded(record):
            slowdown = self.host_slowdown(record)
            tags["host_loaded"] = f"its speed probe ran {slowdown:.0%} slower than the sweep's typical"
        if record.disturbed:
            tags["contended"] = self.contention_text(record)
        capture = record.result.get("nan_capture_path")
        if capture:
            # The NaN capture (trainables/loop/nan_capture.py) travels with its trial's run.
            tags["nan_capture_path"] = str(capture)
            if os.path.exists(capture):
                self.tracker.log_artifact(record.run_id, capture)
                tags["nan_capture_artifact"] = os.path.basename(capture)
        output = self._take_output(record)
        if output.strip():
            tags["trial_output"] = TRIAL_OUTPUT
        mlflow_status = {FAILED: "FAILED", CUT_BY_BUDGET: "KILLED", INTERRUPTED: "KILLED"}.get(status, "FINISHED")
        self.tracker.finish(record.run_id, mlflow_status, metrics=final, tags=tags, step=_step_of(record.result))
        self._record_in_study(record)
        self._say(self.progress_line(record))
        self._check_goal(record, status)
        if output.strip() and (status == FAILED or self.verbose):
            self._say(shown_output(output, whole=self.verbose))

    def _check_goal(self, record: TrialRecord, status: str) -> None:
        """The sweep's goal (Sweep.stop_at_utilisation): a trial that ran whole at or above
        it ends the sweep (UtilisationGoal stops Tune). Contended windows count: other
        processes only slow a trial, so its utilisation then understates what it reached."""
        goal = self.stop_at_utilisation
        if goal is None or self.goal_reached is not None or status != FINISHED:
            return
        reached = record.metric("mfu")
        if math.isfinite(reached) and reached >= goal:
            self.goal_reached = (f"trial {record.number} reached {reached:.1%} of the hardware's peak, at or above "
                                 f"the goal of {goal:.1%} (--stop-at-utilisation {goal:g})")
            self._say(f"[goal] {self.goal_reached}: the sweep stops here")

    def _window_figures(self, record: TrialRecord) -> dict[str, float]:
        """What the driver derives from a trial's windows: how many there were (a trainable
        of a user's own counts them only by its reports), the most contention any of them
        saw, the trials beside it on its node, and, for a trainable that reports no noise
        of its own, the spread of its reports of the first objective over its quiet
        windows (``objective_cv``: its noise, for the verdict)."""
        figures: dict[str, float] = {"trials_beside": float(self._beside.get(record.trial_id, 0))}
        if record.trial_id in self._peak:
            figures["max_contention_cpus"] = self._peak[record.trial_id]
        if "windows_done" not in record.result and record.result.get("training_iteration"):
            figures["windows_done"] = float(record.result["training_iteration"])
        windows = self.window_results.get(record.trial_id, {})
        contended = {step: bool(result.get("window_contended")) for step, result in windows.items()}
        if "contended_windows" not in record.result and contended:
            figures["contended_windows"] = float(sum(contended.values()))
        if not any(math.isfinite(record.metric(name)) for name in NOISE_METRICS):
            values = self.objective_windows(record.trial_id)
            quiet = [value for step, value in sorted(values.items()) if not contended.get(step)]
            if len(quiet) >= 2 and all(math.isfinite(v) for v in quiet) and statistics.fmean(quiet) != 0:
                figures["objective_cv"] = abs(statistics.pstdev(quiet) / statistics.fmean(quiet))
        return figures

    def objective_windows(self, trial_id: str) -> dict[int, float]:
        """A trial's first objective, window by window (those that reported it)."""
        return {step: result[self.measured_by] for step, result in self.window_results.get(trial_id, {}).items()
                if self.measured_by in result}

    @staticmethod
    def contention_text(record: TrialRecord) -> str:
        """Its contention in words (a tag, a progress line)."""
        windows = record.metric("windows_done")
        of = f" of {windows:.0f}" if math.isfinite(windows) else ""
        most = record.metric("max_contention_cpus")
        most_text = f", up to {most:.2f} CPUs beyond the cores it left free" if math.isfinite(most) else ""
        judged = ("every window: its figure is not trusted" if record.contended
                  else "its figure is from the other windows")
        return f"{record.contended_windows}{of} windows contended (other processes took its cores{most_text}); {judged}"

    def _record_in_study(self, record: TrialRecord) -> None:
        """MLflow holds the trial already. A trial whose run has no real id yet, or a
        study database that does not answer, waits its turn (write_pending_study); a study
        that refuses the write is said, once, and the sweep goes on without it."""
        if self.study is None:
            return
        if record.trial_id not in self.study_pending:
            self.study_pending.append(record.trial_id)
        self.write_pending_study(force=True)

    def write_pending_study(self, force: bool = False) -> None:
        """Write the study's waiting trials, in order, up to the first that cannot be yet.
        A database that did not answer is tried again at most every RETRY_EVERY_S (at each
        ended trial, each step of Tune's loop and the sweep's end), unless ``force``."""

        if self.study is None or not self.study_pending:
            return
        if not force and time.monotonic() - self._study_tried_at < RETRY_EVERY_S:
            return
        while self.study_pending:
            record = self.records.get(self.study_pending[0])
            if record is None:  # not a trial of this driver's (a state from elsewhere): nothing to write
                self.study_pending.pop(0)
                continue
            if record.run_id is None or record.run_id.startswith(PLACEHOLDER_PREFIX):
                return  # its run's id comes when MLflow's store answers (adopt_run_ids)
            try:
                self.study.record(record, self.objective_windows(record.trial_id))
            except Exception as error:  # a database error of any kind: the study is a copy
                said = redact_text(one_line(_first_cause(error)), secret_values())[:300]
                if database_unanswered(error):
                    self._study_tried_at = time.monotonic()
                    if not self._study_lost_said:
                        self._say(f"warning: {self.study.describe()} did not answer ({type(_first_cause(error)).__name__}: "
                                  f"{said}); its trials are kept and written when it answers")
                        self._study_lost_said = True
                    return
                self._say(f"warning: {self.study.describe()} could not be written ({type(error).__name__}: "
                          f"{said}); the sweep goes on, MLflow has every trial")
                self.study, self.study_pending = None, []
                return
            self.study_pending.pop(0)
            self._study_tried_at = -math.inf  # it answers: the next waiting trial need not wait
            if self._study_lost_said:
                self._say(f"{self.study.describe()} answers again: the trials kept for it are written")
                self._study_lost_said = False

    def host_slowdown(self, record: TrialRecord) -> float:
        return host_slowdown(record, list(self.records.values()))

    def host_loaded(self, record: TrialRecord) -> bool:
        return host_loaded(record, list(self.records.values()))

    def _say(self, line: str) -> None:
        (self.print_line or (lambda text: print(text, flush=True)))(line)

    def progress_line(self, record: TrialRecord) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in record.searched.items())
        count = f"{record.ordinal or record.number}/{self.total_trials}"
        number = count if record.ordinal in (0, record.number) else f"{record.number} ({count})"
        step = self.local_step(record)
        head = (f"[trial {number}{' baseline' if record.is_baseline else ''}"
                f"{f' {step}' if step == GUESS_LABEL else f' local: {step}' if step else ''}] {knobs}")
        if record.status == FAILED:
            return f"{head} -> FAILED ({record.error_cause or ERROR}): {record.error_class}: {record.error}"
        if record.status == INTERRUPTED:
            return f"{head} -> interrupted (--resume runs it again)"
        if record.status == REUSED:
            of = f"trial {record.reused_from}" if record.reused_from else "an earlier trial"
            return f"[reuse] {knobs} -> measured already ({of}): its result stands, not run again"
        if record.status == REJECTED:
            return f"{head} -> rejected after {record.wall_s:.1f} s: {record.result.get('rejection', '')}"
        if record.status == CUT_BY_BUDGET and not math.isfinite(record.metric(self.metrics.measurement)):
            # Its figures would all read nan: it was starting, compiling or warming up.
            return f"{head} -> nothing measured: the time budget ended it before its first window [{record.status}]"
        figures = []
        for name in self.metrics.headline:  # formatted as the trainable declares them
            metric, value = self.metrics[name], record.metric(name)
            if math.isfinite(value) or not metric.progress_if_known:
                figures.append(metric.shown(value))
        interpreted = " (interpreted: not ranked)" if record.result.get("interpreted") else ""
        noisy = ""
        if record.noise > NOISY_CV:  # its windows disagree (trainables/harness/microbench.py, train_loop.py)
            host_cv = record.metric("host_cv")
            noisy = (f" (noisy: the machine's own speed moved too, host cv {host_cv:.0%})" if host_cv > NOISY_CV
                     else " (noisy: its windows disagree)")
        if self.host_loaded(record):
            noisy += (f" (host loaded: its speed probe ran {self.host_slowdown(record):.0%} slower than the sweep's "
                      "typical; not trusted)")
        if record.disturbed:
            noisy += f" (contended: {self.contention_text(record)})"
        return f"{head} -> {', '.join(figures)}{interpreted}{noisy} [{record.status}]"

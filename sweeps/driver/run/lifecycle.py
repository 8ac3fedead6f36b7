"""A sweep's run, from start to end: connect to Ray, start it (a new MLflow parent run and
Tune experiment) or resume a stopped one, run every trial under the stop signals, the
storage watch and the tracking buffer, then finish (close what is left open, judge the
best against the baseline, log the summary and report). ``run_sweep`` is the way in."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.run import local_ray
from accelsweep.sweeps.driver.run import fair_share
from accelsweep.sweeps.driver.run import cluster_room
from accelsweep.sweeps.driver.run.callbacks import (
    FAILED,
    INTERRUPTED,
    REJECTED,
    REUSED,
    SweepCallback,
)
from accelsweep.sweeps.driver.run.confirm import (Confirmation, ConfirmationReserve, run_confirmation,
                                                  search_budget_s)
from accelsweep.sweeps.driver.run.deadline import deadline_for
from accelsweep.sweeps.driver.record.history import (
    CONFIRM_NOTE_TAG,
    KNOBS_TAG,
    METRICS_TAG,
    GOAL_REACHED_TAG,
    SEARCHED_OUT_TAG,
    metrics_tag,
)
from accelsweep.sweeps.driver.run.goal import register, watch_goal
from accelsweep.sweeps.driver.record.marker import unfinished_sweep_dir, write_sweep_marker
from accelsweep.sweeps.driver.define.plan import (
    Plan,
    as_sized,
    early_stopping,
    edge_trials,
    preflight,
    LOCAL_TIME_SHARE,
    local_search_trials,
    rejects,
    startup_trials,
    trial_limits_of,
)
from accelsweep.sweeps.driver.reporting.cluster_watch import ClusterWatch, by_node_type
from accelsweep.sweeps.driver.define.cli import RETURNED, SweepInterrupted
from accelsweep.sweeps.driver.define.first_guess import LABEL as GUESS_LABEL
from accelsweep.sweeps.driver.define.preflight import check_ray_address
from accelsweep.sweeps.driver.record.secrets import (
    mlflow_credentials_hidden,
    mlflow_credentials_restored,
    redact_command_line,
    redact_uri,
)
from accelsweep.sweeps.driver.record.tracking import open_tracker
from accelsweep.sweeps.driver.record.tracking_buffer import MLFLOW_REQUEST_SETTINGS, RETRY_EVERY_S, unanswered
from accelsweep.sweeps.driver.reporting.summary import (
    best_record,
    mean_overhead_s,
    pareto_set,
    summary,
)
from accelsweep.sweeps.driver.define.resume_check import defining_flags, storage_dir
from accelsweep.sweeps.driver.record.resumed_runs import (
    LOST,
    keep_tuner_file,
    read_stopped_sweep,
    restore_tuner_file,
)
from accelsweep.sweeps.driver.run.schedulers import ParetoStoppingRule, TrustedWindowsOnly
from accelsweep.sweeps.driver.define.edges import largest_values
from accelsweep.sweeps.driver.run.searchers import (FailureAwareOptunaSearch, concurrency_aware_tpe, label_proposal,
                                                    searched_out)
from accelsweep.sweeps.driver.run.stop_signals import StopSignals
from accelsweep.sweeps.driver.run.storage_watch import StorageWatch, storage_error_stopped
from accelsweep.sweeps.driver.define.store_checks import claim_experiment_dir
from accelsweep.sweeps.driver.record.optuna_study import SweepStudy, default_study_storage, quiet_optuna
from accelsweep.sweeps.driver.define.sweep import Sweep, SweepResult
from accelsweep.sweeps.driver.define.warm_start import unique_points, warm_trials
from accelsweep.sweeps.driver.reporting.report_artifacts import log_report
from accelsweep.sweeps.driver.reporting.verdict import sweep_answer, verdict
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.environment import environment_tags
from accelsweep.trainables.environment_variables import (environment_snapshot, restore_environment,
                                                      whole_environment_restored)
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.failures import run_isolated
from accelsweep.trainables.loop.rejection import BoardLimits
from accelsweep.trainables.sweep_actor import start_sweep_actor
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import get_platform


def connect_ray(address: Optional[str], verbose: bool = False) -> str:
    """Connect to the cluster at ``address``, or start a private local instance (None,
    "local") that stops with this process, stopping first any a killed driver left
    (local_ray.py). A Ray instance this process has initialised already is used as it is."""
    import ray

    if ray.is_initialized():
        return "using the Ray instance already initialised"
    if address and address != "local":
        check_ray_address(address)  # ray.init retries an unreachable address for minutes
        ray_adapter.keep_loopback(address)
        # The sweep's own SIGTERM handler (stop_signals.py); no secret of the command line
        # in the cluster's job table.
        with ray_adapter.sigterm_handler_kept(), ray_adapter.entrypoint_shown_as(redact_command_line):
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=verbose)
        return f"connected to Ray at {address}"
    # A private local instance that does not outlive this process, never a `ray start`
    # cluster a bare ray.init() would join (local_ray.py). Its processes inherit this
    # environment: not the tracking server's credentials.
    with mlflow_credentials_hidden():
        return local_ray.start(log_to_driver=verbose)


def concurrency_for(per_trial: Mapping[str, float], sweep: Sweep) -> tuple[int, str]:
    """How many trials fit at once on the nodes up, each node holding whole trials (a
    trial runs on one node: two nodes of 3 CPUs hold two trials of 2 CPUs, not three), and
    in the nodes its autoscaler may still add (cluster_room.py): Tune may create that many,
    and their demand is what makes the autoscaler add the nodes. On a cluster other sweeps
    share, each trial still waits for its seat (fair_share.py)."""
    import ray

    if sweep.max_concurrent_trials:
        return sweep.max_concurrent_trials, "as asked"
    counted = [(resource, amount) for resource, amount in per_trial.items() if amount > 0]
    nodes = ray_adapter.nodes_up()
    fit_now = sum(cluster_room.holds(per_trial, node, uncounted=()) for node in nodes) if counted else 1
    autoscaling = cluster_room.read_autoscaling() if _on_a_cluster(sweep) else None
    more = cluster_room.slots_to_add(per_trial, autoscaling, nodes) if autoscaling else 0
    slots = fit_now + more
    if slots < 1:
        now = ray.cluster_resources()
        short = next(((r, a) for r, a in counted if now.get(r, 0) < a), None)
        have = (f"the cluster has {now.get(short[0], 0):g} {short[0]} now and a trial needs {short[1]:g}" if short
                else f"no node up holds a whole trial ({_shape_text(counted)}; the cluster has that only summed "
                     "over its nodes)")
        return 1, f"{have}: running one trial at a time while the autoscaler adds nodes"
    where = (f"the nodes up ({fit_now}) and the nodes its autoscaler may add ({more}: {autoscaling.describe(per_trial)})"
             if more else "the cluster's resources")
    return min(slots, sweep.num_samples), f"{slots} trial(s) fit in {where}"


def _shape_text(counted: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{amount:g} {resource}" for resource, amount in counted)


def _searcher(plan: Plan, sweep_token: str = "", time_budget_s: Optional[float] = None):
    import optuna

    sweep = plan.sweep
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    if sweep.sampler == "grid":
        grid = {name: list(d.choices) for name, d in plan.space.distributions.items()}
        sampler = optuna.samplers.GridSampler(grid, seed=sweep.seed)
    else:
        sampler = concurrency_aware_tpe(sweep.seed, startup_trials(sweep))
    # TPE runs the baseline first, then the platform's first guess (first_guess.py); a grid
    # reaches the baseline anyway (it is one of its points). A warm start's configs come
    # before them (warm_start.py).
    first = None
    prior = []
    if sweep.sampler == "tpe":
        first = [dict(point) for point in sweep.points] or [plan.baseline_point]
        if plan.guess is not None:
            first = unique_points([*first, plan.guess.point])
            label_proposal(sweep_token, plan.guess.point, GUESS_LABEL)
        if plan.warm is not None:
            first = unique_points([*plan.warm.points, *first])
            if plan.warm.tells:
                prior = warm_trials(plan.warm.told, plan.space.distributions, len(sweep.objectives))
    return FailureAwareOptunaSearch(plan.space.define_by_run, metric=metrics if len(metrics) > 1 else metrics[0],
                        mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                        points_to_evaluate=first, prior_trials=prior, seed=sweep.seed, repeats=sweep.repeats,
                        sweep_token=sweep_token, edges=_edges(plan), edge_steps=edge_trials(sweep),
                        budget=sweep.num_samples, local_search=local_search_trials(sweep),
                        local_after=time.time() + time_budget_s * (1 - LOCAL_TIME_SHARE) if time_budget_s else None,
                        ends_at=time.time() + time_budget_s if time_budget_s else None)


def _edges(plan: Plan) -> dict[str, tuple[str, Optional[int]]]:
    """The ordered knobs of the space whose edge the search may step past (Sweep.past_edge):
    the platform's (``Platform.ordered_knobs``, for the sweep's base config), searched here
    as counts. A grid is the user's exact list, a remeasure repeats its configs, and a sweep
    of a user's own config type declares none."""
    sweep = plan.sweep
    if not sweep.past_edge or sweep.sampler != "tpe" or sweep.repeats or not isinstance(sweep.base, TrialConfig):
        return {}
    ordered = get_platform(sweep.base.platform).ordered_knobs(sweep.base)
    return {knob: rule for knob, rule in ordered.items() if knob in largest_values(plan.space.distributions, ordered)}


def _scheduler(plan: Plan):
    """The sweep's early stopping, judging trustworthy windows only (schedulers.py)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    sweep = plan.sweep
    windows = getattr(sweep.base, "windows", 1)
    if sweep.scheduler == "none" or windows < 2:
        return FIFOScheduler()
    if len(sweep.objectives) > 1:
        # ASHA and the median rule rank by one metric: they would stop a trial for the
        # first objective alone, though it may be on the Pareto set.
        return TrustedWindowsOnly(ParetoStoppingRule(plan.objectives, grace_period=1, max_t=windows))
    objective = sweep.objectives[0]
    if sweep.scheduler == "asha":
        return TrustedWindowsOnly(ASHAScheduler(time_attr="training_iteration", metric=objective.metric,
                                                mode=objective.mode, max_t=windows, grace_period=1,
                                                reduction_factor=2), (objective.metric, objective.mode))
    return TrustedWindowsOnly(MedianStoppingRule(time_attr="training_iteration", metric=objective.metric,
                                                 mode=objective.mode, grace_period=1, min_samples_required=3),
                              (objective.metric, objective.mode))


def _trial_resources(config_for: Callable[[Mapping[str, Any]], Any], fallback: Mapping[str, float],
                     searched: Mapping[str, Any]) -> dict[str, float]:
    """What Tune reserves for one trial's process (``config_for``: Plan.config_for).
    Module-level so Tune can pickle it."""
    try:
        config = as_sized(config_for(searched))
    except ConfigError:
        return dict(fallback)  # the trial itself then fails with the config error, on record
    return dict(get_platform(config.platform).trial_actor_resources(config))


def _callback_of(tuner) -> SweepCallback:
    """The SweepCallback Tuner.restore unpickled with the run config."""
    found = [c for c in ray_adapter.restored_callbacks(tuner) if isinstance(c, SweepCallback)]
    if len(found) != 1:
        raise RuntimeError(f"the restored sweep has {len(found)} SweepCallbacks, expected 1 (Ray's Tuner changed?)")
    return found[0]


@dataclass
class _Run:
    """A sweep's Tune experiment, started or resumed, and what is needed to finish it."""

    tuner: Any
    callback: SweepCallback
    experiment_dir: str
    parent_run_id: str
    cluster_watch: Optional[ClusterWatch] = None  # on a cluster: what it did (nodes launched, waits)


def run_sweep(sweep: Sweep) -> SweepResult:
    """Check the sweep against where it runs (``preflight``), connect to Ray, start or
    resume it, run every trial and summarise. Nothing starts when a check fails.

    Callable many times in one process (a notebook), each sweep with its own store and
    experiment. A Ray instance this call started is shut down before it returns (also
    when the sweep fails); one the caller had initialised is left running. Process-wide
    settings (``sweep_settings``) are put back as they were.

    SIGINT or SIGTERM (on the main thread) stops the sweep cleanly, then raises
    ``SweepInterrupted`` (stop_signals.py): running trials end as interrupted, and the
    same sweep with ``resume=True`` continues it. A storage path that fills up (or turns
    read-only) meanwhile stops it the same way, then raises SweepStopped (storage_watch.py).
    The process's environment variables are as they were when it returns; so is the disk
    (a local Ray instance's session folder is removed with it)."""
    import ray

    started = time.monotonic()
    # What Ray, torch or scikit-learn set in this process's environment during the call
    # (PYTHONBREAKPOINT, KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK, TORCHINDUCTOR_CACHE_DIR)
    # does not outlive it: a notebook's next cell gets the environment it had.
    with whole_environment_restored(), StopSignals(sweep.print_line) as stop, sweep_settings(verbose=sweep.verbose):
        plan = preflight(sweep)  # a signal meanwhile: acted on once it is done (a store may be created)
        stop.raise_if_requested()
        ray_was_running = ray.is_initialized()
        with mlflow_credentials_restored():  # a server's credentials: set by SweepTracker
            try:
                result = _run(plan, started, stop)
            except OSError as error:  # a write of the sweep's own on a disk that filled up or went read-only
                stopped = storage_error_stopped(error, storage_dir(sweep))
                if stopped is None:
                    raise
                raise stopped from None
            finally:
                if not ray_was_running and ray.is_initialized():
                    local_ray.shutdown()  # the instance this sweep started: nothing else uses it
        stop.raise_if_requested(result)
        RETURNED.count, RETURNED.last = RETURNED.count + 1, result
        return result


# Set for a sweep's duration only (sweep_settings); a value the caller set is kept.
SWEEP_ENVIRONMENT = {
    # Every result goes to MLflow through SweepCallback; Tune's own CSV/JSON/TensorBoard
    # loggers would only add per-result file writes to each trial's overhead.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # Tune saves the experiment (trials, searcher, our callback's state) this often: what
    # a killed driver can lose, and what --resume picks up from.
    "TUNE_GLOBAL_CHECKPOINT_S": "5",
    "RAY_USAGE_STATS_ENABLED": "0",  # read by ray.init (connect_ray)
    # The local instance's workers (trials) keep the driver's niceness, not Ray's 15: beside
    # a nice-0 process a nice-15 trial thread gets about 1/30 of a shared core
    # (trainables/platforms/cpu_threads.py). Ray's job supervisor sets it so for its own.
    "RAY_worker_niceness": "0",
    **MLFLOW_REQUEST_SETTINGS,  # short retries per request: the tracker's buffer waits out an outage
}
# ...with Tune's loggers off, Tune's result grid finds no result files: it need not say
# so. And ray.init sets the level of Ray's own logger.
SWEEP_LOGGER_LEVELS = {"ray.tune.analysis.experiment_analysis": logging.ERROR, "ray": None}
# The console shows the tool's own lines only, unless the sweep is verbose: what Ray, Tune
# and MLflow announce on their own is said by the tool where it matters (the auth mode in
# the line that says Ray started), or kept where it belongs (a trial's output, in its run).
QUIET_ENVIRONMENT = {
    # Tune's output engine prints a "Configuration for experiment" box and "View detailed
    # results here" whatever RunConfig.verbose says; the older one is silent at verbose=0.
    "RAY_AIR_NEW_OUTPUT": "0",
}
QUIET_LOGGER_LEVELS = {
    "ray._private.authentication.authentication_token_setup": logging.ERROR,  # local_ray.start says it
    "mlflow.store.db.utils": logging.WARNING,  # "Creating initial MLflow database tables..."
    "alembic.runtime.migration": logging.WARNING,  # the same store's schema migrations
    # "Study.stop is supposed to be invoked inside an objective function": Ray's Optuna
    # searcher, when a grid is searched out (the summary says so).
    "ray.tune.search.optuna.optuna_search": logging.ERROR,
}


@contextlib.contextmanager
def sweep_settings(verbose: bool = False) -> Iterator[None]:
    """The process-wide settings a sweep needs, for the sweep's duration: the variables
    of SWEEP_ENVIRONMENT (a value already set is kept), the loggers' levels and Optuna's
    verbosity, all put back as they were when it ends (a user's own Tune run afterwards
    gets Tune's loggers). Unless ``verbose``, Ray's, Tune's and MLflow's own banners too
    (QUIET_ENVIRONMENT, QUIET_LOGGER_LEVELS)."""
    environment = SWEEP_ENVIRONMENT if verbose else {**SWEEP_ENVIRONMENT, **QUIET_ENVIRONMENT}
    levels = SWEEP_LOGGER_LEVELS if verbose else {**SWEEP_LOGGER_LEVELS, **QUIET_LOGGER_LEVELS}
    saved_env = environment_snapshot(environment)
    saved_levels = {name: logging.getLogger(name).level for name in levels}
    try:
        for name, value in environment.items():
            os.environ.setdefault(name, value)
        for name, level in levels.items():
            if level is not None:
                logging.getLogger(name).setLevel(level)
        with quiet_optuna():  # the searcher's study
            yield
    finally:
        restore_environment(saved_env)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def _run(plan: Plan, started: float, stop: StopSignals) -> SweepResult:
    sweep = plan.sweep
    say = sweep.print_line or (lambda line: print(line, flush=True))
    tracker = open_tracker(sweep.tracking_uri, sweep.experiment or sweep.name, sweep.tracking_wait_s, say)
    # After a stop request a store that does not answer is not waited for: its writes are kept.
    stop.when_requested(tracker.buffer.halt)
    concurrency = _connect_and_announce(plan, say)
    stop.claim()  # ray.init put its core worker's C++ SIGTERM handler over the sweep's
    stop.raise_if_requested()
    parent_metrics = dict(sweep.parent_metrics)  # the Sweep is the caller's: not changed
    if sweep.before_trials is not None and not sweep.resume:
        with stop.at_once():
            parent_metrics.update(sweep.before_trials(plan))
    # One actor per run of the driver (trainables/sweep_actor.py), held here for the sweep's
    # duration (Ray ends a named actor with its last handle): what each running trial is
    # doing and printing, and the sweep's best so far, which each trial reads as it starts
    # (rejection; a resumed sweep's is filled again from the records Tune restores).
    progress_name = f"accelsweep-sweep-{uuid.uuid4().hex[:12]}"
    progress = start_sweep_actor(progress_name, sweep.objectives[0].mode)
    board_name, board = (progress_name, progress) if rejects(sweep) else (None, None)
    trainable = _tune_trainable(plan, board_name, progress_name)
    storage = storage_dir(sweep)
    stop.raise_if_requested()  # the last moment at which nothing of the sweep is written
    if sweep.resume:
        run = _resume(plan, trainable, storage, tracker, say)
    else:
        # The search's share of what is left of the budget now that Ray is up (confirm.py).
        left = sweep.time_budget_s - (time.monotonic() - started) if sweep.time_budget_s else None
        left = max(1.0, left) if left is not None else None
        run = _start(plan, trainable, storage, tracker, concurrency, search_budget_s(left, sweep.confirm_rounds), left)
    run.callback.board_name, run.callback._board = board_name, board
    gate = _join_fair_share(plan, run.callback.sweep_token, say)
    run.callback._progress, run.callback.verbose = progress, sweep.verbose
    run.callback.deadline = deadline_for(sweep.trial_timeout_s)  # this run's flag, also on --resume
    watch = run.callback.storage_watch = StorageWatch(storage, sweep.print_line)  # stops it before the disk is full
    status = "FAILED"
    confirmation = None
    try:
        with stop.through_tune(), tracker.buffer.stopping_tune(), watch.stopping_tune(), \
                (ray_adapter.tune_sharing_a_cluster(fair_share.reuse_ok) if gate else contextlib.nullcontext()):
            run.tuner.fit()  # stopped as it begins after a signal meanwhile: its state saved for --resume
        if not stop.requested:
            _drain(tracker, stop)  # MLflow writes kept while its store was away: written, or given up on
            _write_study_kept(run.callback, tracker, stop, say)
        interrupted = stop.requested or tracker.buffer.gave_up or watch.tripped or any(
            r.status == INTERRUPTED for r in run.callback.records.values())
        if sweep.confirm_rounds and not interrupted:
            with fair_share.seat_for_confirmation(gate, lambda: stop.requested, sweep.time_budget_s), stop.through_tune(), \
                    tracker.buffer.stopping_tune(), watch.stopping_tune():
                seconds_left = (sweep.time_budget_s - (time.monotonic() - started - _waited_s(run))
                                if sweep.time_budget_s else None)  # its wait for a seat not counted
                # No board: a confirmation trial is measured whole, never rejected.
                confirmation = run_confirmation(plan, run.callback,
                                                functools.partial(_tune_trainable, plan, None, progress_name),
                                                storage, run.experiment_dir, sweep.confirm_rounds, seconds_left, say)
            interrupted = stop.requested or tracker.buffer.gave_up or watch.tripped
        status = "KILLED" if interrupted else "FINISHED"
    except SweepInterrupted:  # a second signal: Tune's loop was not waited for
        run.callback.on_experiment_end(trials=[])  # the trials still running end as interrupted
        status = "KILLED"
    finally:
        if gate is not None:
            gate.leave()
            parent_metrics["waited_for_place_s"] = gate.waited_s  # not in the budget, not overhead
        result = _finish(plan, run, tracker, status, time.monotonic() - started, parent_metrics, confirmation)
        result.waited_s = gate.waited_s if gate is not None else 0.0
    say(result.summary)
    if result.waited_s >= 1.0:
        say(f"waited for a place on the shared cluster: {result.waited_s:.0f} s with none of its trials running "
            "(other sweeps' turns; counted neither in its time budget nor in its trials' overhead)")
    if not stop.requested:
        _drain(tracker, stop)  # the end's own writes (its report), should the store go away then
    if tracker.buffer.gave_up:
        write_sweep_marker(run.experiment_dir, run.parent_run_id, INTERRUPTED)  # for --resume, also if it ended
        raise tracker.buffer.stopped()  # says where its writes are, and to --resume
    if watch.tripped:
        raise watch.stopped()  # how much is free, and to --resume once there is room
    # A stop while the end's own writes waited for the store: the sweep ran whole, but
    # its record did not; --resume is what writes it, so it must find the sweep unfinished.
    stopped_with_writes_kept = stop.requested and status != "KILLED" and bool(tracker.buffer.pending)
    if stopped_with_writes_kept:
        write_sweep_marker(run.experiment_dir, run.parent_run_id, INTERRUPTED)
    if status == "KILLED" or stopped_with_writes_kept:
        if tracker.buffer.pending:
            say(f"{len(tracker.buffer.pending)} MLflow write(s) the tracking store did not take are kept in "
                f"{tracker.buffer.path}: --resume writes them once it answers")
        say(f"interrupted: run the same command with --resume to continue {run.experiment_dir}")
    return result


def _on_a_cluster(sweep: Sweep) -> bool:
    return sweep.address not in (None, "local")


def _join_fair_share(plan: Plan, sweep_token: str, say: Callable[[str], None]) -> Optional[fair_share.Gate]:
    """On a cluster other sweeps may share: this sweep's seat at its arbiter (fair_share.py)."""
    sweep = plan.sweep
    if not _on_a_cluster(sweep):
        return None
    label = f"{sweep.name} (pid {os.getpid()} on {socket.gethostname()})"
    return fair_share.join(sweep_token, label, plan.resources_of(plan.baseline_point), say)


def _waited_s(run: _Run) -> float:
    gate = fair_share.gate_of(run.callback.sweep_token)
    return gate.waited_s if gate is not None else 0.0


def _drain(tracker, stop: StopSignals) -> None:
    """Wait for a lost tracking store to take the kept writes, or give up on it; a stop
    request ends the wait at once (a request may block on the store for its timeout):
    the writes stay on disk, where --resume finds them."""
    try:
        with stop.at_once():
            tracker.buffer.drain()
    except SweepInterrupted:
        tracker.buffer.halt()


def _write_study_kept(callback, tracker, stop: StopSignals, say: Callable[[str], None]) -> None:
    """The trials kept for the Optuna study while its database (or MLflow's store, for
    their run ids) did not answer: written now, waiting for it as long as for MLflow's
    store (--tracking-wait-s), not at all when the sweep is stopping for want of MLflow's
    store; a stop request ends the wait. What is still kept then is said: Tune's saved
    state holds it, and --resume writes it."""
    stopping = tracker.buffer.gave_up
    deadline = time.monotonic() + (0.0 if stopping else tracker.buffer.wait_s)
    while not stop.requested:
        callback.adopt_run_ids()
        callback.write_pending_study(force=True)
        if not callback.study_pending or callback.study is None or time.monotonic() > deadline:
            break
        pause_until = time.monotonic() + RETRY_EVERY_S
        while time.monotonic() < pause_until and not stop.requested:
            time.sleep(0.1)
    if callback.study is not None and callback.study_pending:
        say(f"warning: {len(callback.study_pending)} trial(s) are not in {callback.study.describe()} yet"
            + (": --resume writes them" if stopping else
               f": its database did not answer within {tracker.buffer.wait_s:g} s (MLflow has every trial)"))


def _connect_and_announce(plan: Plan, say: Callable[[str], None]) -> int:
    """Connect to Ray and say what will run; returns how many trials run at once."""
    sweep = plan.sweep
    say(connect_ray(sweep.address, verbose=sweep.verbose))
    baseline_resources = plan.resources_of(plan.baseline_point)
    concurrency, why = concurrency_for(baseline_resources, sweep)
    say(f"{sweep.name}: up to {sweep.num_samples} trials, {concurrency} at a time ({why}); "
        f"each trial holds {baseline_resources}; early stopping: {early_stopping(sweep)}")
    if sweep.platform_note:
        say(f"platform: {sweep.platform_note}")
    for line in plan.capability_lines():
        say(line)
    for line in [*(plan.guess.lines() if plan.guess is not None else ()),
                 *(plan.warm.lines() if plan.warm is not None else ())]:
        say(line)
    say(sweep.cost_note)
    return concurrency


def _tune_trainable(plan: Plan, board_name: Optional[str], progress_name: Optional[str] = None,
                    turns: Optional[str] = None, windows: Optional[int] = None, share: int = 1):
    """The sweep's trainable as Tune runs it: isolated (its failures become results),
    with the base config and cost basis bound, and each trial's own resources. In a
    confirmation that takes turns (confirm.py): at the baton named ``turns``, ``windows``
    windows each, ``share`` trials holding the CPUs of one (only one measures at a time)."""
    from ray import tune

    sweep = plan.sweep
    objective_metrics = [o.metric for o in sweep.objectives]
    limits = BoardLimits(board_name, trial_limits_of(sweep))
    isolated = functools.partial(run_isolated, trainable=sweep.trainable, objective_metrics=objective_metrics,
                                 limits=limits, progress=progress_name, turns=turns)
    baseline_actor = _trial_resources(plan.config_for, {}, plan.baseline_point)
    resources = functools.partial(_trial_resources, plan.config_for, baseline_actor)
    if share > 1:
        resources = functools.partial(_shared_resources, resources, share)
    base = plan.base_dict if windows is None else {**plan.base_dict, "windows": windows}
    return tune.with_resources(tune.with_parameters(isolated, base=base, cost=sweep.cost), resources)


def _shared_resources(resources_of: Callable[[Mapping[str, Any]], dict], share: int,
                      searched: Mapping[str, Any]) -> dict[str, float]:
    """A trial's resources with its CPUs split ``share`` ways: Ray takes whole numbers
    above one CPU and fractions below it."""
    resources = dict(resources_of(searched))
    if "CPU" in resources:
        part = resources["CPU"] / share
        resources["CPU"] = float(math.floor(part)) if part >= 1 else math.floor(part * 10000) / 10000
    return resources


def _resume(plan: Plan, trainable, storage: str, tracker, say: Callable[[str], None]) -> _Run:
    """Tune's saved experiment and our callback in it, back on their MLflow parent run."""
    from ray import tune

    sweep = plan.sweep
    experiment_dir = unfinished_sweep_dir(storage, sweep.name)
    tracker.buffer.keep_in(experiment_dir)  # MLflow writes the stopped run kept (its store was away): first
    restore_tuner_file(experiment_dir)  # a kill during a resumed run's save may have cut it short
    tuner = tune.Tuner.restore(experiment_dir, trainable, resume_unfinished=True, resume_errored=False)
    callback = _callback_of(tuner)
    callback._tracker, callback.print_line = tracker, sweep.print_line
    scheduler = ray_adapter.restored_scheduler(tuner)
    callback.scheduler = scheduler if isinstance(scheduler, TrustedWindowsOnly) else None  # FIFO keeps no state
    # Pickled without a database password (secrets.py): this command's, checked the same
    # store in preflight (resume_check.py).
    callback.tracking_uri = tracker.tracking_uri
    if callback.study is not None:
        callback.study.url = sweep.study_storage or default_study_storage(sweep.tracking_uri, storage)
    parent_run_id = tracker.parent_run_id = tracker.buffer.run_id_of(callback.parent_run_id)
    tracker.reopen(parent_run_id, tags={"status": "running", "resumed": datetime.datetime.now().isoformat()})
    # What the killed driver did after Tune's last save, from MLflow (resumed_runs.py): the
    # callback takes it with its saved records when fit() starts (set_state).
    callback.stopped = read_stopped_sweep(experiment_dir, tracker)
    if callback.stopped.saved_trials is None:  # killed before Tune's first save: no trial had started
        ray_adapter.start_afresh(tuner)
    say(f"resuming {experiment_dir} (MLflow parent run {parent_run_id})")
    return _Run(tuner, callback, experiment_dir, parent_run_id)


def _start(plan: Plan, trainable, storage: str, tracker, concurrency: int, time_budget_s: Optional[float],
           left_s: Optional[float] = None) -> _Run:
    """A new MLflow parent run and a new Tune experiment for the sweep; ``time_budget_s``:
    the search's (what the sweep's budget leaves it); ``left_s``: the sweep's (None: none)."""
    from ray import tune

    sweep = plan.sweep
    env_tags = environment_tags()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    sweep_tags = {**env_tags, "sweep": sweep.name, "platform": sweep.base.platform, "kind": "sweep",
                  "instance_type": (sweep.cost.instance_type if sweep.cost else None) or "unknown",
                  "cost_basis": sweep.cost_note, "status": "running", **plan.capability_tags(),
                  **(plan.warm.tags() if plan.warm is not None else {}),
                  **({"first_guess": plan.guess.tag()} if plan.guess is not None else {})}
    parent_params = {f"base.{k}": v for k, v in plan.base_dict.items()}
    parent_params.update({"num_samples": sweep.num_samples, "time_budget_s": sweep.time_budget_s,
                          "scheduler": sweep.scheduler, "seed": sweep.seed, "max_concurrent_trials": concurrency,
                          "objectives": ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives),
                          "reject_ratio": sweep.reject_ratio if rejects(sweep) else None,
                          "max_compile_s": sweep.max_compile_s, "trial_timeout_s": sweep.trial_timeout_s,
                          "repeats": sweep.repeats,
                          "search_space": "; ".join(plan.space.describe()), "keep_emulated": sweep.keep_emulated})
    study = _study(plan, storage, f"{sweep.name}-{stamp}")
    study.claim()  # its name is the parent run's, unique in the database (two sweeps in one second)
    sweep_tags.update({METRICS_TAG: metrics_tag(plan.metrics), KNOBS_TAG: json.dumps(list(plan.space.distributions)),
                       "optuna_study": study.name, "optuna_storage": redact_uri(study.url)})
    parent_run_id = tracker.start_sweep(study.name, parent_params, sweep_tags)
    trial_tags = {**env_tags, "sweep": sweep.name, "platform": sweep.base.platform,
                  "instance_type": sweep_tags["instance_type"]}
    callback = SweepCallback(tracker, plan.complete_config, plan.resources_of, plan.baseline_point,
                             sweep.cost, trial_tags, sweep.num_samples, print_line=sweep.print_line,
                             time_budget_s=time_budget_s,
                             metrics=plan.metrics,
                             objective_metrics=[metric for metric, _ in plan.objectives],
                             sweep_token=f"{sweep.name}-{stamp}-{uuid.uuid4().hex[:8]}", study=study)
    callback.stop_at_utilisation = sweep.stop_at_utilisation
    cluster_watch = ClusterWatch() if sweep.address not in (None, "local") else None
    # Another sweep's of the same second not shared: on this storage path, nor in Ray's
    # staging folder of this host (a cluster head's drivers share one).
    experiment_dir = claim_experiment_dir(storage, study.name, ray_adapter.session_names_dir())
    tracker.buffer.keep_in(experiment_dir)  # where MLflow writes are kept if its store stops answering
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=_searcher(plan, callback.sweep_token, time_budget_s),
                                    scheduler=_scheduler(plan),
                                    num_samples=sweep.num_samples,
                                    # On a cluster, the sweep's own clock: its waits for a place do not count.
                                    time_budget_s=None if _on_a_cluster(sweep) else time_budget_s,
                                    max_concurrent_trials=concurrency,
                                    reuse_actors=get_platform(sweep.base.platform).reuses_processes),
        run_config=tune.RunConfig(name=os.path.basename(experiment_dir), storage_path=storage,
                                  callbacks=[callback, *([cluster_watch] if cluster_watch else [])], verbose=0,
                                  stop=_stoppers(callback, plan, time_budget_s, left_s),
                                  failure_config=tune.FailureConfig(max_failures=sweep.retries)),
    )
    # After Tune's tuner.pkl: a sweep with a marker can always be resumed (resumed_runs.py).
    keep_tuner_file(experiment_dir)
    write_sweep_marker(experiment_dir, parent_run_id, "running", defines=defining_flags(plan))
    return _Run(tuner, callback, experiment_dir, parent_run_id, cluster_watch)


def _stoppers(callback: SweepCallback, plan: Plan, time_budget_s: Optional[float], left_s: Optional[float] = None):
    """What ends the search besides its trials: the utilisation goal; on a cluster the
    time budget less the waits for a place (Tune's own budget counts them); locally, with a
    confirmation and a budget, the time its best configs need (confirm.ConfirmationReserve)."""
    from ray.tune.stopper import CombinedStopper

    sweep = plan.sweep
    stoppers = [watch_goal(callback)] if sweep.stop_at_utilisation else []
    if time_budget_s is not None and _on_a_cluster(sweep):
        stoppers.append(fair_share.BudgetLessWaits(callback.sweep_token, time_budget_s))
    elif left_s is not None and sweep.confirm_rounds:
        register(callback)
        stoppers.append(ConfirmationReserve(callback.sweep_token, left_s, *plan.objectives[0]))
    return None if not stoppers else stoppers[0] if len(stoppers) == 1 else CombinedStopper(*stoppers)


def _study(plan: Plan, storage: str, name: str) -> SweepStudy:
    """The sweep's Optuna study (named after its parent run) in its database."""
    sweep = plan.sweep
    url = sweep.study_storage
    if url is None:
        url = default_study_storage(sweep.tracking_uri, storage)
        if url.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(url[len("sqlite:///"):]), exist_ok=True)
    return SweepStudy(url, name, plan.objectives, plan.space.distributions)


def _finish(plan: Plan, run: _Run, tracker, status: str, elapsed_s: float,
            parent_metrics: Mapping[str, float], confirmation: Optional[Confirmation] = None) -> SweepResult:
    """Close what the driver left running, mark the sweep ended, and summarise it on
    its parent run (also after a failed or interrupted fit). ``confirmation``: what the
    confirmation phase measured (its verdict is the sweep's)."""
    sweep = plan.sweep
    run.callback.adopt_run_ids()  # of runs created while MLflow's store was away, written since
    run.parent_run_id = tracker.parent_run_id = tracker.buffer.run_id_of(run.parent_run_id)
    # A store that does not answer can be read nothing from: --resume closes what is left open.
    try:
        left_open = tracker.trial_runs(only_running=True) if tracker.buffer.answering else {}
    except Exception as error:  # noqa: BLE001 - only a store that stopped answering is waited out
        if not unanswered(error):
            raise
        tracker.buffer.lost(error)  # gone since the last write: the end's writes are kept from here
        left_open = {}  # --resume closes what is still open
    for run_id, tags in left_open.items():
        if tags.get("status") == REUSED:  # a reused proposal's run its driver died before closing
            tracker.finish(run_id, "FINISHED")
            continue
        if status == "KILLED":  # the sweep was interrupted (a signal): --resume runs it again
            tracker.finish(run_id, "KILLED", tags={"status": INTERRUPTED})
            continue
        # A run left RUNNING by a driver that died, whose trial the resumed sweep did not run
        # again (resumed_runs.py proposes it first: its time budget or search ended before).
        tracker.finish(run_id, "FAILED", tags={"status": "failed", "error_class": LOST, "error_cause": "killed",
                                               "error": "its sweep's driver stopped while it ran, and the resumed "
                                                        "sweep ended before running it again"})
    records = sorted(run.callback.records.values(), key=lambda r: r.number)
    records = [r for r in records if r.run_id is not None]
    first_metric, first_mode = plan.objectives[0]
    baseline = next((r for r in records if r.is_baseline), None)
    pareto = pareto_set(records, plan.objectives)
    confirmed_records = confirmation.records if confirmation is not None else []
    # One answer (verdict.sweep_answer): the one the summary's table names.
    answer = sweep_answer(records, confirmed_records, first_metric, first_mode)
    best = answer.best
    confirm_note = ""
    if sweep.confirm_rounds and not confirmed_records:
        confirm_note = (confirmation.skipped if confirmation is not None and confirmation.skipped
                        else "the sweep stopped before it" if status == "KILLED" else "no confirmation trial ran")
    text = summary(f"{sweep.name} on {sweep.base.platform}", records, first_metric, first_mode,
                   list(plan.space.distributions), sweep.cost_note, tracker.ui_command(),
                   elapsed_s, metrics=plan.metrics, objectives=plan.objectives, planned_trials=sweep.num_samples,
                   searched_out=searched_out(run.callback.sweep_token), confirmations=confirmed_records,
                   confirm_note=confirm_note, goal_reached=run.callback.goal_reached or "", answer=answer)
    cluster_line = run.cluster_watch.line() if run.cluster_watch is not None else ""
    for line in (cluster_line, by_node_type(records, first_metric, first_mode)):
        if line:
            text += "\n" + line
    figures = {**parent_metrics, "trials": len(records), "elapsed_s": elapsed_s,  # the report's time is the console's
               "failed_trials": sum(r.status == FAILED for r in records),
               "rejected_trials": sum(r.status == REJECTED for r in records),
               "rejected_s": sum(r.wall_s for r in records if r.status == REJECTED and math.isfinite(r.wall_s)),
               "reused_proposals": sum(r.status == REUSED for r in records),
               "mean_overhead_s": mean_overhead_s(records), "pareto_trials": len(pareto)}
    judged = verdict(baseline, answer.leader, first_metric, first_mode, records)
    confirmed = answer.judgement
    if confirmed is not None:
        judged = confirmed.verdict
        figures["confirmation_s"] = confirmation.seconds
        if confirmation.noise is not None:  # what the confirmed candidates were chosen within
            figures["near_best_margin_pct"] = confirmation.near_best * 100
        figures["confirmation_rounds"] = confirmed.rounds
    if judged is not None:
        figures.update(judged.figures())
    for metric, mode in plan.objectives:  # each objective's own best (the first's: the answer), and the baseline's
        best_of_it = best if metric == first_metric else best_record(records, metric, mode)
        if best_of_it is not None:
            figures[f"best_{metric}"] = best_of_it.metric(metric)
        if baseline is not None and baseline.measured(metric):
            figures[f"baseline_{metric}"] = baseline.metric(metric)
    tracker.finish(run.parent_run_id, status, metrics=figures,
                   tags={"status": "interrupted" if status == "KILLED" else status.lower(),
                         "best_trial": str(best.number) if best else "none",
                         "search_leader_trial": str(answer.leader.number) if answer.leader else "none",
                         "pareto_trials": ", ".join(str(r.number) for r in pareto) or "none",
                         "verdict": judged.text if judged is not None else "none: no baseline or best measured",
                         "verdict_subject": judged.subject if judged is not None else "none",
                         **({CONFIRM_NOTE_TAG: confirm_note} if confirm_note else {}),
                         **({"cluster": cluster_line} if cluster_line else {}),
                         **({GOAL_REACHED_TAG: run.callback.goal_reached} if run.callback.goal_reached else {}),
                         SEARCHED_OUT_TAG: str(searched_out(run.callback.sweep_token)).lower()})
    if sweep.report and tracker.buffer.answering:  # the report reads the store
        log_report(tracker, run.parent_run_id, study=run.callback.study, say=sweep.print_line)
    # Last: a driver killed before this leaves a sweep --resume finishes (its parent run closed).
    write_sweep_marker(run.experiment_dir, run.parent_run_id, INTERRUPTED if status == "KILLED" else status.lower())
    return SweepResult(records=records, best=best, baseline=baseline, parent_run_id=run.parent_run_id,
                       experiment_id=tracker.experiment_id, summary=text, pareto=pareto,
                       tracking_uri=tracker.tracking_uri, mean_overhead_s=mean_overhead_s(records),
                       verdict=judged, confirmations=confirmed_records, search_leader=answer.leader)

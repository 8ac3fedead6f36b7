"""The cost of recording: the sweep driver's MLflow and Optuna writes per trial, against
each kind of store, at 1, 8 and 32 concurrent trials of a trivial trainable (issue 30, item 5).

    .venv/bin/python benchmarks/recording_cost.py               # every store, both modes: ~10 min on 2 cores
    .venv/bin/python benchmarks/recording_cost.py --quick --stores sqlite --modes writes   # seconds: a test
    .venv/bin/python benchmarks/recording_cost.py --out benchmarks/data/recording_cost_<machine>.json

The stores:
- ``sqlite``: the default, ``sqlite:///mlflow.db`` and its study ``mlflow.optuna.db`` beside it;
- ``server-sqlite``: a local ``mlflow server`` on a sqlite file (2 workers, as the team
  store's), the study in a sqlite file (a server store's default: ``optuna.db`` under the
  storage path);
- ``team-store``: ``accelsweep team-store up`` (sweeps/driver/ops/team_store.py): the MLflow
  server on PostgreSQL, the study on PostgreSQL (``--study-storage postgresql://...``,
  the password from PGPASSFILE).

Two modes, each through the driver's own code (nothing here re-implements a write):
- ``writes``: the write cost in isolation. The sweep callback (callbacks.SweepCallback,
  with its SweepTracker and SweepStudy, opened as lifecycle._start opens them) is handed
  trials the way Tune's loop hands them: ``concurrency`` trials start, each reports its
  windows (interleaved), each completes; then the next wave. No Ray, no trial processes:
  all the time is the driver's recording.
- ``sweep``: a real sweep (api.run_sweep: Tune, TPE, ASHA, the callback, the report) of a
  trivial trainable (tool_cost.trivial_trainable: two reports, no work) on a local Ray
  instance that declares 32 logical CPUs (each trial holds one; the machine has 2 cores),
  ``max_concurrent_trials`` = the concurrency.

In both, the driver's writes are timed where they are made: every SweepTracker write
(start_trial, log_metrics, finish, reopen, log_artifact) and every SweepStudy.record, and
every write the tracker's buffer sends to MLflow (TrackingBuffer._apply). Figures per
configuration: seconds of driver time in those writes per trial; seconds per trial of the
writes a server's store is sent behind the driver (``behind``: on the buffer's thread,
tracking_buffer.py); trials/s (``writes``: trials over the wall time, which ends when the
writes sent behind are written; ``sweep``: trials over the time from the first trial's
start to the last one's end); the recording-limited rate (1 / the larger of the two per
trial: what recording alone would allow the driver); and failed writes: writes that raised, writes
the buffer still kept at the end, a study the callback gave up on, errors logged by
MLflow, SQLAlchemy, Optuna or the driver, and, read back from the stores afterwards,
trials without a FINISHED run under the sweep's parent (with wall_s) or without their
study trial.

Target (issue 30): recording never slows a sweep of trivial trials below 10 trials/s per
driver (recording-limited rate >= 10), and zero failed writes.

Other engineers' tests share this machine: each configuration records the load average
before and after it and the CPU other processes used meanwhile (``others_cores_mean``;
our own Ray, MLflow server and PostgreSQL processes are not counted); one that ran beside
more than BUSY_CORES of others' CPU is run again (--reruns times); the table shows the
try beside the least of others' CPU, and every try is kept in the JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

if __name__ == "__main__":  # run as a script: benchmarks.* is imported from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from accelsweep import Objective, Sweep  # noqa: E402
from accelsweep.sweeps.driver.define.cli import main_guard  # noqa: E402
from accelsweep.sweeps.driver.ops import team_store  # noqa: E402
from accelsweep.sweeps.driver.ops.team_store import _answers, _stop_group  # noqa: E402
from accelsweep.sweeps.driver.record.optuna_study import SweepStudy, default_study_storage, shared_storage  # noqa: E402
from accelsweep.sweeps.driver.record import tracking  # noqa: E402
from accelsweep.sweeps.driver.record.tracking import SweepTracker, mlflow_client, open_tracker  # noqa: E402
from accelsweep.sweeps.driver.record import tracking_buffer  # noqa: E402
from accelsweep.sweeps.driver.record.tracking_buffer import TrackingBuffer  # noqa: E402
from accelsweep.sweeps.driver.run.callbacks import SweepCallback  # noqa: E402
from accelsweep.sweeps.driver.run.lifecycle import sweep_settings  # noqa: E402
from accelsweep.trainables.errors import ConfigError  # noqa: E402
from accelsweep.trainables.processes import descendants, process_table  # noqa: E402
from benchmarks.search_efficiency import _write_json, describe_machine  # noqa: E402
from benchmarks.tool_cost import (TrivialConfig, _small_metrics, default_out as tool_cost_out, json_safe,  # noqa: E402
                                  others_cpu_ticks, peak_overlap, run_timed, trial_end, trivial_trainable)

FORMAT = 1
STORES = ("sqlite", "server-sqlite", "team-store")
MODES = ("writes", "sweep")
CONCURRENCY = (1, 8, 32)
TARGET_TRIALS_PER_S = 10.0  # per driver, limited by recording alone
BUSY_CORES = 0.3  # others' mean CPU over a configuration above which it is run again
SERVER_WORKERS = 2  # the local server on sqlite: as many workers as the team store's
LOGGERS = ("mlflow", "sqlalchemy", "alembic", "optuna", "accelsweep")
LOGICAL_CPUS = 32  # the Ray instance of the sweep mode: room for 32 one-CPU trials at once


# --------------------------------------------------------------------------- timing the driver's writes


@dataclass
class WriteMeter:
    """Times and counts the driver's recording while it is installed (``installed``):
    SweepTracker's writes and SweepStudy.record (driver seconds), TrackingBuffer._apply
    (writes sent to MLflow, and those that raised)."""

    mlflow_s: float = 0.0
    optuna_s: float = 0.0
    calls: int = 0
    sent: int = 0  # writes the buffer sent to MLflow
    raised: list = field(default_factory=list)  # the driver's writes that raised (a tracker call, a study write)
    send_failures: list = field(default_factory=list)  # sends to MLflow that raised (kept, or raised above)
    behind_refused: list = field(default_factory=list)  # sends behind the driver refused (said and dropped)
    study_records: int = 0
    spans: list = field(default_factory=list)  # (start, end) of each of the driver's writes
    behind_spans: list = field(default_factory=list)  # (start, end) of each send behind the driver (its thread)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextlib.contextmanager
    def installed(self) -> Iterator["WriteMeter"]:
        patched = [(SweepTracker, name, "mlflow_s") for name in
                   ("start_trial", "log_metrics", "finish", "reopen", "log_artifact")]
        patched += [(SweepStudy, "record", "optuna_s"), (TrackingBuffer, "_apply", None)]
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
        for owner, name, bucket in patched:
            setattr(owner, name, self._timed(getattr(owner, name), name, bucket))
        try:
            yield self
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)

    def _timed(self, method: Callable, name: str, bucket: Optional[str]) -> Callable:
        meter = self

        @functools.wraps(method)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                result = method(*args, **kwargs)
            except Exception as error:
                with meter._lock:
                    # A send that fails surfaces as its tracker call's error, or is kept by the
                    # buffer (counted at the end if never written): counted once, there.
                    said = f"{name}: {type(error).__name__}: {str(error)[:200]}"
                    (meter.raised if bucket is not None else meter.send_failures).append(said)
                    behind = bucket is None and threading.current_thread() is not threading.main_thread()
                    if behind and not tracking_buffer.unanswered(error):
                        meter.behind_refused.append(said)  # no caller to raise it to: counted here
                raise
            finally:
                ended = time.perf_counter()
                took = ended - started
                with meter._lock:
                    if bucket is not None:
                        setattr(meter, bucket, getattr(meter, bucket) + took)
                        meter.spans.append((started, ended))
                        meter.calls += 1
                    else:
                        meter.sent += 1
                        if threading.current_thread() is not threading.main_thread():
                            meter.behind_spans.append((started, ended))
            if name == "record" and result:
                with meter._lock:
                    meter.study_records += 1
            return result

        return timed

    def busy_s(self, behind: bool = False) -> float:
        """The driver's time in its writes (``behind``: the sender's, sending behind it):
        the union of their spans."""
        total, reach = 0.0, -math.inf
        for start, end in sorted(self.behind_spans if behind else self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


@contextlib.contextmanager
def logged_errors() -> Iterator[list]:
    """ERROR (and worse) records of the stores' and the driver's loggers meanwhile."""
    seen: list[str] = []

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.name}: {record.getMessage()[:200]}")

    handler = Counter(level=logging.ERROR)
    for name in LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        yield seen
    finally:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)


# --------------------------------------------------------------------------- the machine's other load


class OthersWatch:
    """CPU other processes used meanwhile, sampled each second; ours (this process and
    what it started, PostgreSQL's processes included, which pg_ctl detaches) left out."""

    def __init__(self, roots: Callable[[], Sequence[int]] = lambda: ()):
        self.roots, self.ticks, self.seconds, self.busiest = roots, 0, 0.0, 0.0
        self.hertz = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.load_before = self.load_after = math.nan

    def _watch(self) -> None:
        before, then = process_table(), time.monotonic()
        while not self._stop.wait(1.0):
            after, now = process_table(), time.monotonic()
            ours = descendants(after, [os.getpid(), *self.roots()])
            ticks = others_cpu_ticks(before, after, ours)
            self.ticks += ticks
            self.seconds += now - then
            self.busiest = max(self.busiest, ticks / self.hertz / max(now - then, 1e-9))
            before, then = after, now

    def __enter__(self) -> "OthersWatch":
        self.load_before = os.getloadavg()[0]
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.load_after = os.getloadavg()[0]

    def summary(self) -> dict:
        return {"others_cores_mean": self.ticks / self.hertz / self.seconds if self.seconds else math.nan,
                "others_cores_max_1s": self.busiest, "load_1m_before": self.load_before,
                "load_1m_after": self.load_after}


# --------------------------------------------------------------------------- the stores


@dataclass
class Store:
    """Where one store's configurations record: the tracking URI, a study URL for each
    sweep (``study_url(name)``), and the processes it runs (for OthersWatch)."""

    name: str
    tracking_uri: str
    study_url: Callable[[str], str]
    pids: Callable[[], list] = lambda: []
    stop: Callable[[], None] = lambda: None
    note: str = ""


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _postmaster_pid(folder: str) -> list:
    try:
        with open(os.path.join(folder, "pgdata", "postmaster.pid")) as pid_file:
            return [int(pid_file.readline())]
    except (OSError, ValueError):
        return []


def open_store(kind: str, folder: str, say: Callable[[str], None]) -> Store:
    """Start (where it is a server) the store ``kind`` in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    if kind == "sqlite":
        uri = f"sqlite:///{folder}/mlflow.db"
        study = default_study_storage(uri, folder)  # mlflow.optuna.db beside it
        return Store(kind, uri, lambda name: study, note="mlflow.db and mlflow.optuna.db")
    if kind == "server-sqlite":
        port = free_port()
        started = time.monotonic()
        log = open(os.path.join(folder, "server.log"), "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder}/server.db",
             "--host", "127.0.0.1", "--port", str(port), "--workers", str(SERVER_WORKERS),
             "--uvicorn-opts", team_store.UVICORN_OPTS],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        uri = f"http://127.0.0.1:{port}"
        while not _answers(uri):
            if process.poll() is not None or time.monotonic() - started > 180:
                _stop_group(process.pid)
                raise RuntimeError(f"the MLflow server did not serve {uri}: see {folder}/server.log")
            time.sleep(0.5)
        say(f"  mlflow server on sqlite: {uri} ({time.monotonic() - started:.1f} s)")
        study = f"sqlite:///{folder}/optuna.db"

        def stop() -> None:
            _stop_group(process.pid)
            log.close()

        return Store(kind, uri, lambda name: study, pids=lambda: [process.pid], stop=stop,
                     note=f"mlflow server --workers {SERVER_WORKERS} on sqlite; study in a sqlite file")
    if kind == "team-store":
        started = time.monotonic()
        store = team_store.up(folder, pg_port=free_port(), mlflow_port=free_port(), say=lambda line: say("  " + line))
        os.environ["PGPASSFILE"] = store.credentials  # as a user exports it: libpq reads the password there
        # The server's login, as a team member exports it (the URI carries none).
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = store.mlflow_login()
        say(f"  team store up ({time.monotonic() - started:.1f} s)")
        return Store(kind, store.tracking_uri, lambda name: store.study_storage,
                     pids=lambda: [store.mlflow_pid, *_postmaster_pid(folder)],
                     stop=lambda: team_store.down(folder),
                     note=f"accelsweep team-store: mlflow server --workers {team_store.SERVER_WORKERS} on "
                          "PostgreSQL, study on PostgreSQL")
    raise ValueError(f"unknown store {kind!r}")


# --------------------------------------------------------------------------- reading the record back


def unrecorded(tracking_uri: str, experiment: str, parent_run_id: str, study_url: str, study_name: str,
               run_ids: Sequence[str]) -> dict:
    """What the stores lack afterwards, of the trials whose runs are ``run_ids`` (None: a
    trial whose run was never created): runs not FINISHED under the parent (or without
    wall_s), and trials without their study trial."""
    import optuna

    client = mlflow_client(tracking_uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=10000)
    finished = {r.info.run_id for r in runs if r.info.status == "FINISHED" and "wall_s" in r.data.metrics}
    study = optuna.load_study(study_name=study_name, storage=shared_storage(study_url))
    in_study = {t.user_attrs.get("mlflow_run_id") for t in study.get_trials(deepcopy=False)}
    # A trial whose run was never created (None) lacks both.
    return {"runs_missing": [str(r) for r in run_ids if r not in finished],
            "study_trials_missing": [str(r) for r in run_ids if r is None or r not in in_study],
            "extra_runs": len(runs) - len({r for r in run_ids if r}), "study_trials": len(in_study)}


# --------------------------------------------------------------------------- the two modes


@dataclass
class FakeTrial:
    """What SweepCallback reads of a Tune trial: its id and config."""

    trial_id: str
    config: dict


def measure_writes(store: Store, concurrency: int, trials: int, windows: int, scratch: str) -> dict:
    """Trials handed to the real SweepCallback as Tune's loop hands them, in waves of
    ``concurrency``; no Ray. All the time taken is the driver's recording."""
    from optuna.distributions import FloatDistribution

    name = f"recording-writes-{store.name}-c{concurrency}-{time.strftime('%H%M%S')}"
    lines: list[str] = []
    meter = WriteMeter()
    with sweep_settings(), logged_errors() as errors:
        tracker = open_tracker(store.tracking_uri, name, say=lines.append)
        experiment_dir = os.path.join(scratch, name)
        os.makedirs(experiment_dir, exist_ok=True)
        tracker.buffer.keep_in(experiment_dir)
        study = SweepStudy(store.study_url(name), name, [("score", "max")], {"x": FloatDistribution(0.0, 1.0)})
        study.claim()
        parent = tracker.start_sweep(study.name, {"num_samples": trials, "max_concurrent_trials": concurrency},
                                     {"sweep": name, "kind": "sweep"})
        callback = SweepCallback(tracker, complete_config=lambda searched: {"windows": windows, **searched},
                                 resources_of=lambda searched: {"CPU": 1.0}, baseline={"x": 0.5}, cost=None,
                                 trial_tags={"sweep": name}, total_trials=trials, print_line=lines.append,
                                 metrics=_small_metrics("score", ""), objective_metrics=["score"], study=study)
        hook_errors: list[str] = []

        def hook(method, *args, **kwargs) -> None:  # Tune would end the sweep on one; counted here
            try:
                method(0, [], *args, **kwargs)
                tracker.flush_due()  # as the callback's step does between Tune's events
            except Exception as error:  # noqa: BLE001 - a failed write is a figure
                hook_errors.append(f"{method.__name__}: {type(error).__name__}: {str(error)[:200]}")

        started = time.perf_counter()
        cpu_started = time.process_time()
        with meter.installed():
            for first in range(0, trials, concurrency):
                wave = [FakeTrial(f"t{n:05d}", {"x": (n % 97) / 97}) for n in range(first, min(first + concurrency,
                                                                                               trials))]
                for trial in wave:
                    hook(callback.on_trial_start, trial)
                for window in range(1, windows + 1):
                    for trial in wave:
                        hook(callback.on_trial_result, trial, {"score": trial.config["x"] * window,
                                                              "training_iteration": window, "loop_s": 0.001})
                for trial in wave:
                    hook(callback.on_trial_complete, trial)
            tracker.buffer.settle()  # the writes sent behind the driver are written: in the wall time
        wall_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        tracker.finish(parent, "FINISHED")
        kept = len(tracker.buffer.pending)
    run_ids = [r.run_id for r in callback.records.values()]
    missing = unrecorded(store.tracking_uri, name, parent, study.url, study.name, run_ids)
    return _figures(meter, trials, wall_s, wall_s, cpu_s, kept, callback.study is None, errors, hook_errors,
                    missing, lines, {"windows": windows})


def measure_sweep(store: Store, concurrency: int, trials: int, scratch: str) -> dict:
    """A real sweep (run_sweep) of the trivial trainable, ``concurrency`` at a time, on
    the Ray instance this process started (LOGICAL_CPUS logical CPUs)."""
    from ray import tune

    name = f"recording-sweep-{store.name}-c{concurrency}"
    meter = WriteMeter()
    sweep = Sweep(name=name, trainable=trivial_trainable, base=TrivialConfig(), metrics=_small_metrics("score", ""),
                  space={"x": tune.uniform(0.0, 1.0)}, objectives=[Objective("score", "max")], num_samples=trials,
                  tracking_uri=store.tracking_uri, study_storage=store.study_url(name),
                  storage_path=os.path.join(scratch, "ray"), max_concurrent_trials=concurrency, reject_ratio=None)
    cpu_started = time.process_time()
    with logged_errors() as errors, meter.installed():
        clock = run_timed(sweep)
    cpu_s = time.process_time() - cpu_started
    result = clock.result
    records = clock.trials
    first_start = min(r.created_at for r in records)
    last_end = max(trial_end(r) for r in records)
    parent = result.parent_run_id
    study_lines = [line for _, line in clock.lines if "could not be written" in line]
    parent_run = mlflow_client(store.tracking_uri).get_run(parent)
    study_name = parent_run.data.tags.get("optuna_study", "")
    missing = unrecorded(store.tracking_uri, name, parent, store.study_url(name), study_name,
                         [r.run_id for r in records])
    lines = [line for _, line in clock.lines]
    figures = _figures(meter, len(records), last_end - first_start, clock.wall_s, cpu_s, 0, bool(study_lines),
                       errors, [], missing, lines,
                       {"slots": clock.slots, "sweep_wall_s": clock.wall_s,
                        # the most trials alive at once, from their start to their end as the driver saw them
                        "peak_running": peak_overlap([(r.created_at, trial_end(r)) for r in records]),
                        "statuses": {s: sum(r.status == s for r in records) for s in {r.status for r in records}}})
    return figures


def _figures(meter: WriteMeter, trials: int, phase_s: float, wall_s: float, cpu_s: float, kept: int,
             study_dropped: bool, errors: list, hook_errors: list, missing: dict, lines: list, extra: dict) -> dict:
    write_s = meter.busy_s()
    per_trial = write_s / trials if trials else math.nan
    behind_per_trial = meter.busy_s(behind=True) / trials if trials else math.nan
    # The slower of the two, the driver's writes or the sends behind it, limits the rate.
    limiting = max(per_trial, behind_per_trial)
    failed = {"raised": len(meter.raised) + len(hook_errors), "refused_behind": len(meter.behind_refused),
              "kept_unwritten": kept, "study_dropped": int(study_dropped),
              "errors_logged": len(errors), "runs_missing": len(missing["runs_missing"]),
              "study_trials_missing": len(missing["study_trials_missing"])}
    return {
        "trials": trials,
        "write_s_per_trial": per_trial,
        "mlflow_s_per_trial": meter.mlflow_s / trials if trials else math.nan,
        "optuna_s_per_trial": meter.optuna_s / trials if trials else math.nan,
        "behind_s_per_trial": behind_per_trial,
        "recording_limited_trials_per_s": 1.0 / limiting if limiting > 0 else math.inf,
        "trials_per_s": trials / phase_s if phase_s > 0 else math.nan,
        "phase_s": phase_s, "wall_s": wall_s, "driver_cpu_s_per_trial": cpu_s / trials if trials else math.nan,
        "writes_sent": meter.sent, "sends_failed": len(meter.send_failures), "tracker_calls": meter.calls, "study_records": meter.study_records,
        "failed_writes": sum(failed.values()), "failed_by_kind": failed,
        "failures": (meter.raised + hook_errors + errors)[:20], "extra_runs": missing["extra_runs"],
        "said": [line for line in lines if "warning" in line or "error" in line.lower()][:10], **extra,
    }


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Counts:
    writes_trials: int = 64
    sweep_trials: int = 64
    windows: int = 2  # reports per trial (the trivial trainable's two)
    concurrency: tuple = CONCURRENCY


FULL = Counts()
QUICK = Counts(writes_trials=4, sweep_trials=4, windows=2, concurrency=(1, 2))


def passes(row: dict) -> Optional[bool]:
    if "error" in row:
        return None
    return row["recording_limited_trials_per_s"] >= TARGET_TRIALS_PER_S and row["failed_writes"] == 0


def run_configuration(store: Store, mode: str, concurrency: int, counts: Counts, scratch: str, reruns: int,
                      say: Callable[[str], None]) -> dict:
    """One store x mode x concurrency, run again while others' CPU made it contended."""
    tries = []
    for attempt in range(1 + reruns):
        with OthersWatch(store.pids) as watch:
            try:
                if mode == "writes":
                    row = measure_writes(store, concurrency, counts.writes_trials, counts.windows, scratch)
                else:
                    row = measure_sweep(store, concurrency, counts.sweep_trials, scratch)
            except Exception as error:  # noqa: BLE001 - a configuration that fails is said; the others run
                row = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
        row.update({"store": store.name, "mode": mode, "concurrency": concurrency, "attempt": attempt + 1,
                    **watch.summary()})
        row["contended"] = bool(row["others_cores_mean"] > BUSY_CORES)
        row["passed"] = passes(row)
        tries.append(row)
        say(format_row(row))
        if not row["contended"] or "error" in row:
            break
    return least_contended(tries)


def least_contended(tries: Sequence[dict]) -> dict:
    """The try beside the least of others' CPU (a measured one before one that failed to
    run), with the others kept under ``other_tries``."""
    ranked = sorted(range(len(tries)), key=lambda i: ("error" in tries[i], tries[i].get("others_cores_mean", math.inf)))
    final = dict(tries[ranked[0]])
    final["other_tries"] = [tries[i] for i in range(len(tries)) if i != ranked[0]]
    return final


HEADER = ("store", "mode", "conc", "trials", "write s/trial", "mlflow", "optuna", "behind", "rec-limited/s", "trials/s",
          "failed", "load before/after", "others cores", "verdict")


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['store']:<13} {row['mode']:<6} {row['concurrency']:>4}  not measured: {row['error']}"
    verdict = {True: "pass", False: "FAIL", None: "-"}[row["passed"]] + (" (contended)" if row["contended"] else "")
    return (f"{row['store']:<13} {row['mode']:<6} {row['concurrency']:>4} {row['trials']:>6} "
            f"{row['write_s_per_trial']:>13.4f} {row['mlflow_s_per_trial']:>6.4f} {row['optuna_s_per_trial']:>6.4f} "
            f"{row.get('behind_s_per_trial', 0.0):>6.4f} "
            f"{row['recording_limited_trials_per_s']:>13.1f} {row['trials_per_s']:>8.2f} {row['failed_writes']:>6} "
            f"{row['load_1m_before']:>8.2f}/{row['load_1m_after']:<8.2f} {row['others_cores_mean']:>12.2f} {verdict}")


def format_table(report: dict) -> str:
    machine = report["machine"]
    versions = machine.get("versions", {})
    head = (f"recording cost: {machine['cpu_model']}, {machine['usable_cpus']} CPUs, {machine.get('virtualisation', '')}"
            f"; {report['started_utc']} UTC; " + ", ".join(f"{k} {versions[k]}" for k in
                                                          ("ray", "mlflow", "optuna", "sqlalchemy", "psycopg")
                                                          if k in versions)
            + (f", PostgreSQL {machine['postgresql']}" if machine.get("postgresql") else ""))
    columns = (f"{'store':<13} {'mode':<6} {'conc':>4} {'trials':>6} {'write s/trial':>13} {'mlflow':>6} "
               f"{'optuna':>6} {'behind':>6} {'rec-limited/s':>13} {'trials/s':>8} {'failed':>6} {'load before/after':>17} "
               f"{'others cores':>12} verdict")
    rows = [format_row(row) for row in report["rows"]]
    target = (f"target: recording-limited rate >= {TARGET_TRIALS_PER_S:g} trials/s per driver (1 / the larger of "
              "write s and behind s per trial) and 0 failed writes")
    return "\n".join([head, target, columns, *rows])


def describe() -> dict:
    machine = describe_machine()
    for package in ("psycopg", "sqlalchemy", "optuna", "mlflow", "ray"):
        try:
            from importlib.metadata import version

            machine["versions"].setdefault(package, version(package))
        except Exception:  # noqa: BLE001 - not installed
            pass
    try:
        # The hypervisor (kvm), and the container inside it (docker) where there is one.
        found = [subprocess.run(["systemd-detect-virt", flag], capture_output=True, text=True,
                                timeout=10).stdout.strip() for flag in ("--vm", "--container")]
        machine["virtualisation"] = " + ".join(v for v in found if v and v != "none")
    except OSError:
        machine["virtualisation"] = ""
    postgres = shutil.which("postgres") or shutil.which("pg_ctl")
    if postgres:
        import re

        said = subprocess.run([postgres, "--version"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"\d+(\.\d+)+", said)
        machine["postgresql"] = found.group(0) if found else said.strip()
    machine["accelerator"] = "none"
    return machine


def run_benchmark(stores: Sequence[str], modes: Sequence[str], counts: Counts, scratch: str, reruns: int,
                  say: Callable[[str], None]) -> list[dict]:
    rows: list[dict] = []
    ray_started = False
    try:
        for kind in stores:
            say(f"store {kind}:")
            try:
                store = open_store(kind, os.path.join(scratch, kind), say)
            except Exception as error:  # noqa: BLE001 - a store that cannot start is said; the others run
                for mode in modes:
                    for concurrency in counts.concurrency:
                        rows.append({"store": kind, "mode": mode, "concurrency": concurrency,
                                     "error": f"store did not start: {type(error).__name__}: {str(error)[:300]}",
                                     "passed": None})
                        say(format_row(rows[-1]))
                continue
            try:
                for mode in modes:
                    if mode == "sweep" and not ray_started:
                        import ray

                        # "local": a new instance even where a `ray start` cluster runs; logical CPUs
                        # so that 32 one-CPU trials of nothing fit at once on 2 cores.
                        ray.init(address="local", num_cpus=max(LOGICAL_CPUS, max(counts.concurrency)),
                                 include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
                        ray_started = True
                    for concurrency in counts.concurrency:
                        rows.append(run_configuration(store, mode, concurrency, counts,
                                                      os.path.join(scratch, kind), reruns, say))
            finally:
                store.stop()
                if kind == "team-store":
                    os.environ.pop("PGPASSFILE", None)
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    return rows


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default=",".join(STORES), help=f"of {', '.join(STORES)} (default all)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)} (default both)")
    parser.add_argument("--concurrency", default=None, help="comma-separated (default 1,8,32; --quick 1,2)")
    parser.add_argument("--quick", action="store_true", help="4 trials per configuration: a test, not a figure")
    parser.add_argument("--writes-trials", type=int, default=None, help=f"trials per writes configuration "
                                                                          f"(default {FULL.writes_trials})")
    parser.add_argument("--sweep-trials", type=int, default=None, help=f"trials per sweep configuration "
                                                                         f"(default {FULL.sweep_trials})")
    parser.add_argument("--reruns", type=int, default=1, help="times a contended configuration is run again")
    parser.add_argument("--out", default=None, help="the JSON file (default: benchmarks/data/recording_cost_"
                                                    "<machine>.json; --quick: the temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (stores, Ray results)")
    # What each of the two changes to recording buys (the server's TCP_NODELAY, writes held for a
    # trial's next one), side by side in one run (docs/team-store.md).
    parser.add_argument("--server-http", choices=("nodelay", "uvicorn"), default="nodelay",
                        help="the servers' HTTP protocol: the team store's, with TCP_NODELAY (default), or "
                             "uvicorn's own, without it (as before)")
    parser.add_argument("--hold-s", type=float, default=None,
                        help=f"how long a trial's params and windows are held for its next write (default "
                             f"{tracking.HOLD_S:g}; 0: each is its own write, as before)")
    parser.add_argument("--send", choices=("behind", "inline"), default="behind",
                        help="a server's writes to a run that exists sent behind the driver, on a thread "
                             "(default), or each waited for (as before)")
    parser.add_argument("--auth-cache-s", type=int, default=None,
                        help=f"the team store's cache of logins that passed (default "
                             f"{team_store.AUTH_CACHE_TTL_S} s; 0: off, MLflow's default, as before)")
    args = parser.parse_args(argv)
    if args.send == "inline":
        tracking_buffer.BEHIND_OPS = ()  # as before: the driver waits for each write
    if args.auth_cache_s is not None:
        team_store.AUTH_CACHE_TTL_S = args.auth_cache_s
    if args.server_http == "uvicorn":
        team_store.UVICORN_OPTS = "--http auto"
    if args.hold_s is not None:
        tracking.HOLD_S = args.hold_s
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for value, allowed, flag in ((stores, STORES, "--stores"), (modes, MODES, "--modes")):
        if not value or any(v not in allowed for v in value):
            raise ConfigError(flag, f"a comma-separated list of {', '.join(allowed)}", ",".join(value))
    counts = QUICK if args.quick else FULL
    if args.writes_trials:
        counts = dataclasses.replace(counts, writes_trials=args.writes_trials)
    if args.sweep_trials:
        counts = dataclasses.replace(counts, sweep_trials=args.sweep_trials)
    if args.concurrency:
        counts = dataclasses.replace(counts, concurrency=tuple(int(c) for c in args.concurrency.split(",")))
    say = lambda line: print(line, flush=True)  # noqa: E731
    started = time.monotonic()
    machine = describe()
    report: dict[str, Any] = {"format": FORMAT, "command": " ".join(["benchmarks/recording_cost.py", *(argv or [])]),
                              "quick": args.quick, "server_http": args.server_http, "hold_s": tracking.HOLD_S,
                              "send": args.send, "auth_cache_s": team_store.AUTH_CACHE_TTL_S, "counts": dataclasses.asdict(counts), "machine": machine,
                              "started_utc": machine["date_utc"], "target_trials_per_s": TARGET_TRIALS_PER_S}
    # Under /tmp itself: as root, PostgreSQL runs as postgres, which must reach the folder.
    scratch = tempfile.mkdtemp(prefix="recording_cost-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.chmod(scratch, 0o755)
    say(f"Recording cost: stores {', '.join(stores)}; modes {', '.join(modes)}; concurrency "
        f"{', '.join(map(str, counts.concurrency))}; scratch {scratch}; load {os.getloadavg()[0]:.2f}")
    try:
        rows = run_benchmark(stores, modes, counts, scratch, args.reruns, say)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    machine["load_average_1m_after"] = os.getloadavg()[0]
    report["elapsed_s"] = time.monotonic() - started
    report["rows"] = rows
    out = args.out or default_out(args.quick)
    _write_json(json_safe(report), out)
    table = format_table(report)
    with open(os.path.splitext(out)[0] + ".txt", "w") as text:
        text.write(table + "\n")
    print(table)
    print(f"JSON: {out}")
    return report


def default_out(quick: bool) -> str:
    return tool_cost_out(quick).replace("tool_cost_", "recording_cost_")


if __name__ == "__main__":
    main_guard(lambda: main(sys.argv[1:]))

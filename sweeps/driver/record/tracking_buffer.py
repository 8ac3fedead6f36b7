"""MLflow writes that outlast a lost tracking server.

SweepTracker (tracking.py) sends each of its writes (create_run, log_batch, update_run,
set_terminated, log_artifact) through a TrackingBuffer. While the store answers, a write
goes straight through. When it does not answer (connection refused or reset, a timeout,
a 502/503/504 from a proxy, a database that is down), that write and every one after it
are kept, in order and on disk, and the trials go on; the store is tried again every few
seconds, and the kept writes are written in order once it answers. After ``wait_s``
without an answer the buffer gives up and the sweep stops, to be resumed.

Through a server, the writes to a run that exists (its batches, its end) go out behind
the driver, on a thread of their own, in order: the driver goes on to the next trial's run
and the study's write while the server answers. Anything that reads the store, or writes
other than those, waits for them first (``settle``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Iterator, Optional

from accelsweep.trainables import ray_adapter
from accelsweep.trainables.errors import SweepStopped
from accelsweep.trainables.loop.failures import one_line
from accelsweep.sweeps.driver.record.secrets import redact_text, scrub, secret_values

__all__ = ["BUFFER_DIR", "DEFAULT_WAIT_S", "MLFLOW_REQUEST_SETTINGS", "PLACEHOLDER_PREFIX", "TrackingBuffer",
           "WRITES_FILE", "unanswered"]

PLACEHOLDER_PREFIX = "accelsweep-pending-"
TUNE_LOGGER = "ray.tune.tune"
BUFFER_DIR = "tracking-buffer"  # under the sweep's experiment dir
WRITES_FILE = "writes.jsonl"
# A restarted server, a rescheduled pod or a database failover is back within a few
# minutes. Past ten, a person has to act, and a sweep should not run on for hours with
# nothing in MLflow to see. Waiting costs nothing: the trials keep running and every
# result is kept.
DEFAULT_WAIT_S = 600.0
# How often a lost store is tried again (at most; a try that itself took longer, a
# server that swallows packets, waits as long again, so probing never takes most of
# the driver's time).
RETRY_EVERY_S = 5.0
# MLflow's own retries of one HTTP request, for a sweep's duration (lifecycle.SWEEP_ENVIRONMENT).
# Its defaults (7 retries, backoff factor 2, 120 s timeout) block the driver for minutes
# on each write to a server that is gone; the buffer waits out outages instead. One
# retry still absorbs a dropped connection; 20 s is ample for a small batch or a plot.
MLFLOW_REQUEST_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                           "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}

# The writes sent behind the driver where the store is a server (``behind``): they need no
# answer (a run's creation does: its id), and none is read before ``settle``.
BEHIND_OPS = ("log_batch", "update_run", "set_terminated")
# Writes waiting to go out behind the driver, at most: one that makes them faster than the
# store takes them waits for room, so memory stays bounded (a few trials' worth).
BEHIND_MAX = 256

# MLflow's REST client wraps every failure to get an answer (refused, reset, timed out,
# retries on 5xx exhausted) as "API request to <url> failed with [timeout] exception ...".
_NO_ANSWER = re.compile(r"API request to \S+ failed with (timeout )?exception")


def unanswered(error: BaseException) -> bool:
    """Whether ``error`` says the store did not answer, rather than that it refused the
    write (a bad value, an unknown run): only the first is waited out."""
    from mlflow.exceptions import MlflowException, RestException

    if isinstance(error, MlflowException):
        if error.error_code == "TEMPORARILY_UNAVAILABLE":  # a 503, or a SQL store's lost database
            return True
        return not isinstance(error, RestException) and bool(_NO_ANSWER.match(str(error.message)))
    import requests

    return isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                              ConnectionError, TimeoutError))


# What urllib3 says inside MLflow's message, shown instead of the whole of it (a
# paragraph that names the URL twice).
_REASONS = (re.compile(r"Failed to establish a new connection: (\[Errno -?\d+\] [^\"')]+)"),
            re.compile(r"(too many \d+ error responses)"), re.compile(r"((?:Read|Connect)?\s*timed out)", re.I),
            re.compile(r"(Connection (?:aborted|reset|refused)[^\"')]*)"))


def said_of(error: BaseException) -> str:
    """An error as a line of output: why the store did not answer, or MLflow's message
    (which quotes the request's URL: redacted)."""
    text = one_line(error)
    for reason in _REASONS:
        found = reason.search(text)
        if found:
            return found.group(1).strip()
    return redact_text(text, secret_values())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _clean(op: dict[str, Any]) -> dict[str, Any]:
    """What a kept write saves: its names and text scrubbed again (they were on the way
    in; the file must hold no credential whoever called)."""
    op = dict(op)
    if "run_name" in op:
        op["run_name"] = redact_text(str(op["run_name"]), secret_values())
    if isinstance(op.get("tags"), dict):
        op["tags"] = {k: str(v) for k, v in scrub(op["tags"]).items()}
    for field in ("params", "tags"):
        if isinstance(op.get(field), list):
            op[field] = [list(pair) for pair in scrub(dict(op[field])).items()]
    return op


class TrackingBuffer:
    """The tracker's writes, in order, through a store that may go away.

    - a run created while the store does not answer gets a placeholder id
      (``accelsweep-pending-<hex>``); the callback keeps it in its TrialRecord (and Tune
      pickles it for --resume). The kept writes name runs by it; when they are written,
      each placeholder becomes the id MLflow gave (``run_id_of``), also where a tag holds
      it (``mlflow.parentRunId``);
    - the store is tried again at most every RETRY_EVERY_S: at each write, and at each step
      of Tune's loop (``retry``);
    - kept writes are saved as JSON lines under the sweep's experiment dir
      (``tracking-buffer/writes.jsonl``, with copies of the files to log beside it), so a
      driver killed during an outage loses none of them, and --resume writes them before
      anything else (``keep_in``);
    - when the store has not answered for ``wait_s`` (``Sweep.tracking_wait_s``,
      ``--tracking-wait-s``), the buffer gives up: inside Tune's loop the sweep stops as
      Ctrl-C stops it (running trials are stopped, and run again on --resume), and the
      sweep ends with SweepStopped, which says where the writes are and how to resume.

    The values reaching the buffer were scrubbed by the tracker (secrets.scrub); what it
    saves is scrubbed once more, so that no credential, and not the tracking URI, is in the
    file. A write the server applied but whose answer was lost (a timeout) is written again:
    MLflow takes a repeated metric, param, tag or status as the same write; a run created
    twice would be a duplicate (seen only when a create_run times out)."""

    def __init__(self, client, store: str, behind: bool = False):
        self.client = client
        self.store = store  # the tracking URI as it may be shown (secrets.redact_uri)
        self.behind = behind  # BEHIND_OPS go out on a thread of their own (a server's store)
        self.wait_s = DEFAULT_WAIT_S
        self.say: Callable[[str], None] = lambda line: print(line, flush=True)
        self.pending: list[dict[str, Any]] = []  # kept writes, oldest first
        self.resolved: dict[str, str] = {}  # placeholder -> the id MLflow gave the run
        self.folder: Optional[str] = None  # where kept writes are saved (keep_in)
        self.down_since: Optional[float] = None  # monotonic; None while the store answers
        self.gave_up = False
        self.halted = False  # a stop came while the store did not answer: writes are kept, not tried
        self._next_try = 0.0
        self._staging: Optional[str] = None  # copies of files to log, before keep_in
        self._interrupt: Optional[Callable[[], None]] = None  # set while Tune's loop runs
        # Writes on their way behind the driver, oldest first (the first is being sent);
        # the lock guards them, ``pending`` and the file, between the driver and the sender.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._behind: deque = deque()
        self._sender: Optional[threading.Thread] = None

    # The tracker's writes. Each returns the run's id (for create_run: a placeholder
    # while the store does not answer).
    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, Any]) -> str:
        return self._write({"op": "create_run", "run_id": PLACEHOLDER_PREFIX + uuid.uuid4().hex,
                            "experiment_id": experiment_id, "run_name": run_name,
                            "tags": {k: str(v) for k, v in tags.items()}, "start_time": _now_ms()})

    def log_batch(self, run_id: str, metrics=(), params=(), tags=()) -> str:
        """``metrics``, ``params``, ``tags``: MLflow's Metric, Param and RunTag entities."""
        return self._write({"op": "log_batch", "run_id": run_id,
                            "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
                            "params": [[p.key, p.value] for p in params], "tags": [[t.key, t.value] for t in tags]})

    def update_run(self, run_id: str, status: str) -> str:
        return self._write({"op": "update_run", "run_id": run_id, "status": status})

    def set_terminated(self, run_id: str, status: str) -> str:
        return self._write({"op": "set_terminated", "run_id": run_id, "status": status, "end_time": _now_ms()})

    def log_artifact(self, run_id: str, path: str, artifact_path: Optional[str] = None) -> str:
        return self._write({"op": "log_artifact", "run_id": run_id, "path": path, "artifact_path": artifact_path})

    def run_id_of(self, run_id: Optional[str]) -> Optional[str]:
        """The id MLflow gave a run created while its store did not answer (``run_id``
        itself for any other, and while it is not written yet)."""
        return self.resolved.get(run_id, run_id) if run_id else run_id

    @property
    def answering(self) -> bool:
        """No writes are kept: the store answered the last one (it can be read). Waits for
        the writes on their way (``settle``)."""
        self.settle()
        return not self.pending

    def settle(self) -> None:
        """Wait until the writes sent behind the driver are written, or kept (the store
        did not answer one: it and those after it, in order)."""
        with self._changed:
            while self._behind:
                self._changed.wait()

    @property
    def path(self) -> Optional[str]:
        return os.path.join(self.folder, WRITES_FILE) if self.folder else None

    def _write(self, op: dict[str, Any]) -> str:
        if self.behind and op["op"] in BEHIND_OPS:
            with self._changed:
                if not self.pending and not self.gave_up:
                    while len(self._behind) >= BEHIND_MAX:
                        self._changed.wait()
                    self._behind.append(op)
                    self._start_sender()
                    self._changed.notify_all()
                    return op["run_id"]
        elif op["op"] != "create_run":  # a new run's creation cannot come before its own writes
            self.settle()
        if not self.pending and not self.gave_up:
            try:
                return self._apply(op)
            except Exception as error:  # noqa: BLE001 - sorted below: only an unanswered write is kept
                if not unanswered(error):
                    raise
                self._lost(error)
        self._keep(op)
        self.retry()
        return op["run_id"]

    def _start_sender(self) -> None:
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(target=self._send_behind, name="accelsweep-mlflow-writes", daemon=True)
            self._sender.start()

    def _send_behind(self) -> None:
        """The sender: each write in turn. One the store did not answer is kept with every
        write after it, ahead of those kept since (they are newer); a refused one is said
        and dropped, as a refused kept write is (``retry``)."""
        while True:
            with self._changed:
                while not self._behind:
                    self._changed.wait()
                op = self._behind[0]
            try:
                self._apply(op)
            except Exception as error:  # noqa: BLE001 - sorted below, as _write and retry sort them
                with self._changed:
                    if unanswered(error):
                        self.pending[:0] = [_clean(kept) for kept in self._behind]
                        self._behind.clear()
                        if self.down_since is None:
                            self._lost(error)
                        self._save()
                    else:
                        self._behind.popleft()
                        self.say(f"warning: MLflow refused a write ({op['op']} of run {op['run_id']}): "
                                 f"{said_of(error)}; it is dropped")
                    self._changed.notify_all()
                continue
            with self._changed:
                if self._behind and self._behind[0] is op:
                    self._behind.popleft()
                self._changed.notify_all()

    def _apply(self, op: dict[str, Any]) -> str:
        """Send one write to MLflow; the run's id."""
        from mlflow.entities import Metric, Param, RunTag

        kind, run_id = op["op"], self.run_id_of(op["run_id"])
        if kind == "create_run":
            tags = {k: self.run_id_of(v) for k, v in op["tags"].items()}
            return self.client.create_run(op["experiment_id"], start_time=op["start_time"], tags=tags,
                                          run_name=op["run_name"]).info.run_id
        if run_id.startswith(PLACEHOLDER_PREFIX):
            raise LookupError(f"run {run_id} was never created (its create_run was refused)")
        if kind == "log_batch":
            self.client.log_batch(run_id, metrics=[Metric(*metric) for metric in op["metrics"]],
                                  params=[Param(*param) for param in op["params"]],
                                  tags=[RunTag(key, self.run_id_of(value)) for key, value in op["tags"]])
        elif kind == "update_run":
            self.client.update_run(run_id, status=op["status"])
        elif kind == "set_terminated":
            self.client.set_terminated(run_id, status=op["status"], end_time=op["end_time"])
        elif kind == "log_artifact":
            copy = op.get("copy")
            self.client.log_artifact(run_id, os.path.join(self._files(), copy) if copy else op["path"],
                                     op["artifact_path"])
        else:
            raise ValueError(f"unknown kept write {kind!r}")
        return run_id

    def lost(self, error: BaseException) -> None:
        """The store did not answer a read: from now on writes are kept, as after a write."""
        if self.down_since is None:
            self._lost(error)

    def _lost(self, error: BaseException) -> None:
        self.down_since = time.monotonic()
        self._next_try = self.down_since + self._retry_every_s
        self.say(f"warning: the MLflow tracking store {self.store} did not answer ({said_of(error)}); the trials go "
                 f"on, and their MLflow writes are kept in order until it answers (for up to {self.wait_s:g} s, "
                 "--tracking-wait-s)")

    @property
    def _retry_every_s(self) -> float:
        return min(RETRY_EVERY_S, self.wait_s / 4)

    def _keep(self, op: dict[str, Any]) -> None:
        op = _clean(op)
        if op["op"] == "log_artifact" and os.path.isfile(op["path"]):
            # The file may be gone when the store answers (the report's temporary folder).
            op["copy"] = os.path.join("artifacts", f"{uuid.uuid4().hex[:8]}-{os.path.basename(op['path'])}")
            os.makedirs(os.path.join(self._files(), "artifacts"), exist_ok=True)
            shutil.copy2(op["path"], os.path.join(self._files(), op["copy"]))
        with self._lock:
            self.pending.append(op)
            if self.folder:
                os.makedirs(self.folder, exist_ok=True)
                with open(self.path, "a") as saved:
                    saved.write(json.dumps(op) + "\n")

    def _files(self) -> str:
        if self.folder:
            return self.folder
        if self._staging is None:
            self._staging = tempfile.mkdtemp(prefix="accelsweep-tracking-buffer-")
        return self._staging

    def halt(self) -> None:
        """Stop trying the store (a stop was requested while it did not answer): every
        write from now on is kept on disk, for --resume (or the next run) to write."""
        self.halted = True

    def retry(self, force: bool = False) -> None:
        """Write the kept writes if the store answers again (tried at most every few
        seconds, unless ``force``); give up when it has not answered for ``wait_s``."""
        self.settle()
        if not self.pending or self.gave_up or self.halted:
            return
        if not force and time.monotonic() < self._next_try:
            self._give_up_if_late()
            return
        started, written = time.monotonic(), 0
        while self.pending:
            op = self.pending[0]
            try:
                run_id = self._apply(op)
            except Exception as error:  # noqa: BLE001 - a refusal must not hold back the writes after it
                if unanswered(error):
                    if self.down_since is None:
                        self._lost(error)
                    break
                self.say(f"warning: MLflow refused a kept write ({op['op']} of run {op['run_id']}): "
                         f"{said_of(error)}; it is dropped")
            else:
                if op["op"] == "create_run":
                    self.resolved[op["run_id"]] = run_id
            self.pending.pop(0)
            written += 1
            if op.get("copy"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self._files(), op["copy"]))
        if written:
            self._save()
        if not self.pending:
            since = f" after {time.monotonic() - self.down_since:.0f} s" if self.down_since is not None else ""
            self.say(f"the MLflow tracking store {self.store} answers{since}: {written} kept write(s) written")
            self.down_since = None
            return
        ended = time.monotonic()
        self._next_try = ended + max(self._retry_every_s, ended - started)
        self._give_up_if_late()

    def _give_up_if_late(self) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()  # kept writes of a stopped run that cannot be written yet
        if time.monotonic() - self.down_since < self.wait_s:
            return
        self.gave_up = True
        self.say(f"the MLflow tracking store {self.store} has not answered for {self.wait_s:g} s: stopping the "
                 "sweep (running trials end as interrupted; --resume runs them again)")
        if self._interrupt is not None:
            self._interrupt()

    def drain(self) -> None:
        """At the end of the trials: wait for the store (what is left of ``wait_s``) and
        write the kept writes, or give up."""
        self.settle()
        if self.pending and not self.gave_up:
            left = self.wait_s - (time.monotonic() - (self.down_since or time.monotonic()))
            self.say(f"the trials are done; waiting up to {max(left, 0):.0f} s for the MLflow tracking store "
                     f"{self.store} to write {len(self.pending)} kept write(s)")
        while self.pending and not self.gave_up and not self.halted:
            self.retry(force=True)
            if self.pending and not self.gave_up:
                deadline = self.down_since + self.wait_s
                time.sleep(max(0.1, min(self._next_try, deadline) - time.monotonic()))

    @contextlib.contextmanager
    def stopping_tune(self) -> Iterator[None]:
        """While Tune's loop runs (``Tuner.fit``): giving up stops it as Ctrl-C does."""
        tune_logger = logging.getLogger(TUNE_LOGGER)
        level = tune_logger.level
        self._interrupt = self._stop_tune
        try:
            yield
        finally:
            self._interrupt = None
            tune_logger.setLevel(level)

    def _stop_tune(self) -> None:
        """Tune's own stop (stop_signals.py uses it for SIGINT and SIGTERM): it saves the
        experiment one last time, stops the running trials and returns from fit."""
        stop_tune = ray_adapter.tune_interrupt_handler()
        if stop_tune is None or threading.current_thread() is not threading.main_thread():
            # fit runs in another thread (the handler found is an earlier run's): raised
            # out of Tune's loop, which stops the trials; its state is as of its last save.
            raise self.stopped()
        # Its lines on a stop ("Stop signal received (e.g. via SIGINT/Ctrl+C)", "Resume
        # with Tuner.restore") would contradict the sweep's own.
        logging.getLogger(TUNE_LOGGER).setLevel(logging.CRITICAL)
        stop_tune(signal.SIGUSR1, None)

    def stopped(self) -> SweepStopped:
        """The end of a sweep that gave up on its store: where its writes are, how to go on."""
        where = (f"{len(self.pending)} MLflow write(s) are saved in {self.path}" if self.path else
                 f"{len(self.pending)} MLflow write(s) could not be saved (no experiment directory yet)")
        return SweepStopped(f"the MLflow tracking store {self.store} did not answer for {self.wait_s:g} s "
                            f"(--tracking-wait-s), so the sweep stopped; {where}. Start the store again, then run "
                            "the same command with --resume: the saved writes are written first, then the "
                            "interrupted trials run again.")

    def keep_in(self, experiment_dir: str) -> None:
        """Save kept writes under ``experiment_dir`` from now on. Writes an earlier driver
        kept there (a stopped sweep, now resumed) are written first, before anything else."""
        folder = os.path.join(experiment_dir, BUFFER_DIR)
        if folder == self.folder:
            return
        self.settle()
        earlier = self._load(folder)
        if self._staging is not None:  # files kept before the experiment dir existed
            shutil.copytree(self._staging, folder, dirs_exist_ok=True)
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        self.folder = folder
        self.pending = earlier + self.pending
        if self.pending or self.resolved:
            self._save()
        if earlier:
            self.say(f"writing {len(earlier)} MLflow write(s) kept by the stopped run ({self.path})")
            self.retry(force=True)

    def _load(self, folder: str) -> list[dict[str, Any]]:
        """The writes kept in ``folder`` (its placeholders' ids join ``resolved``)."""
        path = os.path.join(folder, WRITES_FILE)
        if not os.path.exists(path):
            return []
        kept = []
        with open(path) as saved:
            for line in saved:
                if not line.strip():
                    continue
                entry = json.loads(line)
                if "resolved" in entry:
                    self.resolved.update(entry["resolved"])
                else:
                    kept.append(entry)
        return kept

    def _save(self) -> None:
        """The file as it stands: the placeholders' ids, then the writes still kept."""
        if not self.folder:
            return
        with self._lock:
            self._save_now()

    def _save_now(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        partial = self.path + ".tmp"
        with open(partial, "w") as saved:
            saved.write(json.dumps({"resolved": self.resolved}) + "\n")
            for op in self.pending:
                saved.write(json.dumps(op) + "\n")
        os.replace(partial, self.path)

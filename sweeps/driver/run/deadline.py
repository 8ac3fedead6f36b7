"""A per-trial progress deadline (``Sweep.trial_timeout_s``, ``--trial-timeout-s``),
enforced by the driver.

A trial that stops making progress (a deadlocked DataLoader, a collective waiting for a
dead peer, a compiler that never returns) reports nothing, and Tune would wait for it
for ever. Nothing inside the trial can end it reliably: trainables/loop/watchdog.py's
exception reaches the trial's thread only at its next bytecode, and a thread blocked in
C (a futex, a socket read) runs none. The driver still runs, so the rule lives here:
SweepCallback applies it at every iteration of Tune's loop (``on_step_begin``), and a
trial silent for longer than its deadline, counted from its start or its last report,
has its process tree killed on its node, is not retried, and is recorded FAILED with
cause ``timeout``. The driver's own pauses do not count as a trial's silence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from accelsweep.sweeps.driver.define.plan import check_trial_timeout
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.processes import children_by_parent, process_table
from accelsweep.trainables.loop.failures import TIMEOUT

__all__ = ["StallRule", "TIMEOUT_ERROR", "TrialDeadline", "check_trial_timeout", "deadline_for", "kill_process_tree"]

# The error class a timed-out trial's run is tagged with (failures.py maps it to TIMEOUT).
TIMEOUT_ERROR = "TrialTimeout"
# A gap between two checks longer than this is the driver's own pause (a slow MLflow write,
# saving the experiment), not the trials' silence: a report may be waiting, unread, for the
# driver. Tune's loop checks about every 0.1 s; saving the experiment takes well under this.
DRIVER_PAUSE_S = 5.0
RUNNING = "RUNNING"  # ray.tune.experiment.Trial.RUNNING, without importing Tune here


def deadline_for(timeout_s: Optional[float]) -> Optional["TrialDeadline"]:
    """The deadline SweepCallback enforces for ``Sweep.trial_timeout_s``; None: none."""
    return TrialDeadline(float(timeout_s)) if timeout_s is not None else None


@dataclass
class StallRule:
    """Which running trials have been silent for longer than ``timeout_s``. Pure: the
    caller gives the clock's readings (``now``, in seconds)."""

    timeout_s: float
    # trial id -> (when it last showed life, what that was: "it started" / "its last report")
    heard: dict[str, tuple[float, str]] = field(default_factory=dict)
    last_check: Optional[float] = None

    def started(self, trial_id: str, now: float) -> None:
        self.heard[trial_id] = (now, "it started")

    def reported(self, trial_id: str, now: float) -> None:
        self.heard[trial_id] = (now, "its last report")

    def overdue(self, running: Iterable[str], now: float) -> list[tuple[str, float, str]]:
        """(trial id, seconds silent, since what) for each of the ``running`` trials silent
        for longer than the deadline. A trial first seen here starts its clock now; a
        trial no longer running is forgotten."""
        running = set(running)
        paused = now - self.last_check if self.last_check is not None else 0.0
        self.last_check = now
        for trial_id, (when, since) in list(self.heard.items()):
            if trial_id not in running:
                del self.heard[trial_id]
            elif paused > DRIVER_PAUSE_S:
                self.heard[trial_id] = (when + paused, since)
        for trial_id in running:
            self.heard.setdefault(trial_id, (now, "it started"))
        return [(trial_id, now - when, since) for trial_id, (when, since) in self.heard.items()
                if now - when > self.timeout_s]


class TrialDeadline:
    """The rule applied to a sweep's Tune trials; SweepCallback calls it (``started``,
    ``reported``, ``enforce``) and asks ``error_of`` when Tune reports the trial lost."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.rule = StallRule(timeout_s)
        self.clock = clock
        self.ended: dict[str, tuple[str, str, str]] = {}  # trial id -> (error class, error, cause)

    def started(self, trial_id: str) -> None:
        self.rule.started(trial_id, self.clock())

    def reported(self, trial_id: str) -> None:
        self.rule.reported(trial_id, self.clock())

    def enforce(self, trials: Iterable[Any]) -> list[Any]:
        """End each running trial past its deadline; returns the trials ended now. Tune
        then sees a lost process, tells the searcher the trial failed (Optuna records it
        FAILED) and starts the next one; SweepCallback records it with ``error_of``."""
        running = {trial.trial_id: trial for trial in trials
                   if trial.status == RUNNING and trial.trial_id not in self.ended}
        ended = []
        for trial_id, silent_s, since in self.rule.overdue(running, self.clock()):
            trial = running[trial_id]
            # Tune's retries are for a process that went away by itself; this one would hang again.
            trial.max_failures, failures_allowed = 0, trial.max_failures
            what = end_trial_processes(trial)
            if what is None:  # no actor yet (Tune is between two states): checked again next time
                trial.max_failures = failures_allowed
                continue
            self.ended[trial_id] = (TIMEOUT_ERROR, f"no report for {silent_s:.1f} s since {since}, past its "
                                                  f"deadline of {self.timeout_s:g} s (trial_timeout_s): {what}",
                                    TIMEOUT)
            ended.append(trial)
        return ended

    def error_of(self, trial_id: str) -> Optional[tuple[str, str, str]]:
        """(error class, error, cause) of a trial this deadline ended; None for any other."""
        return self.ended.get(trial_id)


def end_trial_processes(trial) -> Optional[str]:
    """Kill a Tune trial's process tree on its node (see kill_process_tree); says what
    was killed (None: the trial has no actor to kill). Not waited for on another node:
    the driver's loop must not stall."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray_adapter.trial_actor(trial)
    if actor is None:
        return None
    try:
        where = ray_adapter.actor_process(actor)
    except Exception as error:  # noqa: BLE001 - the GCS did not answer: the actor is still ended
        where, why = None, f"{type(error).__name__}: {error}"
    else:
        why = "Ray's actor table has no live process for it"
    if where is None:
        ray.kill(actor, no_restart=True)
        return f"its actor was killed, but its process was not found ({why}): what it started may outlive it"
    node_id, pid = where
    if node_id == ray.get_runtime_context().get_node_id():
        others = kill_process_tree(pid)
        return f"its process (pid {pid}) and {others} process{'es' if others != 1 else ''} it started were killed"
    on_its_node = NodeAffinitySchedulingStrategy(node_id, soft=False)
    ray.remote(num_cpus=0, scheduling_strategy=on_its_node)(kill_process_tree).remote(pid)
    return f"its process (pid {pid} on node {node_id[:8]}) and those it started were killed"


def kill_process_tree(pid: int) -> int:
    """SIGKILL process ``pid``, every process it started, and its process group when it
    leads one; returns how many processes besides it were found. Each process is stopped
    (SIGSTOP) before its children are listed, so none starts another unseen; nothing is
    killed before the whole tree is known (a child whose parent has died is re-parented
    and can no longer be found from it). Reads /proc (Linux, where Ray's workers run)."""
    if pid <= 1 or pid == os.getpid():
        raise ValueError(f"refusing to kill process {pid}: not a trial's")
    found, frontier = {pid}, [pid]
    while frontier:
        for member in frontier:
            _signal(member, signal.SIGSTOP)
        children = children_by_parent(process_table())
        frontier = [child for member in frontier for child in children.get(member, ()) if child not in found]
        found.update(frontier)
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid != os.getpgid(0):  # its own group (not the killer's): Ray's per-worker group
            os.killpg(pid, signal.SIGKILL)
    for member in found:
        _signal(member, signal.SIGKILL)
    return len(found) - 1


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)

"""Several sweeps' drivers on one cluster take turns at its trial slots.

Ray schedules placement groups, not sweeps, and Tune keeps an ended trial's actor (and its
slot) for the same sweep's next trial: on a hosts cluster with two slots, four smoke
sweeps started together, one ran no trial in 120 s. So a driver that joins a cluster asks
the cluster's arbiter (a detached actor with no CPU on the head, one per cluster) for a
seat before Tune may create a trial, and gives it back when Tune ends the trial. A freed
seat goes to the sweep holding fewest, then to the one whose seats were held for the least
time (so sweeps of short trials get their share of the slots' time), and only where
Ray has room now or the autoscaler can still add it (cluster_room.py; a seat beyond both
waits in Ray's queue, where newer requests overtake it); with nothing held, one seat even
where there is no room, for an autoscaler. A sweep alone is never held back. While another waits, no trial's process is kept
(``reuse_ok``), and a sweep's time with none of its trials placed is not in its budget.
``Seats`` is the rule (tested alone), ``_Arbiter`` serves it, ``Gate`` is a driver's side.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

from ray.tune.stopper import Stopper

from accelsweep.sweeps.driver.run import cluster_room
from accelsweep.trainables import ray_adapter

__all__ = ["Answer", "BudgetLessWaits", "Gate", "Seats", "gate_of", "join", "reuse_ok"]

# The arbiter outlives the drivers that started it (detached): drivers running another
# version of this file find their own arbiter, not one whose rule they do not share.
with open(__file__, "rb") as _source:
    ARBITER_NAME = f"accelsweep-fair-share-{hashlib.sha256(_source.read()).hexdigest()[:12]}"
NAMESPACE = "accelsweep"
# A sweep that has not asked for this long is no longer waiting (it got a seat, or its
# driver stopped asking: ended, or its own concurrency is full). Tune asks every loop.
ASK_FRESH_S = 10.0
# A denied driver asks again after this long, not at every pass of Tune's loop.
ASK_EVERY_S = 0.5
# How often the arbiter reads which jobs (drivers) are alive: a killed driver's seats are freed.
JOBS_EVERY_S = 2.0
# How often the arbiter reads the autoscaler's limits again (a config a restarted head changed).
LIMITS_EVERY_S = 30.0
# A wait longer than this between two asks is the driver's own pause, not waiting for a seat.
LONGEST_COUNTED_GAP_S = 5.0


@dataclass
class Answer:
    granted: bool
    others: list[tuple[str, int]]  # (label, seats held) of every other sweep on the cluster
    waiting: int  # other sweeps asking now, or holding a seat whose trial has no place yet
    capacity: dict[str, float]
    why: str = ""


@dataclass
class _Sweep:
    label: str
    job: str
    held: dict[str, dict[str, float]] = field(default_factory=dict)  # trial id -> its resources
    unplaced: set = field(default_factory=set)  # trial ids granted whose trial has not started
    asking_since: Optional[float] = None
    asked_at: float = float("-inf")
    since: dict[str, float] = field(default_factory=dict)  # trial id -> when its seat was given
    used_s: float = 0.0  # seat-seconds of the seats it gave back (and its start level: Seats.ask)

    def used(self, now: float) -> float:
        """Its seats' time so far: of two holding as few, the one with less goes first."""
        return self.used_s + sum(now - given for given in self.since.values())


class Seats:
    """The rule: who gets the next seat. ``capacity``: the cluster's resources now."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.sweeps: dict[str, _Sweep] = {}

    def ask(self, token: str, label: str, job: str, trial_id: str, shape: Mapping[str, float],
            capacity: Mapping[str, float], free: Mapping[str, float], room: Mapping[str, float] = ()) -> Answer:
        """``room``: what the cluster's autoscaler can still add to ``capacity``."""
        now = self.clock()
        if token not in self.sweeps:
            # A sweep that joins late starts level with the least served of the others, so it
            # does not take every freed seat until its slot time has caught up with theirs.
            self.sweeps[token] = _Sweep(label, job, used_s=min((s.used(now) for s in self.sweeps.values()),
                                                               default=0.0))
        me = self.sweeps[token]
        me.asked_at = now
        if me.asking_since is None:
            me.asking_since = now
        others = {t: s for t, s in self.sweeps.items() if t != token}
        if not any(s.held or self._asking(s, now) for s in others.values()):
            return self._grant(me, token, trial_id, shape, capacity, "alone on the cluster")
        first = min((s for s in self.sweeps.values() if self._asking(s, now)),
                    key=lambda s: (len(s.held), s.used(now), s.asking_since))
        if first is not me:
            return self._deny(token, capacity, f"{first.label} holds fewer seats or has held them for less time")
        # Free is what Ray has free now and what the autoscaler can still add, less the seats
        # given whose trials have no place yet (Ray does not know them yet, or waits for the
        # nodes they asked for). Ray's own count sees what no seat stands for: a
        # confirmation's trials, an actor Tune is still stopping, another tool's work.
        promised = self._held(unplaced_only=True)
        room = dict(room)
        fits = all(amount <= free.get(r, 0.0) + room.get(r, 0.0) - promised.get(r, 0.0) + 1e-9
                   for r, amount in shape.items())
        if fits or not any(self._held().values()):  # nothing held: one trial, the demand an autoscaler answers
            return self._grant(me, token, trial_id, shape, capacity, "its turn")
        return self._deny(token, capacity, "every seat is held")

    def placed(self, token: str, trial_id: str) -> None:
        if token in self.sweeps:
            self.sweeps[token].unplaced.discard(trial_id)

    def release(self, token: str, trial_id: str) -> None:
        sweep = self.sweeps.get(token)
        if sweep is not None:
            sweep.held.pop(trial_id, None)
            sweep.unplaced.discard(trial_id)
            given = sweep.since.pop(trial_id, None)
            if given is not None:
                sweep.used_s += self.clock() - given

    def leave(self, token: str) -> None:
        self.sweeps.pop(token, None)

    def keep_jobs(self, alive: set) -> list[str]:
        """Forget the sweeps whose driver's job ended (a crash, a kill): their seats are free."""
        gone = [t for t, s in self.sweeps.items() if s.job and s.job not in alive]
        for token in gone:
            del self.sweeps[token]
        return gone

    def status(self, token: str, capacity: Mapping[str, float]) -> Answer:
        return Answer(False, self._others(token), self._waiting(token), dict(capacity))

    def _asking(self, sweep: _Sweep, now: float) -> bool:
        return sweep.asking_since is not None and now - sweep.asked_at < ASK_FRESH_S

    def _held(self, unplaced_only: bool = False) -> dict[str, float]:
        total: dict[str, float] = {}
        for sweep in self.sweeps.values():
            for trial_id, resources in sweep.held.items():
                if unplaced_only and trial_id not in sweep.unplaced:
                    continue
                for name, amount in resources.items():
                    total[name] = total.get(name, 0.0) + amount
        return total

    def _others(self, token: str) -> list[tuple[str, int]]:
        return [(s.label, len(s.held)) for t, s in sorted(self.sweeps.items()) if t != token]

    def _waiting(self, token: str) -> int:
        now = self.clock()
        return sum(1 for t, s in self.sweeps.items() if t != token and (self._asking(s, now) or s.unplaced))

    def _grant(self, me: _Sweep, token: str, trial_id: str, shape, capacity, why: str) -> Answer:
        me.held[trial_id] = dict(shape)
        me.unplaced.add(trial_id)
        me.since[trial_id] = self.clock()
        me.asking_since = None
        return Answer(True, self._others(token), self._waiting(token), dict(capacity), why)

    def _deny(self, token: str, capacity, why: str) -> Answer:
        return Answer(False, self._others(token), self._waiting(token), dict(capacity), why)


def _arbiter_class():
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class _Arbiter:
        """``Seats`` on the cluster, with its resources and its live jobs read here."""

        def __init__(self):
            self.seats = Seats()
            self.jobs_read_at = float("-inf")
            self.autoscaling = None  # cluster_room.Autoscaling, read every LIMITS_EVERY_S
            self.autoscaling_read_at = float("-inf")

        def _capacity(self) -> dict[str, float]:
            return {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}

        def _room(self, shape: Mapping[str, float]) -> dict[str, float]:
            """What the autoscaler can still add for trials of ``shape``: their resources."""
            if time.monotonic() - self.autoscaling_read_at >= LIMITS_EVERY_S:
                self.autoscaling_read_at = time.monotonic()
                self.autoscaling = cluster_room.read_autoscaling()
            if self.autoscaling is None:
                return {}
            slots = cluster_room.slots_to_add(shape, self.autoscaling, ray_adapter.nodes_up())
            return {name: amount * slots for name, amount in shape.items()}

        def _forget_ended_jobs(self) -> None:
            if time.monotonic() - self.jobs_read_at < JOBS_EVERY_S:
                return
            self.jobs_read_at = time.monotonic()
            self.seats.keep_jobs(ray_adapter.live_job_ids())

        def ask(self, token, label, job, trial_id, shape) -> Answer:
            self._forget_ended_jobs()
            return self.seats.ask(token, label, job, trial_id, shape, self._capacity(), ray.available_resources(),
                                  self._room(shape))

        def placed(self, token, trial_id) -> None:
            self.seats.placed(token, trial_id)

        def release(self, token, trial_id) -> None:
            self.seats.release(token, trial_id)

        def leave(self, token) -> None:
            self.seats.leave(token)

        def status(self, token) -> Answer:
            self._forget_ended_jobs()
            return self.seats.status(token, self._capacity())

    return _Arbiter


class Gate:
    """One driver's side: asks for a seat before a trial is created, says while it waits."""

    def __init__(self, arbiter: Any, token: str, label: str, job: str, shape: Mapping[str, float],
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.arbiter, self.token, self.label, self.job = arbiter, token, label, job
        self.shape, self.say, self.clock = dict(shape), say, clock
        self.running: set = set()  # trial ids holding a seat
        self.started: set = set()  # those of them whose trial has a place (its process started)
        self.ever_placed = False  # a trial of this sweep has had a place
        self._told_sharing = False
        self.waited_s = 0.0  # waiting for a seat with no trial of this sweep holding one
        self.last: Optional[Answer] = None
        self._denied_at: Optional[float] = None
        self._said_at = float("-inf")
        self._ticked_at: Optional[float] = None
        self._refreshed_at = float("-inf")

    def _call(self, method: str, *args, timeout: float = 10.0):
        import ray

        return ray.get(getattr(self.arbiter, method).remote(*args), timeout=timeout)

    def may_create(self, trial_id: str) -> bool:
        """A seat for ``trial_id``, or False (Tune asks again later)."""
        now = self.clock()
        if self._denied_at is not None and now - self._denied_at < ASK_EVERY_S:
            return False
        try:
            answer = self._call("ask", self.token, self.label, self.job, trial_id, self.shape)
        except Exception as error:  # noqa: BLE001 - no arbiter: Ray's own queue decides, as before
            self.say(f"fair share: the cluster's arbiter did not answer ({type(error).__name__}): "
                     "trials go to Ray's queue without taking turns")
            self.arbiter = None
            return True
        self.last = answer
        if answer.others and not self._told_sharing:
            self._told_sharing = True
            self.say(f"sharing the cluster with {len(answer.others)} other sweep(s): trials take turns at its "
                     f"slots, a freed one going to the sweep holding fewest (fair_share.py)")
        self._tick(now)
        if answer.granted:
            self.running.add(trial_id)
            self._denied_at = None
            return True
        self._denied_at = now
        if not self.started:
            self._say_waiting(answer, now)
        return False

    def _say_waiting(self, answer: Answer, now: float) -> None:
        if now - self._said_at < 30.0:
            return
        self._said_at = now
        holding = [(label, n) for label, n in answer.others if n]
        held = ", ".join(f"{label} {n}" for label, n in holding) or "none"
        need = ", ".join(f"{v:g} {k}" for k, v in self.shape.items() if v)
        have = ", ".join(f"{answer.capacity.get(k, 0):g} {k}" for k, v in self.shape.items() if v)
        self.say(f"waiting for a place: a trial needs {need}; the cluster has {have}, held by "
                 f"{len(holding)} other sweep(s) (their trials: {held}); none of this sweep's runs. "
                 "Sweeps on one cluster take turns; the wait is not counted in the time budget. "
                 "A cluster of your own: ray up cluster.yaml")

    def _tick(self, now: float) -> None:
        """Counts the time since the last tick as waiting when this sweep asked for a seat
        in vain and none of its trials has a place. Not the time a seated trial takes to
        be placed and start its process: a sweep alone takes that too (the trial's wait_s)."""
        last, self._ticked_at = self._ticked_at, now
        if last is not None and not self.started and self._denied_at is not None:
            self.waited_s += min(now - last, LONGEST_COUNTED_GAP_S)

    def placed(self, trial_id: str) -> None:
        self._tick(self.clock())
        self.started.add(trial_id)
        self.ever_placed = True
        self._tell("placed", trial_id)

    def release(self, trial_id: str) -> None:
        self.running.discard(trial_id)
        self.started.discard(trial_id)
        self._tell("release", trial_id)

    def others_waiting(self) -> bool:
        return self.last is not None and self.last.waiting > 0

    def refresh(self) -> None:
        """The arbiter's view now (at most every ASK_EVERY_S): whether another sweep waits."""
        now = self.clock()
        if self.arbiter is None or now - self._refreshed_at < ASK_EVERY_S:
            return
        self._refreshed_at = now
        self._tick(now)
        try:
            self.last = self._call("status", self.token, timeout=2.0)
        except Exception:  # noqa: BLE001 - asked again next time
            pass

    def leave(self) -> None:
        self._tell("leave")
        _GATES.pop(self.token, None)

    def _tell(self, method: str, *args) -> None:
        if self.arbiter is None:
            return
        try:
            self._call(method, self.token, *args, timeout=5.0)
        except Exception:  # noqa: BLE001 - a lost arbiter: a restarted one starts empty
            pass


# The seat a sweep's confirmation holds for the whole phase: its trials, alive together,
# share the CPUs of one trial (confirm.py), and they are not created through the searcher.
CONFIRMATION = "confirmation"


@contextlib.contextmanager
def seat_for_confirmation(gate: Optional[Gate], stopping: Callable[[], bool],
                          longest_wait_s: Optional[float]) -> Iterator[None]:
    """Waits for one seat before the confirmation, holds it through. A stop request ends
    the wait, and so does ``longest_wait_s`` of it: then the confirmation's trials wait in
    Ray's queue, as any trial without a seat."""
    if gate is None:
        yield
        return
    waited_before = gate.waited_s
    while not gate.may_create(CONFIRMATION):
        if stopping() or (longest_wait_s is not None and gate.waited_s - waited_before > longest_wait_s):
            break
        time.sleep(ASK_EVERY_S)
    gate.placed(CONFIRMATION)
    try:
        yield
    finally:
        gate.release(CONFIRMATION)


_GATES: dict[str, Gate] = {}


def join(token: str, label: str, shape: Mapping[str, float], say: Callable[[str], None]) -> Gate:
    """This driver's gate on the cluster it is connected to (the arbiter started if none is)."""
    import ray

    arbiter = _arbiter_class().options(name=ARBITER_NAME, namespace=NAMESPACE, lifetime="detached",
                                       get_if_exists=True, resources=ray_adapter.HEAD_NODE_RESOURCE).remote()
    gate = Gate(arbiter, token, label, ray.get_runtime_context().get_job_id(), shape, say)
    _GATES[token] = gate
    return gate


def gate_of(token: str) -> Optional[Gate]:
    return _GATES.get(token)


def reuse_ok() -> bool:
    """Whether an ended trial may keep its process for this driver's next trial: not while
    another sweep waits for a place (its slot would stay this sweep's)."""
    for gate in list(_GATES.values()):
        gate.refresh()
        if gate.others_waiting():
            return False
    return True


class BudgetLessWaits(Stopper):
    """A Tune stopper: the sweep's time budget on its own clock, which stops while the
    sweep waits for a seat with no trial running. A sweep that waited its whole budget with
    no trial ever placed stops too (it says so: cli.py ``nothing_measured``); one that has
    run trials goes on however long its waits add up to (four sweeps on two slots each
    wait about half their time: their waits reached their budgets, and three were stopped
    mid-search with most of their budgets unspent)."""

    def __init__(self, sweep_token: str, budget_s: float):
        self.sweep_token, self.budget_s = sweep_token, budget_s
        self.started = time.time()  # saved with the experiment, read again on --resume

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        gate = gate_of(self.sweep_token)
        waited = gate.waited_s if gate is not None else 0.0
        never_placed = gate is not None and not gate.ever_placed
        return time.time() - self.started - waited >= self.budget_s or (never_placed and waited >= self.budget_s)


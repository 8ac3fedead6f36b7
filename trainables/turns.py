"""Trials that take turns: several configs alive at once on one host, one measuring at a time.

Why: on a shared or virtualised host the machine's own speed drifts, and not every config
drifts alike (benchmarks/host_drift.py). Trials run one after another each see one moment
of the host: a gain over a baseline measured a minute apart is the drift's as much as the
config's. So the confirmation phase keeps every config it compares alive in its own trial
process and lets them measure one window each in turn, round after round (rotated: A B C,
B C A, C A B): each round compares the configs within seconds; the rounds span the host's levels.

The baton is a small named Ray actor (``TurnBaton``, started by the driver). A trial that
takes turns (``trial_turns``; the training loop reads ``current_turns``) says it is ready
after its warm-up (no window is measured until every config is ready or gone), waits for
each turn (``Turns.take``), drains its loader (``drain_steps``), measures one window and
passes the baton on; it leaves when it ends, in any way, and a silent holder is passed over.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Iterator, Mapping, Optional, Sequence

from accelsweep.trainables.ray_adapter import on_this_node

__all__ = ["TURN_WINDOW_STEPS", "TurnBaton", "Turns", "current_turns", "drain_steps", "trial_turns", "turn_key",
           "turn_window_steps"]

STALL_S = 180.0  # a trial that holds the baton (or the start) this long without a word is passed over
# A waiting trial's call returns after this long at most ('wait': it calls again), so a
# baton that died leaves no trial blocked for good; the baton looks for silent holders
# at least this often while anyone waits.
WAIT_S = 5.0


def turn_key(searched: Mapping[str, Any]) -> str:
    """The name a config takes turns under: its searched values (one trial per config)."""
    return json.dumps(dict(searched), sort_keys=True, default=str)


# A turn's window needs the time floor (window_min_s), not the search's step floor: its
# figure is one of a round's pairs, and the rounds, not the steps in one window, carry the
# statistics. The search's step floor made a large batch hold the baton several times as long
# per turn as the others (docs/budget.md, the confirmation in turns): a round that long
# compares its configs across more of the host's drift, and fewer rounds fit the budget.
# Two steps, not one: a window's step-time percentiles and its loss need a step after the first.
TURN_WINDOW_STEPS = 2


def turn_window_steps(window_min_steps: int) -> int:
    """The fewest steps in a window measured in turns (``TURN_WINDOW_STEPS``)."""
    return min(window_min_steps, TURN_WINDOW_STEPS)


def drain_steps(num_workers: int, prefetch_factor: int = 2) -> int:
    """Untimed steps before a turn's window: every batch the loader's workers prefetched
    while the trial waited (torch's DataLoader keeps ``prefetch_factor`` per worker); they
    would time faster than the loader feeds. No step for the wait itself: the first step
    after it costs about 10 ms more than the rest, alike for every config, a fraction of a
    window's time floor, where an untimed step cost a whole one
    (benchmarks/results/turn_first_step.md)."""
    return max(0, num_workers) * prefetch_factor


class TurnBaton:
    """Whose turn it is. ``order``: the configs' keys, one entry per window, in the order
    they measure; ``stall_s``: how long a silent holder keeps the baton."""

    def __init__(self, order: Sequence[str], stall_s: float = STALL_S):
        self.order = list(order)
        self.position = 0
        self.waiting_for = set(self.order)  # not ready yet
        self.gone: set[str] = set()
        self.measured: list[str] = []  # the keys in the order their windows ran
        self.stall_s = stall_s
        self.last_word = time.monotonic()
        self.passed_over: list[str] = []
        self._moved = None  # an asyncio.Event while trials wait (wait_turn): set when the baton moves

    def _heard(self) -> None:
        """A word from a trial: the stall clock restarts, and waiting trials look again."""
        self.last_word = time.monotonic()
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    def ready(self, key: str) -> None:
        """``key`` has warmed up. No turn is given while any config is not ready (or gone), so
        nobody's timed window runs beside another's compile or warm-up."""
        self.waiting_for.discard(key)
        self._heard()

    def leave(self, key: str) -> None:
        """``key`` measures no more: its turns still to come are dropped. A trial says so
        however it ends, and the driver says so for a trial that died."""
        if key in self.gone:
            return
        self.gone.add(key)
        self.waiting_for.discard(key)
        self.order = self.order[:self.position] + [k for k in self.order[self.position:] if k != key]
        self._heard()

    def done(self, key: str) -> None:
        if self.position < len(self.order) and self.order[self.position] == key:
            self.measured.append(key)
            self.position += 1
        self._heard()

    def turn(self, key: str) -> str:
        """'go' (``key``'s turn now), 'wait' or 'over' (no turn of ``key``'s is left)."""
        self._pass_over_the_silent()
        if key in self.gone or key not in self.order[self.position:]:
            return "over"
        if self.waiting_for:
            return "wait"
        return "go" if self.order[self.position] == key else "wait"

    async def wait_turn(self, key: str, longest_s: float = WAIT_S) -> str:
        """``turn(key)``, answered as soon as it is not 'wait', or 'wait' after
        ``longest_s``. Ray runs the baton as an async actor for this method: many trials
        wait at once, each in one call, and the baton wakes them only when it moves."""
        import asyncio

        deadline = time.monotonic() + longest_s
        while True:
            answer = self.turn(key)
            left = deadline - time.monotonic()
            if answer != "wait" or left <= 0:
                return answer
            if self._moved is None:
                self._moved = asyncio.Event()
            try:  # the timeout: the stall rule is a matter of time, not of a word
                await asyncio.wait_for(self._moved.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass

    def _pass_over_the_silent(self) -> None:
        if time.monotonic() - self.last_word < self.stall_s:
            return
        silent = set(self.waiting_for) or ({self.order[self.position]} if self.position < len(self.order) else set())
        for key in silent:
            self.passed_over.append(key)
            self.leave(key)

    def state(self) -> dict[str, Any]:
        return {"measured": list(self.measured), "left": self.order[self.position:], "gone": sorted(self.gone),
                "passed_over": list(self.passed_over), "waiting_for": sorted(self.waiting_for)}

    @classmethod
    def start(cls, name: str, order: Sequence[str], stall_s: float = STALL_S) -> Any:
        """The baton as a named Ray actor beside the driver (no CPU: it holds a list). Ray
        ends a named actor with its last handle: the caller keeps this one."""
        import ray

        return ray.remote(num_cpus=0)(cls).options(name=name, **on_this_node()).remote(order, stall_s)


class Turns:
    """A trial's side of the baton."""

    def __init__(self, baton: Any, key: str):
        self.baton, self.key = baton, key

    def _call(self, method: str, *args) -> Any:
        import ray

        return ray.get(getattr(self.baton, method).remote(*args), timeout=60)

    def ready(self) -> None:
        self._call("ready", self.key)

    def take(self) -> bool:
        """Wait for this trial's turn: True when it has one, False when none is left.
        Blocked in one call to the baton that returns when the turn comes: asking on a timer
        instead cost the measuring process nothing measurable (benchmarks/turn_waiting.py),
        but one call is exact and quieter."""
        while True:
            answer = self._call("wait_turn", self.key)
            if answer != "wait":
                return answer == "go"

    def done(self) -> None:
        self._call("done", self.key)

    def leave(self) -> None:
        self._call("leave", self.key)


# Per thread: a trial runs its loop in the thread that entered trial_turns; another thread
# of the same process (a test's, a second trainable's) must not find its turns.
_current = threading.local()


@contextlib.contextmanager
def trial_turns(baton_name: Optional[str], searched: Mapping[str, Any]) -> Iterator[None]:
    """The turns of the trial this thread runs now (None: it does not take turns). Its
    remaining turns are given up when it ends, however it ends."""
    if baton_name is None:
        yield
        return
    import ray

    turns = Turns(ray.get_actor(baton_name), turn_key(searched))
    saved, _current.turns = current_turns(), turns
    try:
        yield
    finally:
        _current.turns = saved
        try:
            turns.leave()
        except Exception:  # noqa: BLE001 - the baton gone (the sweep ended): there is nobody to tell
            pass


def current_turns() -> Optional[Turns]:
    return getattr(_current, "turns", None)

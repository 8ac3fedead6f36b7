"""The sweep's goal (``Sweep.stop_at_utilisation``, ``--stop-at-utilisation``): once a
trial has run whole at or above that share of the hardware's peak, further tuning has
little left to win, so the sweep ends there and its summary says why.

The callback decides (callbacks.SweepCallback._check_goal, on a trial's end, its windows
uncontended); ``UtilisationGoal`` is the Tune stopper that ends the run when it has. The
stopper holds only the sweep's token: Tune pickles its stoppers with the experiment
state, and the callback, with its MLflow client, stays in this process.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Stopper

__all__ = ["UtilisationGoal", "callback_of", "register", "watch_goal"]

_CALLBACKS: dict[str, Any] = {}  # sweep token -> its SweepCallback, in the driver's process


def register(callback) -> None:
    """``callback`` found by its sweep token (``callback_of``) by this process's stoppers."""
    _CALLBACKS[callback.sweep_token] = callback


def callback_of(sweep_token: str) -> Any:
    """The SweepCallback registered under ``sweep_token`` here (None: another process's, or
    a resumed sweep's stopper unpickled before its callback was registered)."""
    return _CALLBACKS.get(sweep_token)


def watch_goal(callback) -> "UtilisationGoal":
    register(callback)
    return UtilisationGoal(callback.sweep_token)


class UtilisationGoal(Stopper):
    def __init__(self, sweep_token: str):
        self.sweep_token = sweep_token

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False  # a trial is never cut for its own figure: the goal ends the sweep

    def stop_all(self) -> bool:
        callback = callback_of(self.sweep_token)
        return callback is not None and callback.goal_reached is not None

"""The Optuna searcher a sweep uses (imported when a sweep runs: it imports Ray Tune).

A module of its own, because Tune pickles the searcher with the experiment state: its
class must be importable by name."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional

from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

__all__ = ["FailureAwareOptunaSearch", "MAX_REPEATED_PROPOSALS", "config_key", "take_reuses"]

# Proposals in a row of configs already measured before the space counts as searched
# out: TPE keeps proposing its best region, and a small space runs out of new points.
MAX_REPEATED_PROPOSALS = 20

# Reused proposals waiting for the sweep's callback to record them, and the sweeps whose
# searcher ran out of new configs, by sweep: the searcher and the callback are separate
# objects Tune pickles apart, in one driver process.
_REUSES: dict[str, list[tuple[dict, str]]] = {}
_SEARCHED_OUT: set[str] = set()
# Configs of trials a killed driver started after Tune's last save (their MLflow runs are
# orphans), for the resumed searcher to propose first: a trial of that config adopts the run.
_ORPHANED: dict[str, list[dict]] = {}


def propose_again(sweep_token: str, configs: list[dict]) -> None:
    """Have the sweep's (resumed) searcher propose ``configs`` next, before its own."""
    _ORPHANED[sweep_token] = list(configs)


def config_key(config: Mapping[str, Any]) -> str:
    """One config's identity: equal for equal knob values, whatever their order."""
    return json.dumps(dict(config), sort_keys=True, default=str)


def _finite(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def searched_out(sweep_token: str) -> bool:
    """Whether the sweep's searcher ended the search: its proposals kept repeating
    measured configs (a grid used up)."""
    return sweep_token in _SEARCHED_OUT


def take_reuses(sweep_token: str) -> list[tuple[dict, str]]:
    """The proposals the searcher answered from an earlier trial since the last call:
    (the proposed config, the trial id whose result it reused)."""
    return _REUSES.pop(sweep_token, [])


class FailureAwareOptunaSearch(OptunaSearch):
    """Optuna through Tune, with two changes.

    A trial that reported its own failure (trainables.failures.run_isolated) is a failed
    Optuna trial: not a pruned one, and not a NaN value Optuna refuses. TPE then samples
    away from it.

    A proposal identical to a config this sweep has already measured is not run again
    (unless ``repeats``): Optuna is told that trial's result as the proposal's, and asked
    again. TPE re-proposes its best points (the baseline among them) as a matter of
    course; a second run of one config is noise, not information, and once it was named
    "best" at +26% with every knob unchanged. ``sweep_token`` names where the reuses are
    left for the sweep's callback (``take_reuses``)."""

    def __init__(self, *args, repeats: bool = False, sweep_token: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.repeats, self.sweep_token = repeats, sweep_token
        self._proposed: dict[str, str] = {}  # trial id -> config key
        self._outcomes: dict[str, tuple[str, Optional[Any]]] = {}  # config key -> (trial id, value; None: failed)
        self.reused = 0

    def suggest(self, trial_id: str) -> Optional[dict]:
        # Repeats answered on the way to this trial's config: recorded (once per config)
        # when it comes; repeats that end the search (its space used up) are not news.
        answered: dict[str, tuple[dict, str]] = {}
        for config in _ORPHANED.pop(self.sweep_token, []):
            if config_key(config) not in self._outcomes:
                self._ot_study.enqueue_trial(config)
        for _ in range(MAX_REPEATED_PROPOSALS):
            config = super().suggest(trial_id)
            if config is None or config == Searcher.FINISHED or self.repeats:
                return self._publish(answered, config)
            key = config_key(config)
            measured = self._outcomes.get(key)
            running = key in {k for t, k in self._proposed.items() if t not in self._completed_trials}
            if measured is None and not running:
                self._proposed[trial_id] = key
                return self._publish(answered, config)
            # Answer this proposal from what is known, and ask again for the same Tune trial.
            ot_trial = self._ot_trials.pop(trial_id)
            if measured is None:
                # The same config runs now: its result is not known yet. Withdrawn, and Tune
                # asks again later (None: no proposal for now), by then it is measured.
                self._tell(ot_trial, None)
                return self._publish(answered, None)
            original, value = measured
            if not self._tell(ot_trial, value):
                break
            self.reused += 1
            answered[key] = (dict(config), original)
        _SEARCHED_OUT.add(self.sweep_token)
        return Searcher.FINISHED  # searched out: every recent proposal was measured already

    def _publish(self, answered: Mapping[str, tuple[dict, str]], config: Any) -> Any:
        _REUSES.setdefault(self.sweep_token, []).extend(answered.values())
        return config

    def _tell(self, ot_trial, value) -> bool:
        """Tell Optuna a proposal's value (None or not finite: failed). False when the
        sampler is done: a grid used up refuses any more (GridSampler stops the study)."""
        try:
            if _finite(value):
                self._ot_study.tell(ot_trial, value)
            else:
                self._ot_study.tell(ot_trial, state=TrialState.FAIL)
        except RuntimeError:
            return False
        return True

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        # Proposals in flight when the state was saved belonged to a driver that is gone (a
        # resumed sweep): none runs for this one. A re-proposal of such a config must run,
        # not wait for it: that is how a killed driver's lost trial gets its MLflow run back
        # (SweepCallback adopts an orphan run by its config).
        self._proposed = {t: k for t, k in self._proposed.items() if t in self._completed_trials}

    def on_trial_complete(self, trial_id, result=None, error=False):
        if result and result.get("trial_failed"):
            result, error = None, True
        key = self._proposed.get(trial_id)
        if key is not None and trial_id not in self._completed_trials:
            value = None
            if result and not error:
                value = ([result.get(m) for m in self.metric] if isinstance(self.metric, list)
                         else result.get(self.metric))
            self._outcomes.setdefault(key, (trial_id, value))
        super().on_trial_complete(trial_id, result=result, error=error)

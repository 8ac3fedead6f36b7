"""The Optuna searcher a sweep uses (imported when a sweep runs: it imports Ray Tune).

A module of its own, because Tune pickles the searcher with the experiment state: its
class must be importable by name."""

from ray.tune.search.optuna import OptunaSearch

__all__ = ["FailureAwareOptunaSearch"]


class FailureAwareOptunaSearch(OptunaSearch):
    """A trial that reported its own failure (trainables.failures.run_isolated) is a
    failed Optuna trial: not a pruned one, and not a NaN value Optuna refuses. TPE then
    samples away from it."""

    def on_trial_complete(self, trial_id, result=None, error=False):
        if result and result.get("trial_failed"):
            result, error = None, True
        super().on_trial_complete(trial_id, result=result, error=error)

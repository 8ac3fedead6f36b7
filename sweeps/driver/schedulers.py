"""Early stopping for a sweep with several objectives.

ASHA and the median rule rank trials by one metric: with two objectives (maximise
throughput, minimise $ per 1M samples) they would stop a cheap, slow trial for being
slow, though it may be on the Pareto set. ``ParetoStoppingRule`` stops a trial at a rung
only when most of the trials that reached that rung dominate it (are at least as good on
every objective and better on one): no objective alone decides.

A module of its own, because Tune pickles the scheduler with the experiment state: its
class must be importable by name.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from accelsweep.sweeps.driver.report import dominates, objective_vector

__all__ = ["ParetoStoppingRule"]


class ParetoStoppingRule(FIFOScheduler):
    """Stop a trial at a rung (``grace_period`` reports, then twice as many, as ASHA with
    reduction factor 2) when more than half of the other trials recorded at that rung
    dominate it, and at least ``min_samples_required`` were recorded. A trial whose
    objectives are not all finite there is left alone (a failure ends itself)."""

    def __init__(self, objectives: Sequence[tuple[str, str]], time_attr: str = "training_iteration",
                 grace_period: int = 1, max_t: int = 100, min_samples_required: int = 2):
        super().__init__()
        self.objectives = [(metric, mode) for metric, mode in objectives]
        self.time_attr = time_attr
        self.rungs = []
        rung = max(1, grace_period)
        while rung < max_t:
            self.rungs.append(rung)
            rung *= 2
        self.min_samples_required = min_samples_required
        self.recorded: dict[int, dict[str, tuple]] = {rung: {} for rung in self.rungs}  # rung -> trial id -> vector

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self.decide(trial.trial_id, result)

    def decide(self, trial_id: str, result: Mapping[str, float]) -> str:
        """CONTINUE or STOP for one result of one trial (``on_trial_result`` without Tune)."""
        rung = result.get(self.time_attr)
        if rung not in self.recorded:
            return TrialScheduler.CONTINUE
        vector = objective_vector(result, self.objectives)
        if vector is None:
            return TrialScheduler.CONTINUE
        others = [v for other, v in self.recorded[rung].items() if other != trial_id]
        self.recorded[rung][trial_id] = vector
        if len(others) < self.min_samples_required:
            return TrialScheduler.CONTINUE
        better = sum(dominates(other, vector) for other in others)
        return TrialScheduler.STOP if better * 2 > len(others) else TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        objectives = ", ".join(f"{mode} {metric}" for metric, mode in self.objectives)
        return f"Pareto stopping at rungs {self.rungs} on {objectives}"

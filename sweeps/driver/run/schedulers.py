"""Early stopping: on trustworthy windows only, and for a sweep with several objectives.

``TrustedWindowsOnly`` hands a scheduler (ASHA, the median rule, the Pareto rule) only the
results of windows that were not contended (trainables/contention.py), and stops nothing
within the run's own window noise of the best window so far (``NEAR_BEST`` until measured).
``ParetoStoppingRule`` stops a trial at a rung only when most of the trials that reached it
dominate it: ASHA and the median rule rank by one metric, and with two objectives
(throughput, $ per 1M samples) would stop a cheap, slow trial that may be on the Pareto set.

Tune saves no scheduler state with the experiment: on --resume ``TrustedWindowsOnly.replay``
gets each ended trial's windows back (the sweep callback keeps them with Tune's state).

A module of its own, because Tune pickles the scheduler with the tuner: its class must be
importable by name.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from accelsweep.sweeps.driver.record.trial_record import NOISE_METRICS
from accelsweep.sweeps.driver.reporting.noise import PRIOR_MARGIN, window_noise
from accelsweep.sweeps.driver.reporting.summary import dominates, objective_vector

__all__ = ["NEAR_BEST", "ParetoStoppingRule", "TrustedWindowsOnly"]

# Within this fraction of the best window so far, a trial is not stopped early until the
# run has measured its own window noise (``TrustedWindowsOnly.margin``): about how far the
# main job's interleaved confirmation rounds on a quiet 2-core VM moved from round to round
# (benchmarks/data/verdict_under_load_amd_epyc_2cpu.json).
NEAR_BEST = PRIOR_MARGIN


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


class TrustedWindowsOnly(TrialScheduler):
    """``scheduler``, fed only results whose window was not contended (``window_contended``
    0 or absent, also as the trial ends); every other call passes through. Counts what it
    kept from it. A disturbed moment would otherwise stop a good config at its rung; ASHA
    judges a trial at the highest rung its result reaches and it has no record at, so a
    trial whose window at a rung was skipped is judged by its next trustworthy window, at
    the next rung. ``objective`` (metric, mode): a stop of a trial whose window is within
    ``near_best`` of the best trusted window so far is overruled (None: every stop stands):
    a config that close to the leader is a contender the search and the confirmation must
    see measured in full (ASHA at reduction factor 2 can stop one at its first window).
    ``near_best``: that margin fixed; None (default): derived from the windows reported so
    far (``margin``)."""

    def __init__(self, scheduler: TrialScheduler, objective: tuple[str, str] | None = None,
                 near_best: float | None = None):
        self.scheduler = scheduler
        self.skipped = 0
        self.objective = objective
        self.near_best = near_best
        self.best = None  # the best trusted window's figure so far
        self.spared = 0  # stops overruled: the trial was near the best
        self.noise_seen: dict[str, tuple[float, float]] = {}  # trial id -> (window cv, host probe s)
        self._replay: dict[str, list[dict]] = {}  # trial id -> its saved windows, fed as Tune adds it back

    @property
    def margin(self) -> float:
        """How far below the best window a window is near it: two standard deviations of the
        difference of two windows of different trials, each off by its trial's window cv
        and by the host's drift between trials (reporting/noise.py; a loaded host's moment
        left out), from the trials that reported both so far; NEAR_BEST until three did."""
        if self.near_best is not None:
            return self.near_best
        cvs, probes = zip(*self.noise_seen.values()) if self.noise_seen else ((), ())
        noise = window_noise(cvs, [1.0] * len(cvs), probes)
        return NEAR_BEST if noise is None else math.sqrt(2) * noise.margin

    def _note_noise(self, trial, result: dict) -> None:
        cv = next((result[name] for name in NOISE_METRICS if isinstance(result.get(name), (int, float))), None)
        probe = result.get("host_probe_s")
        if isinstance(cv, (int, float)) and isinstance(probe, (int, float)) and cv == cv and probe == probe:
            self.noise_seen[trial.trial_id] = (float(cv), float(probe))

    @property
    def metric(self):
        return self.scheduler.metric

    @property
    def supports_buffered_results(self):
        return self.scheduler.supports_buffered_results

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return self.scheduler.set_search_properties(metric, mode, **spec)

    def replay(self, windows: Mapping[str, Mapping[int, Mapping[str, float]]]) -> None:
        """--resume: each trial's saved results by window (trial id -> window -> result).
        Tune restores this scheduler as it was built, before any trial: without them, the
        rungs (and the best window, the noise seen) start empty, and no trial after the
        resume is stopped until new trials fill them again. A trial that had ended is fed
        its windows as Tune adds it back (on_trial_add); one that runs again reports anew."""
        self._replay = {trial_id: [dict(steps[step]) for step in sorted(steps)]
                        for trial_id, steps in windows.items() if steps}

    def on_trial_add(self, tune_controller, trial) -> None:
        self.scheduler.on_trial_add(tune_controller, trial)
        saved = getattr(self, "_replay", {}).pop(trial.trial_id, None)  # a scheduler pickled before it had one
        if not saved or not trial.is_finished():
            return
        for result in saved:
            self._feed(tune_controller, trial, result)  # its decisions were taken when it ran
        if trial.status == Trial.ERROR:
            self.scheduler.on_trial_error(tune_controller, trial)
        else:
            self.on_trial_complete(tune_controller, trial, saved[-1])

    def on_trial_error(self, tune_controller, trial) -> None:
        self.scheduler.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        decision, near = self._feed(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and near:
            self.spared += 1
            return TrialScheduler.CONTINUE
        return decision

    def _feed(self, tune_controller, trial, result: Mapping) -> tuple[str, bool]:
        """The wrapped scheduler's decision on a trusted window (CONTINUE for a contended
        one, skipped), and whether the window is near the best before it."""
        if result.get("window_contended"):
            self.skipped += 1
            return TrialScheduler.CONTINUE, False
        self._note_noise(trial, result)
        decision = self.scheduler.on_trial_result(tune_controller, trial, result)
        if self.objective is None:
            return decision, False
        metric, mode = self.objective
        value = result.get(metric)
        if not isinstance(value, (int, float)) or value != value:  # absent or NaN: nothing to compare
            return decision, False
        near = self.best is not None and self._near(value)
        if self.best is None or (value > self.best if mode == "max" else value < self.best):
            self.best = value
        return decision, near

    def _near(self, value: float) -> bool:
        metric, mode = self.objective
        if mode == "max":
            return value >= self.best * (1 - self.margin)
        return value <= self.best * (1 + self.margin)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        if result.get("window_contended"):  # not a window to judge by: the trial is only forgotten
            self.scheduler.on_trial_remove(tune_controller, trial)
        else:
            self.scheduler.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self.scheduler.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller):
        return self.scheduler.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return (f"{self.scheduler.debug_string()} (contended windows skipped: {self.skipped}; "
                f"stops spared near the best: {self.spared}, within {self.margin:.1%} of it)")

    def save(self, checkpoint_path: str) -> None:
        self.scheduler.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.scheduler.restore(checkpoint_path)

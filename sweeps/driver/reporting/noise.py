"""How close two configs' search figures can be before one trial each cannot rank them:
the near-best margin, derived from what this run measured, not from the host a constant
was tuned on.

A config's search figure is one trial: the mean of a few windows, taken at one moment of
the host. Its error has two parts the run measures. Its windows disagree (each trial's
window-to-window cv, ``TrialRecord.noise``); the mean of n windows keeps cv / sqrt(n) of
that. And the host's own speed moves between trials (on a shared VM by 20-30% over
minutes): the spread, across the run's trials, of the fixed pure-Python probe each trial
times between its windows (``host_probe_s``). Two standard deviations of their sum is
the margin, as the recorded 10% was defined (a one-trial search figure against its
confirmed median, the main job on a 2-core AMD EPYC: benchmarks/results/vs_plain_tune_2026-11-27.json).
Below MIN_TRIALS measured trials that recorded margin (PRIOR_MARGIN) stands.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from accelsweep.sweeps.driver.record.trial_record import TrialRecord, ranked
from accelsweep.trainables.timing.windows import HOST_LOADED

__all__ = ["MIN_TRIALS", "PRIOR_MARGIN", "FigureNoise", "figure_noise", "near_best_margin", "typical_speed_factors",
           "window_noise"]

PRIOR_MARGIN = 0.10  # the margin recorded on a 2-core AMD EPYC (above), until the run measures its own
MIN_TRIALS = 3  # a spread across trials needs three to mean anything


@dataclass(frozen=True)
class FigureNoise:
    """What one trial's figure is uncertain by, from a run's trials."""
    window_cv: float  # the median trial's window-to-window cv
    windows: float  # the median trial's measured windows
    drift_cv: float  # the host probe's cv across the trials: the host's speed from trial to trial
    trials: int

    @property
    def figure_cv(self) -> float:
        return math.sqrt(self.window_cv ** 2 / max(self.windows, 1.0) + self.drift_cv ** 2)

    @property
    def margin(self) -> float:
        return 2 * self.figure_cv

    def describe(self) -> str:
        return (f"{self.margin:.1%}: twice this run's figure noise (windows' cv {self.window_cv:.1%} over "
                f"{self.windows:g} windows, the host's speed {self.drift_cv:.1%} from trial to trial, "
                f"{self.trials} trials)")


def window_noise(window_cvs: Sequence[float], windows: Sequence[float], probes: Sequence[float],
                 ) -> Optional[FigureNoise]:
    """``FigureNoise`` from each trial's window cv, window count and host probe (seconds),
    the finite ones; None with fewer than MIN_TRIALS of each."""
    window_cvs = [v for v in window_cvs if math.isfinite(v)]
    windows = [v for v in windows if math.isfinite(v) and v >= 1]
    probes = [v for v in probes if math.isfinite(v) and v > 0]
    if probes:
        # A probe HOST_LOADED slower than the median: a loaded host's moment, whose figure is
        # flagged and not trusted, so not the noise of the figures that are (one such probe
        # once made nearly all of a run's drift, and its margin several times too wide:
        # docs/budget.md, the margin).
        steady = statistics.median(probes) * (1 + HOST_LOADED)
        probes = [v for v in probes if v <= steady]
    if min(len(window_cvs), len(windows), len(probes)) < MIN_TRIALS:
        return None
    drift = statistics.pstdev(probes) / statistics.fmean(probes)
    return FigureNoise(statistics.median(window_cvs), statistics.median(windows), drift, len(probes))


def figure_noise(records: Sequence[TrialRecord], metric: str) -> Optional[FigureNoise]:
    """This run's ``FigureNoise`` over its trials measured by ``metric`` but the contended
    ones (a neighbour's CPU is not the host's noise; the confirmation sets their figures
    apart anyway); a loaded host's probe is left out of the drift (``window_noise``)."""
    quiet = [r for r in ranked(records, metric) if not r.contended]
    return window_noise([r.noise for r in quiet], [r.metric("windows_done") for r in quiet],
                        [r.metric("host_probe_s") for r in quiet])


def near_best_margin(records: Sequence[TrialRecord], metric: str) -> tuple[float, Optional[FigureNoise]]:
    """The margin within which a config's figure is near the best's: this run's
    (``FigureNoise.margin``), or PRIOR_MARGIN while it has not measured enough."""
    noise = figure_noise(records, metric)
    return (noise.margin, noise) if noise is not None else (PRIOR_MARGIN, None)


def typical_speed_factors(probes: Mapping[str, tuple[float, Optional[str]]]) -> Optional[dict[str, float]]:
    """Per trial (id -> (its ``speed_probe_gflops``, its ``speed_probe_kind``)): how much
    faster the host typically ran the same kind of math (dtype, threads) than during that
    trial: the median probe of that kind over the trial's own (above 1: the trial ran while
    the host was slow). None where any trial has no probe (a GPU's, a user's trainable, an
    older record): figures are compared on one footing for all or none. The search's
    leader (searchers.py) and the confirmation's candidates (confirm.at_typical_speed) are
    both picked by figure times this factor."""
    if not probes or not all(math.isfinite(gflops) and gflops > 0 and kind for gflops, kind in probes.values()):
        return None
    typical = {kind: statistics.median(g for g, k in probes.values() if k == kind)
               for kind in {k for _, k in probes.values()}}
    return {trial: typical[kind] / gflops for trial, (gflops, kind) in probes.items()}

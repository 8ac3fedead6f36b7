"""Does the best config beat the baseline, beyond the noise of the measurements?

A sweep's best trial is the maximum of many noisy figures: on a shared 2-core VM the
same config measured 31.6 samples/s under load and 758.7 unloaded, and a repeat of the
baseline's own config was once named "best" at +26%. So the summary says whether the
best's lead over the baseline is larger than the noise both were measured with:

- each trial's window-to-window spread (``throughput_cv``; a kernel's ``latency_cv``),
  combined for the two as 2 * sqrt(cv_a^2 + cv_b^2): about two standard deviations of
  the difference of two figures, each with its own spread;
- the machine's own speed while each ran (``host_probe_s``, a fixed pure-Python loop
  timed between windows): a trial whose probe ran more than HOST_LOADED slower than the
  sweep's typical (median) probe was measured on a loaded host, and its figure is not
  trusted for a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from accelsweep.sweeps.driver.callbacks import HOST_LOADED, TrialRecord, host_slowdown

__all__ = ["HOST_LOADED", "Verdict", "host_slowdown", "verdict"]


@dataclass(frozen=True)
class Verdict:
    text: str
    change: float  # the best's lead over the baseline, as a fraction (+0.12: 12% better); NaN if unknown
    noise: float  # the noise bound of that change, as a fraction; NaN if unknown
    beats_baseline: bool  # by more than the noise, measured on an unloaded host

    def figures(self) -> dict[str, float]:
        """For the sweep's parent run."""
        return {"verdict_change_pct": self.change * 100, "verdict_noise_pct": self.noise * 100,
                "beats_baseline": float(self.beats_baseline)}


def verdict(baseline: Optional[TrialRecord], best: Optional[TrialRecord], metric: str, mode: str,
            records: Sequence[TrialRecord]) -> Optional[Verdict]:
    """The verdict on ``best`` against ``baseline`` by ``metric`` (the first objective);
    None when either has no measurement of it."""
    if baseline is None or best is None or not baseline.measured(metric):
        return None
    base_value, best_value = baseline.metric(metric), best.metric(metric)
    if base_value == 0:
        return None
    change = (best_value - base_value) / abs(base_value) * (1 if mode == "max" else -1)
    noise = 2 * math.sqrt(baseline.noise ** 2 + best.noise ** 2)
    pair = [baseline] if best is baseline else [baseline, best]
    loaded = [r for r in pair if host_slowdown(r, records) > HOST_LOADED]
    noise_text = f"+-{noise:.1%}" if math.isfinite(noise) else "unknown (one window per trial: windows >= 2 measure it)"
    if best is baseline:
        text = f"no config beat the baseline: it measured best itself (its noise: {noise_text})"
        return Verdict(text, 0.0, noise, False)
    lead = f"trial {best.number} at {change:+.1%} over the baseline"
    if loaded:
        which = " and ".join("the baseline" if r is baseline else f"trial {r.number}" for r in loaded)
        text = (f"not trusted: {which} ran while the host was loaded (its speed probe "
                f"{max(host_slowdown(r, records) for r in loaded):.0%} slower than the sweep's typical); "
                f"{lead}, noise {noise_text}: measure again on a quiet machine")
        return Verdict(text, change, noise, False)
    if not math.isfinite(noise):
        return Verdict(f"{lead}; noise {noise_text}", change, noise, False)
    if change > noise:
        return Verdict(f"{lead}: beats it beyond the measured noise of {noise_text}", change, noise, True)
    return Verdict(f"no config beat the baseline by more than the measured noise of {noise_text} "
                   f"(the best, {lead})", change, noise, False)

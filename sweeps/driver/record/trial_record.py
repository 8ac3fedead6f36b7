"""A trial as the sweep's driver keeps it (TrialRecord) and the outcomes it can end with.

Apart from the callback that fills them (callbacks.py), so that what reads records (the
resume of a killed driver's runs, reports) need not import the callback."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from accelsweep.trainables.timing.windows import HOST_LOADED

__all__ = ["CUT_BY_BUDGET", "FAILED", "FINISHED", "INTERRUPTED", "NOISE_METRICS", "NOT_RANKED", "REJECTED", "REUSED",
           "STOPPED_EARLY", "TrialRecord", "config_key", "host_loaded", "host_slowdown", "ranked", "trusted"]

FINISHED, STOPPED_EARLY, FAILED, CUT_BY_BUDGET = "finished", "stopped early", "failed", "cut by time budget"
INTERRUPTED = "interrupted"  # the sweep stopped (Ctrl-C) while it ran: --resume runs it again
# Stopped by its own first steps: their projection was hopeless (trainables/loop/rejection.py).
REJECTED = "rejected"
# Proposed again after it was measured: the earlier result stands, nothing ran (searchers.py).
REUSED = "reused"
NOT_RANKED = (FAILED, REJECTED, REUSED)  # a projection or a copy is not a measurement of its own
# A trial's window-to-window spread (cv) of what ranks it, by trainable: training, kernels,
# and for any other trainable the spread of its reports of the first objective, which the
# driver measures (callbacks.py: ``objective_cv``).
NOISE_METRICS = ("throughput_cv", "latency_cv", "objective_cv")


@dataclass
class TrialRecord:
    number: int
    trial_id: str
    searched: dict[str, Any]
    config: dict[str, Any]
    resources: dict[str, float]
    is_baseline: bool
    created_at: float
    run_id: Optional[str] = None
    status: str = "running"
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    error_class: str = ""
    error_cause: str = ""
    wall_s: float = float("nan")
    retries: int = 0  # restarts after its process or node went away
    measured_by: str = ""  # the sweep's first objective (SweepCallback sets it): what ranks the trial
    reused_from: Optional[int] = None  # REUSED: the number of the trial whose result this is
    ordinal: int = 0  # among the trials that ran (not REUSED): how far the sweep's num_samples it is
    curves_logged: bool = False  # its per-window curves are in MLflow
    reported_at: float = 0.0  # time.monotonic() of its last result (0: none yet)
    placed_at: Optional[float] = None  # time.monotonic() its process started (None: waiting for a place)
    # Ended, with its result, by a driver killed before Tune saved that: rebuilt from its
    # MLflow run on --resume (resumed_runs.py), not run again.
    recovered: bool = False

    def metric(self, name: str) -> float:
        value = self.result.get(name, float("nan"))
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")

    def measured(self, metric: str) -> bool:
        """It did not fail, and ``metric`` has a finite value: it can be ranked by it."""
        return self.status not in NOT_RANKED and not self.error and math.isfinite(self.metric(metric))

    @property
    def noise(self) -> float:
        """Its window-to-window spread (cv) of what ranks it: a training trial's throughput,
        a kernel's latency; NaN with one window."""
        for name in NOISE_METRICS:
            value = self.metric(name)
            if math.isfinite(value):
                return value
        return float("nan")

    @property
    def contended_windows(self) -> int:
        value = self.metric("contended_windows")
        return int(value) if math.isfinite(value) else 0

    @property
    def disturbed(self) -> bool:
        """Other processes took its cores during at least one of its windows
        (trainables/contention.py)."""
        return self.contended_windows > 0

    @property
    def contended(self) -> bool:
        """Every window it measured was contended: its figure is its neighbours' as much as
        its own, and decides nothing (with a quiet window among them, the figure comes
        from the quiet ones)."""
        windows = self.metric("windows_done")  # the driver sets it for every trial (callbacks.py)
        return self.disturbed and (not math.isfinite(windows) or self.contended_windows >= windows)

    @property
    def has_measurement(self) -> bool:
        """Measured on the sweep's first objective (``measured_by``)."""
        return bool(self.measured_by) and self.measured(self.measured_by)


def config_key(config: Mapping[str, Any]) -> str:
    """One config's identity: equal for equal knob values, whatever their order."""
    return json.dumps(dict(config), sort_keys=True, default=str)


def ranked(records: Iterable[TrialRecord], metric: str) -> list[TrialRecord]:
    """The trials that take part in ranking by ``metric``: measured (not failed, the value
    finite). Interpreted kernels (Pallas on a CPU) are checked, not ranked: their time is
    the interpreter's."""
    return [r for r in records if r.measured(metric) and not r.result.get("interpreted")]


def host_slowdown(record: TrialRecord, records: Sequence[TrialRecord]) -> float:
    """How much slower the machine ran during ``record`` than it typically did in the sweep
    (0.3: its host probe took 30% longer than the median of the trials' probes; a median,
    so that one fast outlier does not make every other trial look loaded); NaN where
    trials carry no probe."""
    probes = [r.metric("host_probe_s") for r in records if r.metric("host_probe_s") > 0 and r.status != REUSED]
    own = record.metric("host_probe_s")
    if not probes or not own > 0:
        return float("nan")
    return own / statistics.median(probes) - 1


def host_loaded(record: TrialRecord, records: Sequence[TrialRecord]) -> bool:
    """It ran while the host was loaded: its probe more than HOST_LOADED slower than the
    sweep's typical (``host_slowdown``)."""
    return host_slowdown(record, records) > HOST_LOADED


def trusted(record: TrialRecord, records: Sequence[TrialRecord]) -> bool:
    """Its figure can rank it and decide a verdict: not contended in every window, and not
    taken on a loaded host. The one test behind the console's "not trusted", the verdict's
    and the confirmation's choice of candidates."""
    return not record.contended and not host_loaded(record, records)

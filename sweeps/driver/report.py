"""The end-of-sweep summary: the seed posts' results table, written by the sweep.

Baseline config against best config, knob by knob, then the measured figures and the
change; then counts by outcome, the mean per-trial overhead, the price basis, and the
command that opens MLflow on the results.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Optional, Sequence

from accelsweep.sweeps.driver.callbacks import TrialRecord
from accelsweep.trainables.metrics import TRAINING_METRICS, MetricSet
from accelsweep.trainables.microbench import NOISY_CV


def _format(template: str, value: float) -> str:
    return template.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _change(baseline: float, best: float) -> str:
    if not (math.isfinite(baseline) and math.isfinite(best)) or baseline == 0:
        return ""
    return f"{(best - baseline) / baseline * 100:+.1f}%"


def best_record(records: Iterable[TrialRecord], metric: str, mode: str) -> Optional[TrialRecord]:
    # Interpreted kernels (Pallas on a CPU) are checked, not ranked: their time is the interpreter's.
    measured = [r for r in records if math.isfinite(r.metric(metric)) and r.has_measurement
                and not r.result.get("interpreted")]
    if not measured:
        return None
    pick = max if mode == "max" else min
    return pick(measured, key=lambda r: r.metric(metric))


def mean_overhead_s(records: Iterable[TrialRecord]) -> float:
    values = [r.metric("overhead_s") for r in records if math.isfinite(r.metric("overhead_s"))]
    return sum(values) / len(values) if values else float("nan")


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def summary(title: str, records: Sequence[TrialRecord], metric: str, mode: str, knobs: Sequence[str],
            cost_note: str, ui_command: str, elapsed_s: float, metrics: Optional[MetricSet] = None) -> str:
    """``metrics``: the sweep's declaration (Sweep.metrics), a row per summarised metric;
    None: the training loop's rows."""
    baseline = next((r for r in records if r.is_baseline), None)
    best = best_record(records, metric, mode)
    outcomes = Counter(r.status for r in records)
    lines = [f"== {title}: {len(records)} trials in {elapsed_s:.0f} s ("
             + ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items())) + ") =="]
    failures = Counter(r.error_cause or "error" for r in records if r.status == "failed")
    if failures:
        classes: dict[str, set] = {}
        for r in records:
            if r.status == "failed":
                classes.setdefault(r.error_cause or "error", set()).add(r.error_class)
        lines.append("failures by cause: " + ", ".join(
            f"{cause} x{n} ({', '.join(sorted(classes[cause]))})" for cause, n in failures.most_common()))
    noisy = [r for r in records if r.metric("latency_cv") > NOISY_CV]
    if noisy:
        lines.append(f"{len(noisy)} trial(s) noisy (window-to-window latency cv > {NOISY_CV:.0%}): differences of a "
                     "few times their cv are not significant; rerun, or lengthen windows (window_min_s)")
        machine = sum(1 for r in noisy if r.metric("host_cv") > NOISY_CV)
        if machine:
            lines.append(f"{machine} of them while the machine's own speed moved (a fixed CPU loop timed between "
                         "the windows varied too): a shared host, not the kernel")
    if best is None:
        lines.append("No trial produced a measurement.")
    else:
        base = baseline if baseline is not None and baseline.has_measurement else None
        rows = [["", "baseline" + ("" if base else " (no measurement)"), f"best (trial {best.number})", "change"]]
        for knob in knobs:
            base_value = str(base.config.get(knob, "")) if base else ""
            best_value = str(best.config.get(knob, ""))
            rows.append([knob, base_value, best_value, "" if base_value == best_value else "changed"])
        for row in (metrics or TRAINING_METRICS).summarised:
            base_value = base.metric(row.name) if base else float("nan")
            best_value = best.metric(row.name)
            rows.append([row.label, _format(row.fmt, base_value), _format(row.fmt, best_value),
                         _change(base_value, best_value)])
        lines += ["", table(rows), ""]
        timing = f"; step times from {best.result['step_time_source']}" if "step_time_source" in best.result else ""
        lines.append(f"best device: {best.result.get('device', 'n/a')}{timing}")
    compile_total = sum(r.metric("compile_s") for r in records if math.isfinite(r.metric("compile_s")))
    lines.append(f"compile time, all trials: {compile_total:.1f} s")
    lines.append(f"mean overhead per trial (wall time outside the measured loop: start-up, imports, compile, checks): "
                 f"{_format('{:.2f}', mean_overhead_s(records))} s")
    lines.append(cost_note)
    lines.append(f"results: {ui_command}")
    return "\n".join(lines)

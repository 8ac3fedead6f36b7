"""The kernel sweep's roofline figure: per shape, each implementation's point (arithmetic
intensity, TFLOP/s) under the roofs of what it ran on (trainables/roofline.py).

    from accelsweep.sweeps.driver.reporting.roofline_plot import roofline_plot
    roofline_plot(history.records, "report/plots/roofline.png", stamp)

Log-log, one panel per shape: the compute roof (peak TFLOP/s) and the bandwidth slope
(intensity x peak GB/s), each labelled with its figure and whether it was measured here
or is the datasheet's; a point per implementation, labelled with its name and its
fraction of the roofline bound at its intensity. The roofs are what each trial reported
(a grid over threads holds each thread count against its own), and their bases are
written out under the panels. Conventions (PlotFile, PlotStamp, a figure saying why when
there is nothing to draw) are plots.py's.
"""

from __future__ import annotations

import math
import textwrap
from typing import Sequence

from accelsweep.sweeps.driver.record.trial_record import FAILED, TrialRecord
from accelsweep.sweeps.driver.reporting.plots import (NOT_A_SPEED_FIGURE, PlotFile, PlotStamp, _figure, _finite,
                                                      _kernel_points, _nothing, _save)
from accelsweep.trainables.roofline import IN_WORDS, Roofline, basis_kind

__all__ = ["roofline_plot"]

PANELS_PER_ROW = 3
ROOF_STYLES = ("-", "--", ":", "-.")  # one per distinct roof in a panel (threads that vary)


def roofline_plot(records: Sequence[TrialRecord], path: str, stamp: PlotStamp) -> PlotFile:
    """One panel per shape; marks ``points`` (trials drawn), ``compute_bound`` and
    ``memory_bound`` (which roof bounds each), ``interpreted`` and ``not_placed``
    (measured, but with no FLOP count or bytes moved)."""
    points = _kernel_points(records)
    op = next((str(r.config["op"]) for r in records if "op" in r.config), "kernel")
    title = f"{op}: each implementation against its roofline, per shape"
    if not points:
        return _nothing(path, stamp, title, "no kernel trial measured latency_p50_s")
    placed = [p for p in points if _finite(p.record.metric("tflops")) and
              _finite(p.record.metric("arithmetic_intensity"))]
    if not placed:
        return _nothing(path, stamp, title, _why_no_point(op, [p.record for p in points]))
    shapes = sorted({p.shape for p in placed}, key=lambda shape: [(isinstance(v, str), v) for _, v in shape])
    series = list(dict.fromkeys(p.series for p in sorted(placed, key=lambda p: p.record.number)))
    colours = {name: f"C{index % 10}" for index, name in enumerate(series)}
    columns = min(len(shapes), PANELS_PER_ROW)
    rows = math.ceil(len(shapes) / columns)
    fig = _figure((5.4 * columns + 1.5, 4.4 * rows + 1.0))
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    bases: dict[str, None] = {}
    bound_of: dict[int, str] = {}
    for ax, shape in zip(axes, shapes):
        here = [p for p in placed if p.shape == shape]
        roofs = _distinct_roofs(here)
        xs = [p.record.metric("arithmetic_intensity") for p in here]
        ys = [p.record.metric("tflops") for p in here]
        ridges = [roof.ridge_intensity for roof in roofs if _finite(roof.ridge_intensity)]
        peaks = [roof.peak_tflops for roof in roofs if _finite(roof.peak_tflops)]
        # Two decades around what is drawn, so that the slope and the roof both show, and
        # a point's distance below its roof reads as a ratio.
        low, high = min(xs + ridges) / 30, max(xs + ridges) * 10
        ax.set_ylim(min(ys + [peak / 100 for peak in peaks]) / 3, max(ys + peaks) * 3)
        for style, (roof, threads) in zip(ROOF_STYLES * len(roofs), roofs.items()):
            _draw_roof(ax, roof, threads if len(roofs) > 1 else "", low, high, style)
            bases.update({roof.peak_basis: None, roof.bandwidth_basis: None})
        for point in here:
            record, roof = point.record, Roofline.of_result(point.record.result)
            x, y = record.metric("arithmetic_intensity"), record.metric("tflops")
            interpreted = bool(record.result.get("interpreted"))
            ax.scatter([x], [y], s=46, zorder=4, color=colours[point.series],
                       facecolors="none" if interpreted else colours[point.series])
            fraction = record.metric("roofline_fraction")
            said = f"{point.series} ({fraction:.0%})" if _finite(fraction) else point.series
            # Below and right of the point: above it run the roofs.
            ax.annotate(said + (f", {NOT_A_SPEED_FIGURE}" if interpreted else ""), (x, y), xytext=(6, -11),
                        textcoords="offset points", fontsize=7, color=colours[point.series])
            bound_of[record.number] = roof.bound(x)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("TFLOP/s at p50")
        ax.set_title(" ".join(f"{name}={value}" for name, value in shape) or "one shape", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        if roofs:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no roofs: no peak known for what it ran on", transform=ax.transAxes, ha="center",
                    fontsize=8, color="0.4")
    for ax in axes[len(shapes):]:
        ax.set_visible(False)
    fig.suptitle(title + "\n(label: implementation and its fraction of the roofline bound at its intensity)",
                 fontsize=11)
    fig.supxlabel("\n".join(textwrap.fill(basis, 150) for basis in bases if basis), fontsize=7, color="0.3",
                  ha="left", x=0.01)
    unplaced = [p.record.number for p in points if p not in placed]
    failed = [r.number for r in records if r.status == FAILED or r.error]
    marked = {"points": tuple(p.record.number for p in placed),
              "compute_bound": tuple(n for n, bound in bound_of.items() if bound == "compute"),
              "memory_bound": tuple(n for n, bound in bound_of.items() if bound == "memory"),
              "interpreted": tuple(p.record.number for p in placed if p.record.result.get("interpreted")),
              "not_placed": tuple(unplaced), "failed": tuple(failed)}
    return _save(fig, path, stamp, marked)


def _why_no_point(op: str, measured: Sequence[TrialRecord]) -> str:
    if not any(_finite(r.metric("tflops")) for r in measured):
        return (f"no FLOP count: op {op} declares none, so no arithmetic intensity "
                "(its GB/s is in the results where it declares bytes moved)")
    return f"no bytes moved: op {op} declares none (OpSpec.bytes_moved), so no arithmetic intensity"


def _distinct_roofs(points) -> dict[Roofline, str]:
    """The roofs the points were held against (one per distinct pair of peaks), each with
    the threads its trials ran on ("" where not reported)."""
    roofs: dict[tuple, tuple[Roofline, str]] = {}
    for point in points:
        roof = Roofline.of_result(point.record.result)
        key = tuple(value if _finite(value) else None for value in (roof.peak_tflops, roof.bandwidth_gb_s))
        if key == (None, None):
            continue
        threads = point.record.metric("threads")
        roofs.setdefault(key, (roof, f"{threads:.0f} threads" if _finite(threads) else ""))
    return dict(roofs.values())


def _draw_roof(ax, roof: Roofline, threads: str, low: float, high: float, style: str) -> None:
    """The bandwidth slope up to the ridge and the compute roof from it (either alone where
    the other is unknown), each labelled with its figure and basis."""
    ridge = roof.ridge_intensity
    suffix = f" [{threads}]" if threads else ""
    if _finite(roof.bandwidth_gb_s):
        end = ridge if _finite(ridge) else high
        ax.plot([low, end], [low * roof.bandwidth_gb_s / 1e3, end * roof.bandwidth_gb_s / 1e3], color="0.25",
                ls=style, lw=1.4, label=f"bandwidth slope: {roof.bandwidth_gb_s:.3g} GB/s "
                                        f"({_said(roof.bandwidth_basis)}){suffix}")
    if _finite(roof.peak_tflops):
        start = ridge if _finite(ridge) else low
        ax.plot([start, high], [roof.peak_tflops] * 2, color="tab:red", ls=style, lw=1.4,
                label=f"compute roof: {roof.peak_tflops:.3g} TFLOP/s ({_said(roof.peak_basis)}){suffix}")
    if _finite(ridge):
        ax.axvline(ridge, color="0.6", lw=0.6, ls=":")
        ax.annotate(f"ridge {ridge:.3g} FLOP/byte", (ridge, roof.peak_tflops), xytext=(4, -12),
                    textcoords="offset points", fontsize=7, color="0.4")


def _said(basis: str) -> str:
    return IN_WORDS.get(basis_kind(basis), "unknown basis")

"""The sweep report's plots: PNG files a person can look at, drawn with matplotlib.

    from accelsweep.sweeps.driver.reporting.plots import PlotStamp, progress_plot
    stamp = PlotStamp("neuron_vit on cpu", "AMD EPYC 9R14, 2 CPUs (x86_64)", "cpu", date.today().isoformat())
    progress_plot(records, "throughput_samples_per_s", "max", "report/progress.png", stamp)

Every function writes one PNG at ``path`` and returns it as a ``PlotFile`` (the path, a
str, carrying the figure's texts and the trials it marked, so a caller or a test can read
what was drawn without parsing pixels). Every function always writes a file: with
nothing to draw, a small figure that says why. Every figure ends with its ``PlotStamp``:
which sweep ran on which machine and device, and when.

Figures are ``matplotlib.figure.Figure`` objects, never pyplot's: no global backend to
set, no window, nothing left open once the function returns (PNG goes through Agg).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.record.trial_record import (CUT_BY_BUDGET, FAILED, FINISHED, INTERRUPTED, REJECTED,
                                                          REUSED, STOPPED_EARLY, TrialRecord)
from accelsweep.sweeps.driver.reporting.summary import best_record, op_keys, pareto_set, ranked
from accelsweep.trainables.cost import price_advice
from accelsweep.trainables.errors import one_of, positive_int

__all__ = ["PlotFile", "PlotStamp", "curves_plot", "importance_plot", "kernel_latency_plot", "kernel_tflops_plot",
           "parallel_plot", "progress_plot", "tradeoff_plot"]

MODES = ("max", "min")
DPI = 110
NOT_A_SPEED_FIGURE = "interpreted, not a speed figure"
# How each outcome is drawn in the progress plot: marker, filled, legend label.
STATUS_STYLE = {
    FINISHED: ("o", True, "finished"),
    STOPPED_EARLY: ("v", True, "stopped early"),
    CUT_BY_BUDGET: ("s", True, "cut by time budget (partial)"),
    INTERRUPTED: ("s", False, "interrupted (partial)"),
    REJECTED: ("o", False, "rejected (a projection, not ranked)"),
    REUSED: ("D", False, "reused (an earlier trial's result)"),
}


@dataclass(frozen=True)
class PlotStamp:
    """What every plot says in its footer: what ran where, when."""

    sweep: str  # "neuron_vit on cpu"
    machine: str  # "AMD EPYC 9R14, 2 CPUs (x86_64)"
    device: str  # the best trial's result["device"]
    date: str  # ISO, "YYYY-MM-DD"

    @property
    def footer(self) -> str:
        return f"{self.sweep} | machine: {self.machine} | device: {self.device} | {self.date}"


class PlotFile(str):
    """A written plot: its path, plus ``texts`` (every text on the figure: title, labels,
    annotations, the reason when there was nothing to draw) and ``marked`` (role ->
    trial numbers: "pareto", "best", "baseline", ...)."""

    texts: tuple[str, ...]
    marked: dict[str, tuple]

    def __new__(cls, path: str, texts: Sequence[str] = (), marked: Optional[Mapping[str, tuple]] = None):
        written = super().__new__(cls, path)
        written.texts, written.marked = tuple(texts), dict(marked or {})
        return written


def _figure(size: tuple[float, float] = (8.0, 5.0)):
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained")


def _save(fig, path: str, stamp: PlotStamp, marked: Optional[Mapping[str, tuple]] = None) -> PlotFile:
    from matplotlib.text import Text

    # Below the axes; bbox_inches="tight" grows the image to take it in.
    fig.text(0.0, -0.01, stamp.footer, fontsize=7, color="0.35", ha="left", va="top")
    for text in fig.findobj(Text):
        # Ours are plain text: "$ per 1M samples" is no formula. (Tick labels a formatter
        # writes, such as a log axis's, come at drawing time and keep their maths.)
        if "$" in text.get_text():
            text.set_parse_math(False)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, bbox_inches="tight")
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_text()]  # tick labels exist once drawn
    return PlotFile(path, texts, marked or {})


def _nothing(path: str, stamp: PlotStamp, title: str, why: str) -> PlotFile:
    """The file a plot writes when it has nothing to draw: its title and the reason."""
    fig = _figure((7.0, 2.0))
    fig.text(0.5, 0.7, title, ha="center", va="center", fontsize=12, weight="bold")
    fig.text(0.5, 0.35, why, ha="center", va="center", fontsize=10, wrap=True)
    return _save(fig, path, stamp, {"nothing": (why,)})


def _better(mode: str) -> str:
    return "higher is better" if mode == "max" else "lower is better"


def _named_best(records: Sequence[TrialRecord], metric: str, mode: str,
                answer: Optional[TrialRecord]) -> list[tuple[TrialRecord, str]]:
    """The trials a plot names: the search's leader as "best", or, when the sweep's answer
    (a confirmation's config, verdict.sweep_answer) is another, that one as "confirmed best"
    and the leader as "search's leader", as the summary names them."""
    leader = best_record(records, metric, mode)
    if answer is None or answer is leader:
        return [(leader, "best")] if leader is not None else []
    return [(answer, "confirmed best"), *([(leader, "search's leader")] if leader is not None else [])]


def _marks(named: Sequence[tuple[TrialRecord, str]]) -> dict[str, tuple[int, ...]]:
    """What a plot file records it named: "best" (the answer), and "leader" when that is another."""
    marks = {"best": (named[0][0].number,) if named else ()}
    if len(named) > 1:
        marks["leader"] = (named[1][0].number,)
    return marks


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def tradeoff_plot(records: Sequence[TrialRecord], y_metric: str, y_mode: str, x_metric: str, x_mode: str,
                  path: str, stamp: PlotStamp, labels: Optional[Mapping[str, str]] = None,
                  cost_note: str = "", answer: Optional[TrialRecord] = None) -> PlotFile:
    """The ranked trials as points of (x, y), the Pareto front over both objectives
    (summary.pareto_set) marked and joined by its staircase, baseline and best annotated.
    ``cost_note``: the sweep's price basis note, whose advice an unpriced plot repeats.
    ``answer``: the sweep's answer where a confirmation named one (``_named_best``)."""
    one_of("y_mode", y_mode, MODES)
    one_of("x_mode", x_mode, MODES)
    labels = dict(labels or {})
    y_label, x_label = labels.get(y_metric, y_metric), labels.get(x_metric, x_metric)
    title = f"{y_label} vs {x_label}"
    measured = ranked(records, y_metric)
    if not measured:
        return _nothing(path, stamp, title, f"no trial measured {y_metric}")
    points = [r for r in measured if _finite(r.metric(x_metric))]
    if not points:
        why = (f"no price basis: {x_label} unknown. {price_advice(cost_note)}"
               if x_metric.startswith("usd_") else f"no trial measured {x_metric}")
        return _nothing(path, stamp, title, why)
    front = sorted(pareto_set(records, [(y_metric, y_mode), (x_metric, x_mode)]), key=lambda r: r.metric(x_metric))
    fig = _figure()
    ax = fig.add_subplot()
    ax.scatter([r.metric(x_metric) for r in points], [r.metric(y_metric) for r in points], s=28, color="tab:blue",
               alpha=0.6, label=f"trials ({len(points)})")
    ax.plot(*_staircase(front, x_metric, x_mode, y_metric, y_mode), color="tab:red", lw=1.2, zorder=2)
    ax.scatter([r.metric(x_metric) for r in front], [r.metric(y_metric) for r in front], s=60, color="tab:red",
               zorder=3, label=f"Pareto front ({len(front)})")
    named = _named_best(records, y_metric, y_mode, answer)
    baseline = next((r for r in points if r.is_baseline), None)
    offsets = ((8, 8), (8, 20))
    for record, name, offset in ((baseline, "baseline", (8, -14)),
                                 *((r, n, o) for (r, n), o in zip(named, offsets))):
        if record is not None and record in points:
            ax.annotate(f"{name} (trial {record.number})", (record.metric(x_metric), record.metric(y_metric)),
                        xytext=offset, textcoords="offset points", fontsize=8,
                        arrowprops={"arrowstyle": "-", "color": "0.4"})
    ax.set_xlabel(f"{x_label} ({_better(x_mode)})")
    ax.set_ylabel(f"{y_label} ({_better(y_mode)})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    marked = {"pareto": tuple(r.number for r in front), "points": tuple(r.number for r in points),
              "baseline": (baseline.number,) if baseline else (), **_marks(named)}
    return _save(fig, path, stamp, marked)


def _staircase(front: Sequence[TrialRecord], x_metric: str, x_mode: str, y_metric: str, y_mode: str):
    """The front's boundary: between neighbours (by x), a corner at the worse x and the
    worse y of the two, so the line never passes through a point the front does not reach."""
    def worse(a: float, b: float, mode: str) -> float:
        return min(a, b) if mode == "max" else max(a, b)

    xs, ys = [], []
    for index, record in enumerate(front):
        x, y = record.metric(x_metric), record.metric(y_metric)
        if index:
            xs.append(worse(xs[-1], x, x_mode))
            ys.append(worse(ys[-1], y, y_mode))
        xs.append(x)
        ys.append(y)
    return xs, ys


def progress_plot(records: Sequence[TrialRecord], metric: str, mode: str, path: str, stamp: PlotStamp,
                  label: Optional[str] = None, answer: Optional[TrialRecord] = None) -> PlotFile:
    """``metric`` per trial in proposal order (x: the trial's number), a marker per
    outcome, failed trials as marks along the bottom, and the best so far (ranked trials
    only: no failure, projection, copy or interpreted time moves it) as a step line.
    ``answer``: the sweep's answer where a confirmation named one (``_named_best``)."""
    one_of("mode", mode, MODES)
    label = label or metric
    title = f"{label} per trial, in proposal order"
    ordered = sorted(records, key=lambda r: r.number)
    if not any(r.measured(metric) for r in ordered):
        return _nothing(path, stamp, title, f"no trial measured {metric}")
    fig = _figure()
    ax = fig.add_subplot()
    groups: dict[tuple, list[TrialRecord]] = {}
    for record in ordered:
        if record.status == FAILED or record.error:
            key = ("failed",)
        elif not _finite(record.metric(metric)):
            key = ("no value",)
        elif record.result.get("interpreted"):
            key = ("o", False, NOT_A_SPEED_FIGURE)
        else:
            key = STATUS_STYLE.get(record.status, ("o", True, record.status))
        groups.setdefault(key, []).append(record)
    for key, members in groups.items():
        numbers = [r.number for r in members]
        if len(key) == 1:  # nothing measured: a mark along the bottom, at its place in the order
            ax.scatter(numbers, [0.02] * len(numbers), transform=ax.get_xaxis_transform(), marker="x",
                       color="tab:red" if key[0] == "failed" else "0.5", label=f"{key[0]} ({len(members)})")
            continue
        marker, filled, name = key
        ax.scatter(numbers, [r.metric(metric) for r in members], marker=marker, s=36,
                   facecolors="tab:blue" if filled else "none", edgecolors="tab:blue", label=f"{name} ({len(members)})")
    steps = _best_so_far(ordered, metric, mode)
    if steps:
        xs = [n for n, _ in steps] + [ordered[-1].number]
        ax.step(xs, [v for _, v in steps] + [steps[-1][1]], where="post", color="tab:orange", lw=1.5,
                label="best so far")
    named = _named_best(ordered, metric, mode, answer)
    for (record, name), height in zip(named, (8, 20)):
        ax.annotate(f"{name} (trial {record.number})", (record.number, record.metric(metric)), xytext=(6, height),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel("trial (proposal order)")
    ax.set_ylabel(f"{label} ({_better(mode)})")
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    marked = {"best_so_far": tuple(steps), **_marks(named),
              "failed": tuple(r.number for r in groups.get(("failed",), []))}
    return _save(fig, path, stamp, marked)


def utilisation_plot(records: Sequence[TrialRecord], best: Optional[TrialRecord], path: str,
                     stamp: PlotStamp) -> PlotFile:
    """Each measured trial's utilisation (trainables/utilisation.py) in proposal order: of
    the peak it was held to (filled; on a CPU the attainable one measured here) and, where
    there is one apart from it, of the theoretical peak (hollow). The 100% line is the roof."""
    title = "utilisation per trial: model TFLOP/s as a share of the hardware's peak"
    shown = [r for r in sorted(records, key=lambda r: r.number) if r.measured("mfu")]  # no failure, copy, projection
    if not shown:
        return _nothing(path, stamp, title, "no trial reported its utilisation (model FLOPs and a peak)")
    fig = _figure()
    ax = fig.add_subplot()
    measured = bool(shown[0].result.get("peak_measured"))
    ax.scatter([r.number for r in shown], [100 * r.metric("mfu") for r in shown], s=36, color="tab:blue",
               label="of the attainable peak, measured here" if measured else "of the datasheet peak")
    theoretical = [r for r in shown if r.result.get("peak_measured") and _finite(r.metric("mfu_theoretical"))]
    if theoretical:
        ax.scatter([r.number for r in theoretical], [100 * r.metric("mfu_theoretical") for r in theoretical], s=36,
                   facecolors="none", edgecolors="tab:blue", label="of the theoretical peak (ISA x clock)")
    ax.axhline(100, color="0.4", lw=1, ls="--")
    if best is not None and best in shown:
        ax.annotate(f"best (trial {best.number}): {best.metric('mfu'):.1%}", (best.number, 100 * best.metric("mfu")),
                    xytext=(6, 8), textcoords="offset points", fontsize=8)
    ax.set_xlabel("trial (proposal order)")
    ax.set_ylabel(f"% of {shown[0].result.get('peak_dtype', '')} peak (higher is better)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, stamp, {"trials": tuple(r.number for r in shown),
                                    "best": (best.number,) if best is not None and best in shown else ()})


def _best_so_far(ordered: Sequence[TrialRecord], metric: str, mode: str) -> list[tuple[int, float]]:
    """(trial number, best value up to it) at each ranked trial."""
    counted = {r.number for r in ranked(ordered, metric)}
    steps: list[tuple[int, float]] = []
    for record in ordered:
        if record.number in counted:
            value = record.metric(metric)
            if steps:
                value = max(value, steps[-1][1]) if mode == "max" else min(value, steps[-1][1])
            steps.append((record.number, value))
    return steps


def importance_plot(importances: Mapping[str, float], path: str, stamp: PlotStamp, evaluator: str = "",
                    note: str = "") -> PlotFile:
    """Knob importances (e.g. optuna.importance.get_param_importances) as horizontal bars,
    the largest on top. ``evaluator``: which one computed them; ``note``: a line under the
    title, and the reason shown when ``importances`` is empty."""
    title = "knob importance" + (f" ({evaluator})" if evaluator else "")
    if not importances:
        return _nothing(path, stamp, title, note or "no importances were computed")
    ordered = sorted(importances.items(), key=lambda item: item[1])  # barh draws the first at the bottom
    fig = _figure((7.0, 1.2 + 0.45 * len(ordered)))
    ax = fig.add_subplot()
    bars = ax.barh([name for name, _ in ordered], [value for _, value in ordered], color="tab:blue")
    ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=3)
    ax.set_xlabel("importance")
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=11)
    ax.margins(x=0.15)
    return _save(fig, path, stamp, {"order": tuple(name for name, _ in reversed(ordered))})


def parallel_plot(records: Sequence[TrialRecord], knobs: Sequence[str], metric: str, mode: str, path: str,
                  stamp: PlotStamp, answer: Optional[TrialRecord] = None) -> PlotFile:
    """One vertical axis per knob and a last one for ``metric``; one line per ranked
    trial, coloured by ``metric`` (the better end of the colour map is the better end of
    the metric either way), the best trial drawn thicker: the sweep's ``answer`` where a
    confirmation named one (``_named_best``)."""
    one_of("mode", mode, MODES)
    title = f"knobs and {metric}, one line per trial"
    measured = sorted(ranked(records, metric), key=lambda r: r.number)
    if not knobs:
        return _nothing(path, stamp, title, "no knobs were searched")
    if not measured:
        return _nothing(path, stamp, title, f"no trial measured {metric}")
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    columns = [_axis([r.config.get(knob, r.searched.get(knob)) for r in measured]) for knob in knobs]
    columns.append(_axis([r.metric(metric) for r in measured]))
    values = [r.metric(metric) for r in measured]
    cmap = colormaps["viridis" if mode == "max" else "viridis_r"]
    norm = Normalize(min(values), max(values) if max(values) > min(values) else min(values) + 1)
    best, name = _named_best(measured, metric, mode, answer if answer in measured else None)[0]
    fig = _figure((max(6.0, 1.6 * len(columns) + 2), 5.0))
    ax = fig.add_subplot()
    for index, record in enumerate(measured):
        thick = record is best
        ax.plot(range(len(columns)), [column[0][index] for column in columns], color=cmap(norm(values[index])),
                lw=3.5 if thick else 1.2, alpha=1.0 if thick else 0.7, zorder=3 if thick else 2)
    for position, (_, ticks) in enumerate(columns):
        ax.axvline(position, color="0.3", lw=0.8, zorder=1)
        for height, text in ticks:
            ax.text(position + 0.03, height, text, fontsize=7, va="center", ha="left", zorder=4,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.5})
    ax.set_xticks(range(len(columns)), [*knobs, metric], rotation=20, ha="right")
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(columns) - 0.6)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{title}\nthick line: the {name}, trial {best.number}", fontsize=11)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=f"{metric} ({_better(mode)})")
    return _save(fig, path, stamp, {"lines": tuple(r.number for r in measured), "best": (best.number,)})


def _axis(values: Sequence[Any]) -> tuple[list[float], list[tuple[float, str]]]:
    """Values placed on a 0..1 axis, and the (height, label) ticks to write beside it.
    Numbers are scaled (log when positive and spanning 16x or more: batch sizes, block
    sizes); anything else is a category, the categories spaced evenly."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    if not numeric:
        categories = sorted({str(v) for v in values})
        step = 1 / (len(categories) - 1) if len(categories) > 1 else 0
        height = {c: (i * step if step else 0.5) for i, c in enumerate(categories)}
        return [height[str(v)] for v in values], [(height[c], c) for c in categories]
    low, high = min(values), max(values)
    logarithmic = low > 0 and high / low >= 16
    scale: Callable[[float], float] = math.log if logarithmic else float
    span = scale(high) - scale(low)

    def place(v: float) -> float:
        return (scale(v) - scale(low)) / span if span else 0.5

    distinct = sorted(set(values))
    shown = distinct if len(distinct) <= 8 else [low, high]
    return [place(v) for v in values], [(place(v), f"{v:.4g}") for v in shown]


def curves_plot(curves: Mapping[int, Sequence[tuple[int, float]]], path: str, stamp: PlotStamp, label: str,
                top: Optional[int] = None) -> PlotFile:
    """Per-window curves: trial number -> [(window index, value)], a line each, in the
    mapping's order (the caller's: best first); ``top``: draw only the first ``top``."""
    if top is not None:
        positive_int("top", top)
    chosen = list(curves.items())[:top]
    title = f"{label} per window" + (f", top {len(chosen)} trials" if top is not None else "")
    drawn = {number: [(w, v) for w, v in points if _finite(v)] for number, points in chosen}
    drawn = {number: points for number, points in drawn.items() if points}
    if not drawn:
        return _nothing(path, stamp, title, f"no per-window values of {label} were recorded")
    fig = _figure()
    ax = fig.add_subplot()
    for number, points in drawn.items():
        ax.plot([w for w, _ in points], [v for _, v in points], marker="o", ms=3, label=f"trial {number}")
    ax.set_xlabel("window")
    ax.set_ylabel(label)
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, stamp, {"trials": tuple(drawn)})


# Kernel sweeps: one point per (implementation, shape), the baseline implementation's
# series (the sweep's first trial, what the others are set against) marked.

@dataclass(frozen=True)
class _KernelPoint:
    record: TrialRecord
    shape: tuple  # ((name, value), ...)
    series: str  # the implementation, with its tuning knobs where they vary


def _kernel_points(records: Sequence[TrialRecord]) -> list[_KernelPoint]:
    """Measured kernel trials (a copy of an earlier trial left out), each with its shape
    and its series. The op's spec says which config keys are shape parameters and which
    are an implementation's tuning knobs."""
    measured = [r for r in records if r.measured("latency_p50_s") and r.status != REUSED]
    shape_of, tuning_of = {}, {}
    for record in measured:
        shape_params, tuning = op_keys(record)
        shape_of[record.number] = tuple((k, record.config[k]) for k in shape_params if k in record.config)
        tuning_of[record.number] = {k: record.config[k] for k in tuning if k in record.config}
    values_of: dict[tuple[str, str], set] = {}  # (impl, tuning knob) -> the values its trials ran
    for record in measured:
        for knob, value in tuning_of[record.number].items():
            values_of.setdefault((str(record.config.get("impl")), knob), set()).add(value)
    points = []
    for record in measured:
        impl = str(record.config.get("impl"))
        knobs = [f"{k}={v}" for k, v in tuning_of[record.number].items() if len(values_of[(impl, k)]) > 1]
        points.append(_KernelPoint(record, shape_of[record.number], " ".join([impl, *knobs])))
    return points


def kernel_latency_plot(records: Sequence[TrialRecord], path: str, stamp: PlotStamp) -> PlotFile:
    """Latency per call (p50, bars from p10 to p90, log scale) per shape, a series per
    implementation, the baseline's drawn in black with its p50 as a dashed line across
    its shape."""
    def latency(r: TrialRecord) -> tuple[float, float, float]:
        return tuple(r.metric(f"latency_{p}_s") * 1e3 for p in ("p50", "p10", "p90"))

    return _kernel_plot(records, path, stamp, "latency", latency, "latency per call (ms): p50, bars p10 to p90",
                        logarithmic=True)


def kernel_tflops_plot(records: Sequence[TrialRecord], path: str, stamp: PlotStamp) -> PlotFile:
    """TFLOP/s at the p50 latency (bars: at p90 and p10) per shape, a series per
    implementation; an op without a FLOP count gets a figure saying so."""
    def rate(r: TrialRecord) -> tuple[float, float, float]:
        tflops, p50 = r.metric("tflops"), r.metric("latency_p50_s")
        return tflops, tflops * p50 / r.metric("latency_p90_s"), tflops * p50 / r.metric("latency_p10_s")

    return _kernel_plot(records, path, stamp, "TFLOP/s", rate, "TFLOP/s at p50 (bars: at p90 and p10)",
                        logarithmic=False)


def _kernel_plot(records: Sequence[TrialRecord], path: str, stamp: PlotStamp, quantity: str,
                 values: Callable[[TrialRecord], tuple[float, float, float]], y_label: str,
                 logarithmic: bool) -> PlotFile:
    points = _kernel_points(records)
    op = next((str(r.config["op"]) for r in records if "op" in r.config), "kernel")
    title = f"{op}: {quantity} per implementation and shape"
    if not points:
        return _nothing(path, stamp, title, "no kernel trial measured latency_p50_s")
    points = [p for p in points if _finite(values(p.record)[0])]
    if not points:
        return _nothing(path, stamp, title, f"no FLOP count: op {op} declares none, so no {quantity} "
                                            "(its latency plot has the timings)")
    shapes = sorted({p.shape for p in points}, key=lambda shape: [(isinstance(v, str), v) for _, v in shape])
    baseline = next((r for r in records if r.is_baseline), None)
    reference = next((p.series for p in points if p.record is baseline), None)
    series = sorted({p.series for p in points}, key=lambda s: (s != reference, min(
        p.record.number for p in points if p.series == s)))
    width = 0.8 / len(series)
    fig = _figure((max(7.0, 1.4 * len(shapes) + 4), 5.0))
    ax = fig.add_subplot()
    colours = (f"C{i}" for i in itertools.count())  # matplotlib's cycle; black is the baseline's
    for index, name in enumerate(series):
        colour = "black" if name == reference else next(colours)
        offset = (index - (len(series) - 1) / 2) * width
        members = [p for p in points if p.series == name]
        interpreted = any(p.record.result.get("interpreted") for p in members)
        label = name + (" (baseline)" if name == reference else "") + (f" ({NOT_A_SPEED_FIGURE})" if interpreted
                                                                         else "")
        for number, point in enumerate(members):
            middle, low, high = values(point.record)
            x = shapes.index(point.shape) + offset
            hollow = point.record.result.get("interpreted")
            ax.errorbar(x, middle, yerr=_spread(middle, low, high),
                        fmt="s" if name == reference else "o", color=colour, mfc="none" if hollow else colour,
                        ms=6, capsize=3, label=label if number == 0 else None)
            if name == reference:
                position = shapes.index(point.shape)
                ax.hlines(middle, position - 0.45, position + 0.45, colors="black", linestyles="dashed", lw=0.8)
    # Tick labels name only the shape parameters that vary; the fixed ones go under the axis.
    fixed = [item for item in shapes[0] if all(item in shape for shape in shapes)]
    ax.set_xticks(range(len(shapes)), ["\n".join(f"{k}={v}" for k, v in shape if (k, v) not in fixed) or "one shape"
                                       for shape in shapes])
    ax.set_xlim(-0.6, len(shapes) - 0.4)
    if logarithmic:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    failed = [r.number for r in records if r.status == FAILED or r.error]
    x_label = "shape" + (f" ({', '.join(f'{k}={v}' for k, v in fixed)} throughout)" if fixed else "")
    ax.set_xlabel(x_label + ("\nnot drawn, failed: trial " + ", ".join(map(str, failed)) if failed else ""))
    ax.set_ylabel(y_label)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    marked = {"drawn": tuple(p.record.number for p in points),
              "reference": tuple(p.record.number for p in points if p.series == reference),
              "interpreted": tuple(p.record.number for p in points if p.record.result.get("interpreted")),
              "failed": tuple(failed)}
    return _save(fig, path, stamp, marked)


def _spread(middle: float, low: float, high: float) -> Optional[list[list[float]]]:
    """Error bar lengths below and above ``middle``; None when a bound is unknown."""
    if not (_finite(low) and _finite(high)):
        return None
    return [[max(middle - min(low, high), 0.0)], [max(max(low, high) - middle, 0.0)]]

"""The end-of-sweep summary: the seed posts' results table, written by the sweep.

Baseline config against best config, knob by knob, then the measured figures and the
change (changes.py: in percent where the baseline is far from zero, else the difference,
so an error near zero is not "+1199900%"); with several objectives, the Pareto set; then
counts by outcome, the mean per-trial overhead, the price basis, and the command that
opens MLflow on the results.

Ranking reads the sweep's objectives only: a trial is measured when it did not fail and
its objective value is finite, whatever the metric is called.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Union

from accelsweep.kernels.registry import get_op
from accelsweep.sweeps.driver.define.edges import edge_lines
from accelsweep.sweeps.driver.record.trial_record import (CUT_BY_BUDGET, REJECTED, REUSED, TrialRecord, ranked,
                                                          trusted)
from accelsweep.sweeps.driver.reporting.changes import describe_change
from accelsweep.sweeps.driver.reporting.verdict import (Answer, Judgement, best_record, config_key, measurements,
                                                        sweep_answer, verdict)
from accelsweep.trainables.roofline import roofline_phrase
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import TRAINING_METRICS, MetricSet
from accelsweep.trainables.harness.microbench import NOISY_CV
from accelsweep.trainables.timing.limiter import PROFILED_STEPS
from accelsweep.trainables.utilisation import utilisation_line

# One definition of overhead_s, for every trainable (the driver computes it, callbacks.py).
OVERHEAD_MEANING = ("the trial's wall time outside its compile, warm-up and measured windows: process start-up, "
                    "imports, building the model and data, the limiter's profiled steps, reporting")

__all__ = ["OVERHEAD_MEANING", "Table", "best_record", "dominates", "html", "kernel_shape", "kernel_shapes",
           "markdown", "mean_overhead_s", "objective_vector", "op_keys", "pareto_set", "plain", "ranked", "summary",
           "summary_blocks", "table"]


def _format(template: str, value: float) -> str:
    return template.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def op_keys(record: TrialRecord) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(shape parameters, the trial's implementation's tuning knobs) of a kernel trial's
    op; an op that cannot be loaded here: every searched knob but impl and threads is a
    shape."""
    try:
        spec = get_op(record.config.get("op"))
        return spec.shape_params, tuple(spec.impl(record.config.get("impl")).tuning)
    except (ConfigError, ImportError):
        return tuple(k for k in record.searched if k not in ("impl", "threads")), ()


def kernel_shape(record: TrialRecord) -> tuple:
    """A kernel trial's shape: ((parameter, value), ...) in the op's order."""
    return tuple((k, record.config[k]) for k in op_keys(record)[0] if k in record.config)


def _shape_order(shape: tuple) -> list:
    return [(isinstance(value, str), value) for _, value in shape]


def kernel_shapes(records: Iterable[TrialRecord], metric: str) -> dict[tuple, list[TrialRecord]]:
    """A kernel sweep's ranked trials by shape, smallest shape first: each shape is ranked
    on its own (a grid over shapes has its fastest trial at its smallest shape, which says
    nothing of the implementations). A copy of an earlier trial (reused) is left out."""
    shapes: dict[tuple, list[TrialRecord]] = {}
    for record in ranked(records, metric):
        if record.status != REUSED:
            shapes.setdefault(kernel_shape(record), []).append(record)
    return dict(sorted(shapes.items(), key=lambda item: _shape_order(item[0])))


def objective_vector(values: Mapping[str, float], objectives: Sequence[tuple[str, str]]) -> Optional[tuple]:
    """The objective values of a result, each turned so that larger is better (a "min"
    objective negated); None when one is missing or not finite (nothing to compare)."""
    vector = []
    for metric, mode in objectives:
        value = values.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        vector.append(float(value) if mode == "max" else -float(value))
    return tuple(vector)


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one (both as
    ``objective_vector`` gives them: larger is better)."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def pareto_set(records: Iterable[TrialRecord], objectives: Sequence[tuple[str, str]]) -> list[TrialRecord]:
    """The measured trials no other measured trial dominates on the objectives
    ((metric, mode) pairs), best first by the first objective. One objective: its best
    (with any ties)."""
    first_metric = objectives[0][0]
    vectors = {}
    for record in ranked(records, first_metric):
        vector = objective_vector(record.result, objectives)
        if vector is not None and not record.result.get("interpreted"):
            vectors[record.number] = (record, vector)
    front = [record for record, vector in vectors.values()
             if not any(dominates(other, vector) for _, other in vectors.values())]
    return sorted(front, key=lambda r: (-vectors[r.number][1][0], r.number))


def mean_overhead_s(records: Iterable[TrialRecord]) -> float:
    values = [r.metric("overhead_s") for r in records if math.isfinite(r.metric("overhead_s"))]
    return sum(values) / len(values) if values else float("nan")


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


@dataclass(frozen=True)
class Table:
    """A table of the summary: its first row is the header."""

    rows: tuple[tuple[str, ...], ...]


Block = Union[str, Table]  # a line of text, or a table


def summary(title: str, records: Sequence[TrialRecord], metric: str, mode: str, knobs: Sequence[str],
            cost_note: str, ui_command: str, elapsed_s: float, metrics: Optional[MetricSet] = None,
            objectives: Sequence[tuple[str, str]] = (), planned_trials: Optional[int] = None,
            searched_out: bool = False, confirmations: Sequence[TrialRecord] = (), confirm_note: str = "",
            goal_reached: str = "", answer: Optional[Answer] = None) -> str:
    """The summary as the console prints it (``summary_blocks`` says what is in it)."""
    return plain(summary_blocks(title, records, metric, mode, knobs, cost_note, ui_command, elapsed_s,
                                metrics=metrics, objectives=objectives, planned_trials=planned_trials,
                                searched_out=searched_out, confirmations=confirmations, confirm_note=confirm_note,
                                goal_reached=goal_reached, answer=answer))


def plain(blocks: Sequence[Block]) -> str:
    return "\n".join(block if isinstance(block, str) else table(block.rows) for block in blocks)


def markdown(blocks: Sequence[Block]) -> str:
    """The same summary in Markdown: the first line a heading, tables as tables."""
    lines = []
    for index, block in enumerate(blocks):
        if isinstance(block, Table):
            escape = lambda cell: cell.replace("|", "\\|") or " "
            header, *rows = block.rows
            lines += ["| " + " | ".join(map(escape, header)) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
        elif index == 0:
            lines.append(f"# {block.strip('= ')}")
        else:
            lines.append(f"{block}  " if block else "")  # two spaces: a line break, as on the console
    return "\n".join(lines) + "\n"


def html(blocks: Sequence[Block], images: Sequence[tuple[str, str]] = ()) -> str:
    """The same summary as a page of its own; ``images``: (relative path, caption) below it."""
    from html import escape

    parts = []
    for index, block in enumerate(blocks):
        if isinstance(block, Table):
            header, *rows = block.rows
            parts.append("<table><thead><tr>" + "".join(f"<th>{escape(c)}</th>" for c in header) + "</tr></thead>"
                         "<tbody>" + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                                             for row in rows) + "</tbody></table>")
        elif index == 0:
            parts.append(f"<h1>{escape(block.strip('= '))}</h1>")
        elif block:
            parts.append(f"<p>{escape(block)}</p>")
    for path, caption in images:
        parts.append(f'<figure><img src="{escape(path)}" alt="{escape(caption)}">'
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}img{max-width:100%}")
    title = escape(blocks[0].strip("= ")) if blocks and isinstance(blocks[0], str) else "sweep report"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>\n")


def summary_blocks(title: str, records: Sequence[TrialRecord], metric: str, mode: str, knobs: Sequence[str],
                   cost_note: str, ui_command: str, elapsed_s: float, metrics: Optional[MetricSet] = None,
                   objectives: Sequence[tuple[str, str]] = (), planned_trials: Optional[int] = None,
                   searched_out: bool = False, confirmations: Sequence[TrialRecord] = (),
                   confirm_note: str = "", goal_reached: str = "", answer: Optional[Answer] = None) -> list[Block]:
    """``metric``/``mode``: the first objective, whose best trial the table sets against the
    baseline. ``confirmations``: the confirmation phase's trials (confirm.py), whose
    verdict is the sweep's; ``confirm_note``: why there are none, when that was planned.
    ``metrics``: the sweep's declaration (its trainable's MetricSet), a row per summarised
    metric; None: the training loop's rows. ``objectives``: every (metric,
    mode) of the sweep; with more than one, the Pareto set follows the table.
    ``planned_trials``: the sweep's num_samples, to say whether the search finished;
    ``searched_out``: the searcher ended it, having run out of new configs; ``goal_reached``:
    why Sweep.stop_at_utilisation ended it (sweeps/driver/run/goal.py). ``answer``: the
    sweep's ``verdict.sweep_answer`` where the caller holds it (the same one it tags and
    returns); else judged here."""
    objectives = list(objectives) or [(metric, mode)]
    declared = metrics or TRAINING_METRICS
    baseline = next((r for r in records if r.is_baseline), None)
    # One answer: the confirmation's pick when it judged, the search's leader beside it.
    answer = answer or sweep_answer(records, confirmations, metric, mode)
    best, leader, confirmed = answer.best, answer.leader, answer.judgement
    # A kernel grid over several shapes: the baseline is set against the best at its own
    # shape; every shape is ranked against its own baseline below (_per_shape_lines).
    shapes = kernel_shapes(records, metric) if "impl" in knobs else {}
    at_baseline_shape = len(shapes) > 1 and baseline is not None and baseline.measured(metric)
    if at_baseline_shape and not answer.confirmed:
        best = leader = best_record(shapes.get(kernel_shape(baseline), [baseline]), metric, mode)
    outcomes = Counter(r.status for r in records)
    lines = [f"== {title}: {len(records)} trials in {elapsed_s:.0f} s ("
             + ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items())) + ") =="]
    lines += _search_lines(records, planned_trials, searched_out, goal_reached)
    lines += edge_lines(records, metric)
    failures = Counter(r.error_cause or "error" for r in records if r.status == "failed")
    if failures:
        classes: dict[str, set] = {}
        for r in records:
            if r.status == "failed":
                classes.setdefault(r.error_cause or "error", set()).add(r.error_class)
        lines.append("failures by cause: " + ", ".join(
            f"{cause} x{n} ({', '.join(sorted(classes[cause]))})" for cause, n in failures.most_common()))
    ran = [r for r in records if r.status != REUSED]  # a reuse carries a copy of another trial's figures
    noisy = [r for r in ran if r.noise > NOISY_CV]
    if noisy:
        lines.append(f"{len(noisy)} trial(s) noisy (window-to-window cv > {NOISY_CV:.0%}): differences of a "
                     "few times their cv are not significant; rerun, or lengthen windows (window_min_s)")
        machine = sum(1 for r in noisy if r.metric("host_cv") > NOISY_CV)
        if machine:
            lines.append(f"{machine} of them while the machine's own speed moved (a fixed CPU loop timed between "
                         "the windows varied too): a shared host, not the kernel")
    if best is None:
        lines.append(f"No trial produced a measurement of {metric} (the first objective).")
    else:
        base = baseline if baseline is not None and baseline.measured(metric) else None
        if answer.confirmed:
            best_heading = f"confirmed best (trial {best.number})"
        elif at_baseline_shape:
            best_heading = f"best at the baseline's shape (trial {best.number})"
        else:
            best_heading = f"best (trial {best.number})"
        rows = [["", "baseline" + ("" if base else " (no measurement)"), best_heading, "change"]]
        for knob in knobs:
            base_value = str(base.config.get(knob, "")) if base else ""
            best_value = str(best.config.get(knob, ""))
            rows.append([knob, base_value, best_value, "" if base_value == best_value else "changed"])
        for name, label, fmt in _rows(declared, objectives):
            base_value = base.metric(name) if base else float("nan")
            best_value = best.metric(name)
            rows.append([label, _format(fmt, base_value), _format(fmt, best_value),
                         describe_change(base_value, best_value, fmt=fmt)])
            if name == metric and answer.confirmed and base is not None:
                rows.append(_confirmed_row(label, fmt, confirmed, confirmations, metric, mode, base, best))
        lines += ["", Table(tuple(map(tuple, rows))), ""]
        judged = verdict(base, leader, metric, mode, records)  # the search's, on its own leader
        if answer.confirmed and leader is not None and leader is not best:
            unconfirmed = ("" if config_key(leader.searched) in confirmed.names
                           else f"; {_not_confirmed(leader, records)}")
            lines.append(f"search's leader: trial {leader.number} at "
                         f"{_format(_fmt(declared, metric), leader.metric(metric))} {metric} (one trial per config)"
                         f"{unconfirmed}; the confirmation's rounds name trial {best.number}"
                         + (" (the baseline)" if best.is_baseline else ""))
        if confirmed is not None:
            if judged is not None:
                lines.append(f"search (one trial per config): {judged.text}")
            lines += _confirmation_lines(confirmed, records, confirmations, metric, mode, declared)
        elif judged is not None:
            lines.append(f"verdict: {judged.text}" + (f" (not confirmed: {confirm_note})" if confirm_note else ""))
        if "device" in best.result:
            timing = f"; step times from {best.result['step_time_source']}" if "step_time_source" in best.result else ""
            lines.append(f"best device: {best.result['device']}{timing}")
        lines += utilisation_lines(best, base)
        limiter = str(best.result.get("limiter") or "")
        if limiter:
            how = "" if limiter.startswith("not profiled") else f", {PROFILED_STEPS} profiled steps after its windows"
            lines.append(f"limiter (trial {best.number}{how}): {limiter}")
    if len(shapes) > 1:
        lines += ([""] if lines[-1] else []) + _per_shape_lines(shapes, baseline, metric, mode, knobs, declared,
                                                                records)
    lines += _roofline_lines(shapes, metric, mode)
    if len(objectives) > 1:
        lines += ([""] if lines[-1] else []) + _pareto_lines(records, objectives, knobs, declared)
    compiled = [r.metric("compile_s") for r in ran if math.isfinite(r.metric("compile_s"))]
    if compiled:
        lines.append(f"compile time, all trials: {sum(compiled):.1f} s")
    overhead = mean_overhead_s(records)
    if math.isfinite(overhead):  # the trainable reported its loop's time (loop_s)
        lines.append(f"mean overhead per trial: {overhead:.2f} s ({OVERHEAD_MEANING})")
    lines.append(cost_note)
    lines.append(f"results: {ui_command}")
    return lines


def utilisation_lines(best: TrialRecord, baseline: Optional[TrialRecord]) -> list[str]:
    """How far the best config is from the hardware's limit (trainables/utilisation.py),
    the baseline's beside it, and what the peak and the FLOP count are."""
    if "model_tflops" not in best.result:
        return []  # a trainable that reports no utilisation
    line = f"utilisation: best (trial {best.number}) at {utilisation_line(best.result)}"
    if baseline is not None and baseline is not best and math.isfinite(baseline.metric("mfu")):
        line += f"; the baseline at {baseline.metric('mfu'):.1%}"
        if baseline.result.get("peak_dtype") != best.result.get("peak_dtype"):
            # Each against the peak of its own precision (an fp32 baseline can sit at a larger share
            # of its peak than a bf16 best several times faster does of the bf16 one): said, or it
            # reads as a loss.
            line += (f" of its own {baseline.result.get('peak_dtype', 'unknown')} peak "
                     f"({baseline.metric('peak_tflops'):.3g} TFLOP/s)")
    lines = [line]
    if math.isfinite(best.metric("mfu")):
        theoretical = best.result.get("peak_theoretical_basis")  # absent from a run rebuilt on --resume
        lines.append(f"  peak: {best.result.get('peak_basis', '')}"
                     + (f"; {theoretical}" if best.result.get("peak_measured") and theoretical else ""))
        per_item = best.metric("model_flops_per_item")
        lines.append(f"  model FLOPs: {per_item / 1e9:.4g} GFLOP per item, {best.result.get('flops_method', '')}")
    return lines


def _fmt(metrics: MetricSet, metric: str) -> str:
    return metrics[metric].fmt if metric in metrics.names else "{:.4g}"


def _confirmation_lines(judged: Judgement, search: Sequence[TrialRecord], confirmations: Sequence[TrialRecord],
                        metric: str, mode: str, metrics: MetricSet) -> list[Block]:
    """The confirmation's rounds beside the search's figures, and the sweep's verdict."""
    fmt = _fmt(metrics, metric)
    contended = sum(r.contended for r in confirmations)
    # From the first trial's start to the last one's end (trials that take turns run at once).
    timed = [r for r in confirmations if math.isfinite(r.wall_s)]
    spent = max(r.created_at + r.wall_s for r in timed) - min(r.created_at for r in timed) if timed else 0.0
    lines: list[Block] = [f"confirmation: {judged.rounds} interleaved round(s), {len(confirmations)} trial(s), "
                          f"{spent:.0f} s" + (f", {contended} contended (left out of the pairs)" if contended else "")]
    by_key = {j.key: j for j in judged.candidates}
    medians = _confirmed_medians(confirmations, metric)
    rows = [["config", "search", "confirmed (median of rounds)", "change vs baseline", "95% interval", "quiet pairs"]]
    for key, name in judged.names.items():
        same = [r for r in search if config_key(r.searched) == key and r.measured(metric)]
        searched = max((r.metric(metric) for r in same), default=float("nan")) if mode == "max" else \
            min((r.metric(metric) for r in same), default=float("nan"))
        median = medians.get(key, float("nan"))
        one = by_key.get(key)
        if one is None:  # the baseline
            rows.append([name, _format(fmt, searched), _format(fmt, median), "", "", ""])
        else:
            interval = f"{one.low:+.1%} to {one.high:+.1%}" if math.isfinite(one.low) else "-"
            change = f"{one.gain:+.1%}" if math.isfinite(one.gain) else "-"
            rows.append([name, _format(fmt, searched), _format(fmt, median), change, interval, str(one.rounds)])
    lines += ["", Table(tuple(map(tuple, rows))), "", f"verdict: {judged.verdict.text}"]
    return lines


def _not_confirmed(leader: TrialRecord, records: Sequence[TrialRecord]) -> str:
    """Why the search's best figure was not among the configs confirmed."""
    if not trusted(leader, records):
        return "not confirmed: its figure is not trusted (contended, or taken on a loaded host)"
    return ("not confirmed: the confirmation takes the search's best at the host's typical speed (each figure "
            "scaled by its trial's speed probe), the simplest config near it and the climb's best step past the "
            "space's edge, as many as its time holds")


def _confirmed_medians(confirmations: Sequence[TrialRecord], metric: str) -> dict[str, float]:
    """Each config's (by config key) median over the confirmation's quiet rounds."""
    values: dict[str, list[float]] = {}
    for round_ in measurements(confirmations, metric):
        for key, (value, contended) in round_.items():
            if not contended and math.isfinite(value):
                values.setdefault(key, []).append(value)
    return {key: statistics.median(figures) for key, figures in values.items()}


def _confirmed_row(label: str, fmt: str, judged: Judgement, confirmations: Sequence[TrialRecord], metric: str,
                   mode: str, base: TrialRecord, best: TrialRecord) -> list[str]:
    """The first objective as the confirmation measured the table's two configs: its rows
    above are one search trial each, taken minutes apart, and the host's speed moves
    between them by more than the gain's interval; the change is the verdict's (paired
    by round), so the table and the verdict give one gain. As the rows above, it is the
    value's own change: a minimised figure's gain (+ is better) turned back."""
    key = config_key(best.searched)
    gain = next((j.gain for j in judged.candidates if j.key == key), float("nan"))
    change = gain if mode == "max" else 1 / (1 + gain) - 1
    change = "" if best.is_baseline else f"{change:+.1%}" if math.isfinite(change) else "-"
    medians = _confirmed_medians(confirmations, metric)
    return ["  confirmed (median of rounds)", _format(fmt, medians.get(config_key(base.searched), float("nan"))),
            _format(fmt, medians.get(key, float("nan"))), change]


def _search_lines(records: Sequence[TrialRecord], planned: Optional[int], searched_out: bool,
                  goal_reached: str = "") -> list[str]:
    """How far the search got, and what it did not spend time on: a summary must tell
    "no better config exists" from "the search ran out of time"."""
    ran = [r for r in records if r.status != REUSED]
    lines = []
    if planned is not None:
        cut = sum(r.status == CUT_BY_BUDGET for r in records)
        if len(ran) >= planned and not cut:
            lines.append(f"search: all {planned} planned trials ran")
        else:
            if goal_reached:
                lines.append(f"search: {len(ran) - cut} of {planned} planned trials ran; stopped at its goal: "
                             f"{goal_reached}")
            elif searched_out:
                lines.append(f"search: {len(ran)} of {planned} planned trials ran; the searcher ran out of new "
                             "configs (its proposals repeated measured ones): the space is searched out")
            else:
                lines.append(f"search: {len(ran) - cut} of {planned} planned trials ran to their end "
                             + (f"({cut} cut while running) " if cut else "")
                             + "before the sweep stopped (time budget, or interrupted): a better config may "
                               "exist among those not run")
    rejected = [r for r in records if r.status == REJECTED]
    if rejected:
        spent = sum(r.wall_s for r in rejected if math.isfinite(r.wall_s))
        lines.append(f"rejected in their first steps: {len(rejected)} trial(s), {spent:.1f} s in all (a projection "
                     "hopeless against the best so far; their figures are projections, not ranked)")
    reused = [r for r in records if r.status == REUSED]
    if reused:
        lines.append(f"proposed again after being measured: {len(reused)} proposal(s); the earlier results were "
                     "reused, not run again")
    return lines


def _rows(metrics: MetricSet, objectives: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(name, label, format) of the table's figures: every summarised metric, then any
    objective the declaration leaves out of the summary (an objective is always shown)."""
    rows = [(m.name, m.label, m.fmt) for m in metrics.summarised]
    for name, _ in objectives:
        if name not in (row[0] for row in rows):
            fmt = metrics[name].fmt if name in metrics.names else "{:.4g}"
            rows.append((name, name, fmt))
    return rows


def _per_shape_lines(shapes: Mapping[tuple, list[TrialRecord]], baseline: Optional[TrialRecord], metric: str,
                     mode: str, knobs: Sequence[str], metrics: MetricSet,
                     records: Sequence[TrialRecord]) -> list[Block]:
    """A kernel grid's ranking per shape: each shape's best implementation (with the knobs
    that vary beside it: tuning, threads) against the baseline's implementation at that
    shape, and each judged as the sweep's best is (verdict.py)."""
    shape_names = {name for shape in shapes for name, _ in shape}
    varying_shape = [name for name in dict.fromkeys(n for shape in shapes for n, _ in shape)
                     if len({dict(shape).get(name) for shape in shapes}) > 1]
    measured = [r for group in shapes.values() for r in group]
    # Beside impl, the knobs that make a candidate: those that are not shape parameters.
    candidate_knobs = [k for k in knobs if k not in shape_names and k != "impl"
                       and len({str(r.config.get(k)) for r in measured}) > 1]

    def candidate(record: TrialRecord) -> str:
        return " ".join([str(record.config.get("impl")), *(f"{k}={record.config.get(k)}" for k in candidate_knobs)])

    def is_baseline_candidate(record: TrialRecord) -> bool:
        return baseline is not None and all(record.config.get(k) == baseline.config.get(k)
                                            for k in knobs if k not in shape_names)

    label = metrics[metric].label if metric in metrics.names and metrics[metric].label else metric
    fmt = metrics[metric].fmt if metric in metrics.names else "{:.4g}"
    base_name = candidate(baseline) if baseline is not None else "none"
    rows = [["shape", "best", label, f"baseline: {base_name}", "change"]]
    judged = []
    for shape, group in shapes.items():
        shown = " ".join(f"{name}={value}" for name, value in shape if name in varying_shape)
        best = best_record(group, metric, mode)
        base = next((r for r in group if is_baseline_candidate(r)), None)
        base_value = base.metric(metric) if base else float("nan")
        rows.append([shown, f"{candidate(best)} (trial {best.number})", _format(fmt, best.metric(metric)),
                     _format(fmt, base_value) if base else "not measured",
                     describe_change(base_value, best.metric(metric), fmt=fmt) if base else ""])
        shape_verdict = verdict(base, best, metric, mode, records)
        judged.append(f"at {shown}: " + (shape_verdict.text if shape_verdict is not None else
                                         f"no measurement of {base_name} at this shape to judge against"))
    better = "lower" if mode == "min" else "higher"
    return [f"per shape ({len(shapes)} shapes, ranked apart; {label}, {better} is better; change against "
            f"{base_name} at the same shape):", "", Table(tuple(map(tuple, rows))), "", *judged, ""]


def _roofline_lines(shapes: Mapping[tuple, list[TrialRecord]], metric: str, mode: str) -> list[str]:
    """A kernel sweep's best implementation at each shape against its roofline bound
    (trainables/roofline.py), then the roofs' bases once each; nothing for an op that
    declares no FLOP count or bytes moved."""
    lines, bases = [], {}
    for shape, group in shapes.items():
        best = best_record(group, metric, mode)
        said = roofline_phrase(best.result) if best is not None else ""
        if said:
            shown = " ".join(f"{name}={value}" for name, value in shape)
            lines.append(f"roofline, {best.config.get('op')} {shown}: best {best.config.get('impl')} "
                         f"(trial {best.number}) {said}")
            bases.update({best.result.get(name, ""): None for name in ("peak_basis", "bandwidth_basis")})
    return lines + [f"  roof: {basis}" for basis in bases if basis and not basis.startswith("none")]


def _pareto_lines(records: Sequence[TrialRecord], objectives: Sequence[tuple[str, str]], knobs: Sequence[str],
                  metrics: MetricSet) -> list[Block]:
    front = pareto_set(records, objectives)
    said = ", ".join(f"{mode} {name}" for name, mode in objectives)
    if not front:
        return [f"Pareto set ({said}): no trial measured every objective", ""]
    formats = {name: metrics[name].fmt if name in metrics.names else "{:.4g}" for name, _ in objectives}
    rows = [["trial", *knobs, *(name for name, _ in objectives)]]
    for record in front:
        rows.append([f"{record.number}{' (baseline)' if record.is_baseline else ''}",
                     *(str(record.config.get(knob, "")) for knob in knobs),
                     *(_format(formats[name], record.metric(name)) for name, _ in objectives)])
    return [f"Pareto set ({said}): {len(front)} trial(s) no other trial dominates", "",
            Table(tuple(map(tuple, rows))), ""]

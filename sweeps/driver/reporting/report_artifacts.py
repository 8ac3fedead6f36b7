"""The sweep report: the summary's tables as Markdown and HTML, and the plots, logged as
artifacts of the sweep's MLflow parent run.

Built from the MLflow record alone (history.py), at the end of every sweep and again on
demand (``accelsweep report SWEEP``): its figures are the trial runs' metrics.

Training sweeps: the first objective against $ per 1M samples (the Pareto front over the
two marked), the first objective per trial in proposal order with the best so far, knob
importance (Optuna's evaluator on the sweep's study), the knobs in parallel coordinates,
and the per-window curves of the top trials. Kernel sweeps: latency per implementation
and shape, TFLOP/s where the op counts FLOPs, and each implementation against its
roofline per shape where it also counts bytes moved (roofline_plot.py).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import warnings
from typing import Callable, Optional

from accelsweep.sweeps.driver.record.history import SweepHistory, load_sweep
from accelsweep.sweeps.driver.record.optuna_study import quiet_optuna, shared_storage
from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.reporting import plots
from accelsweep.sweeps.driver.reporting.plots import PlotStamp
from accelsweep.sweeps.driver.reporting.roofline_plot import roofline_plot
from accelsweep.sweeps.driver.reporting.summary import html, markdown, ranked, summary_blocks
from accelsweep.sweeps.driver.reporting.verdict import sweep_answer
from accelsweep.trainables.loop.failures import one_line

__all__ = ["PLOTS_DIR", "REPORT_FILES", "build_report", "knob_importances", "log_report"]

REPORT_FILES = ("report.md", "report.html")
PLOTS_DIR = "plots"  # the plots' folder among the parent run's artifacts
TOP_CURVES = 5  # per-window curves drawn: the best trials by the first objective
COST_METRIC = "usd_per_1m_samples"


def is_kernel_sweep(history: SweepHistory) -> bool:
    return "impl" in history.knobs and "latency_p50_s" in history.metrics.names


def _stamp(history: SweepHistory, best: Optional[TrialRecord]):
    machine = history.tags.get("hardware") or (
        f"{history.tags.get('host.machine', 'unknown machine')}, {history.tags.get('host.cpus', '?')} CPUs")
    date = datetime.datetime.fromtimestamp(history.started_ms / 1000).strftime("%Y-%m-%d %H:%M")
    return PlotStamp(sweep=history.title, machine=machine, device=_device(best), date=date)


def _device(best) -> str:
    """The device the best trial ran on, as its result says; a trainable of one's own need
    not report one, and its trials measured all the same."""
    if best is None:
        return "no trial measured"
    return str(best.result.get("device") or "") or "not reported by the trainable"


# Below this, Optuna's evaluators give every knob the same importance (PedAnova: "The
# number of trials is too small to compute importances").
MIN_TRIALS_FOR_IMPORTANCE = 2


def knob_importances(history: SweepHistory, study_url: Optional[str] = None) -> tuple[dict[str, float], str, str]:
    """(knob -> importance, the evaluator's name, a note when there is none) from the
    sweep's Optuna study, for its first objective. ``study_url``: the study's database
    (default: the one the parent run names, which has no password in it)."""
    import optuna

    url = study_url or history.tags.get("optuna_storage")
    name = history.tags.get("optuna_study")
    if not url or not name or "<redacted>" in url:
        return {}, "", "no Optuna study for this sweep (pass its database with --study-storage)"
    evaluator_name = "PedAnovaImportanceEvaluator"
    try:
        with quiet_optuna():
            study = optuna.load_study(study_name=name, storage=shared_storage(url))
            complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            if complete < MIN_TRIALS_FOR_IMPORTANCE:
                # Optuna would give every knob the same importance, and importing its
                # importance module costs seconds (it loads scikit-learn for fANOVA).
                return {}, evaluator_name, (f"no importances: {complete} complete trial(s) in study {name}; "
                                            f"{MIN_TRIALS_FOR_IMPORTANCE} or more are needed")
            import optuna.importance

            evaluator = optuna.importance.PedAnovaImportanceEvaluator()
            with warnings.catch_warnings():
                # Its warning that a target is taken as lower-is-better: the target is turned so.
                warnings.filterwarnings("ignore", message=".*importances of params to achieve low `target`")
                importances = optuna.importance.get_param_importances(study, evaluator=evaluator,
                                                                      target=_first_objective_target(study))
    except (KeyError, ValueError, RuntimeError) as error:  # no study there
        return {}, evaluator_name, f"no importances: {error}"
    note = f"from {complete} complete trials of study {name}"
    if complete <= len(importances):
        # Each knob's share of the spread needs more trials than knobs to be told apart from
        # the others': with fewer, the bars say more of which configs ran than of the knobs.
        note += f"\nno more trials than the {len(importances)} knobs: a hint, not a ranking"
    return dict(importances), evaluator_name, note


def _first_objective_target(study):
    """PedAnova's target for the first objective. With one objective, None: PedAnova reads
    the study's direction. With several, a target is needed (without one PedAnova ranks
    by the whole Pareto front), and with a target PedAnova takes lower as better whatever
    the direction (optuna 5.0, importance/_ped_anova/evaluator.py): so a maximised first
    objective is negated, else it would rank the knobs that make the worst trials."""
    import optuna

    if len(study.directions) == 1:
        return None
    if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE:
        return lambda trial: -trial.values[0]
    return lambda trial: trial.values[0]


def build_report(history: SweepHistory, out_dir: str, study_url: Optional[str] = None) -> list[str]:
    """Write the report and its plots under ``out_dir``; returns their paths (plots under
    ``out_dir/plots``)."""
    metric, mode = history.objectives[0]
    os.makedirs(os.path.join(out_dir, PLOTS_DIR), exist_ok=True)
    answer = sweep_answer(history.records, history.confirmations, metric, mode)
    stamp = _stamp(history, answer.best)

    def at(name: str) -> str:
        return os.path.join(out_dir, PLOTS_DIR, name)

    labels = {m.name: m.label or m.name for m in history.metrics.metrics}
    if is_kernel_sweep(history):
        drawn = [plots.kernel_latency_plot(history.records, at("latency.png"), stamp),
                 plots.kernel_tflops_plot(history.records, at("tflops.png"), stamp),
                 roofline_plot(history.records, at("roofline.png"), stamp)]
    else:
        importances, evaluator, note = knob_importances(history, study_url)
        drawn = [plots.tradeoff_plot(history.records, metric, mode, COST_METRIC, "min", at("tradeoff.png"), stamp,
                                     labels=labels, cost_note=history.cost_note, answer=answer.best),
                 plots.progress_plot(history.records, metric, mode, at("progress.png"), stamp,
                                     label=labels.get(metric), answer=answer.best),
                 plots.importance_plot(importances, at("importance.png"), stamp, evaluator=evaluator, note=note),
                 plots.parallel_plot(history.records, history.knobs, metric, mode, at("parallel.png"), stamp,
                                     answer=answer.best)]
        curve_metric = _curve_metric(history)
        top = sorted(ranked(history.records, metric), key=lambda r: r.metric(metric), reverse=mode == "max")
        curves = {r.number: history.curve(r, curve_metric) for r in top[:TOP_CURVES]}
        drawn.append(plots.curves_plot(curves, at("curves.png"), stamp, label=labels.get(curve_metric, curve_metric),
                                       top=TOP_CURVES))
        if "mfu" in history.metrics.names:  # a training sweep: how far each trial is from the hardware's limit
            drawn.append(plots.utilisation_plot(history.records, answer.best, at("utilisation.png"), stamp))
    blocks = summary_blocks(history.title, history.records, metric, mode, history.knobs, history.cost_note,
                            history.ui_command, history.elapsed_s, metrics=history.metrics,
                            objectives=history.objectives, planned_trials=history.planned_trials,
                            searched_out=history.searched_out, goal_reached=history.goal_reached,
                            confirmations=history.confirmations,
                            confirm_note=history.confirm_note, answer=answer)
    blocks += ["", f"machine: {stamp.machine}; device: {stamp.device}; started {stamp.date}; "
                   f"MLflow parent run {history.parent_run_id} ({history.name})"]
    images = [(os.path.relpath(path, out_dir), os.path.splitext(os.path.basename(path))[0]) for path in drawn]
    with open(os.path.join(out_dir, "report.md"), "w") as out:
        out.write(markdown(blocks) + "\n" + "".join(f"![{caption}]({path})\n\n" for path, caption in images))
    with open(os.path.join(out_dir, "report.html"), "w") as out:
        out.write(html(blocks, images))
    return [os.path.join(out_dir, name) for name in REPORT_FILES] + drawn


def _curve_metric(history: SweepHistory) -> str:
    """The per-window figure the curves show: the declared window curve of the first
    objective's kind (window_throughput_... for throughput_...), else the objective."""
    metric = history.objectives[0][0]
    return history.metrics.per_window(metric) or metric


def log_report(tracker, parent_run_id: str, study=None,
               say: Optional[Callable[[str], None]] = None) -> list[str]:
    """Build the report from the store and log it on the parent run; returns the artifact
    paths. A report that cannot be built is said, not raised: the sweep's results are in
    MLflow already."""
    say = say or (lambda line: print(line, flush=True))
    try:
        history = load_sweep(tracker.tracking_uri, parent_run_id)
        with tempfile.TemporaryDirectory(prefix="accelsweep-report-") as out_dir:
            paths = build_report(history, out_dir, study_url=study.url if study is not None else None)
            logged = []
            for path in paths:
                folder = os.path.relpath(os.path.dirname(path), out_dir)
                tracker.log_artifact(parent_run_id, path, None if folder == "." else folder)
                logged.append(os.path.relpath(path, out_dir))
    except Exception as error:  # noqa: BLE001 - any failure here must not lose the sweep's end
        say(f"warning: the sweep report could not be built ({type(error).__name__}: {one_line(error)}); "
            f"rebuild it with: accelsweep report {parent_run_id} --tracking-uri ...")
        return []
    say(f"report: {', '.join(logged)} logged on the parent run {parent_run_id}")
    return logged

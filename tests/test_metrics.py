"""Metrics are declared once (trainables/metrics.py), and the objective check, the
summary table, the per-window curves and the progress line all read that declaration."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from accelsweep.sweeps.driver.run.callbacks import SweepCallback, TrialRecord
from accelsweep.sweeps.driver.reporting.summary import summary
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import DRIVER_METRICS, KERNEL_METRICS, TRAINING_METRICS, Metric, MetricSet

CUSTOM = MetricSet(
    metrics=(Metric("tokens_per_s", "tokens/s", "max", label="tokens/s", fmt="{:.1f}", curve=True,
                    progress="{:.0f} tok/s"),
             Metric("loss", "", "min", progress="loss {:.3f}")),
    headline=("tokens_per_s", "loss"),
)


def space(trial):
    trial.suggest_categorical("batch_size", [16, 32])


def plan(metrics, *objectives):
    from accelsweep import Objective, Sweep, plan_sweep
    from accelsweep.trainables.config import TrialConfig

    return plan_sweep(Sweep(name="metrics", trainable=lambda *a, **k: None, base=TrialConfig.make(model="vit-micro"),
                            space=space, objectives=[Objective(*o) for o in objectives], metrics=metrics))


def test_an_objective_must_name_a_declared_metric():
    with pytest.raises(ConfigError) as refused:
        plan(KERNEL_METRICS, ("throughput_samples_per_s", "max"))
    assert str(refused.value) == (
        "objective metric must be one of " + ", ".join(KERNEL_METRICS.names) + "; got 'throughput_samples_per_s'. "
        "Those are what the sweep's trainable declares (Sweep.metrics).")
    assert "latency_p50_s, latency_p10_s" in str(refused.value)
    with pytest.raises(ConfigError, match=r"one of tokens_per_s, loss; got 'throughput_samples_per_s'"):
        plan(CUSTOM, ("throughput_samples_per_s", "max"))
    plan(CUSTOM, ("tokens_per_s", "max"))
    plan(TRAINING_METRICS, ("throughput_samples_per_s", "max"), ("overhead_s", "min"))  # the driver's count too


def test_an_objective_must_go_its_metrics_better_way():
    with pytest.raises(ConfigError, match=r"^objective mode for latency_p50_s must be 'min'; got 'max'. "
                                          r"Lower latency_p50_s is better.$"):
        plan(KERNEL_METRICS, ("latency_p50_s", "max"))  # Objective's default mode is max: an easy slip
    plan(KERNEL_METRICS, ("host_cv", "max"))  # no better way declared: either goes


def test_a_sweep_without_a_declaration_is_refused():
    with pytest.raises(ConfigError, match=r"^metrics must be the MetricSet of what the trainable reports; got None\. "
                                          r"Trainable <lambda> declares none: decorate it with declare_metrics"):
        plan(None, ("anything_the_trainable_reports", "min"))


def test_a_declaration_is_checked_when_made():
    with pytest.raises(ConfigError, match="headline metric must be one of a; got 'b'"):
        MetricSet((Metric("a", "s", progress="{}"),), headline=("b",))
    with pytest.raises(ConfigError, match="progress of headline metric a must be a format"):
        MetricSet((Metric("a", "s"),), headline=("a",))
    with pytest.raises(ConfigError, match=r"metric names must be unique within a set; got \['a'\]"):
        MetricSet((Metric("a", "s", progress="{}"), Metric("a", "s")), headline=("a",))
    with pytest.raises(ConfigError, match="better for metric a must be one of max, min, None; got 'up'"):
        Metric("a", "s", "up")
    with pytest.raises(ConfigError, match="metric must be one of .*latency_p50_s.*; got 'nope'"):
        KERNEL_METRICS.replace("nope", label="x")


def record(result, number=1, measured_by=TRAINING_METRICS.measurement, status="finished", **fields):
    return TrialRecord(number, f"t{number}", {"batch_size": 16}, {"batch_size": 16}, {}, number == 1, 0.0,
                       status=status, result=result, measured_by=measured_by, **fields)


def callback(metrics=None, logged=None):
    tracker = SimpleNamespace(tracking_uri="sqlite:///unused.db", experiment="e", parent_run_id="p",
                              log_metrics=lambda run_id, metrics, step: logged.append((step, metrics)))
    return SweepCallback(tracker, dict, lambda searched: {}, {"batch_size": 16}, None, {}, 4, metrics=metrics)


def test_progress_lines_come_from_the_declaration():
    training = {"throughput_samples_per_s": 40.73, "usd_per_1m_samples": 2.5, "step_time_p50_s": 0.3929,
                "overhead_s": 12.5}
    line = callback(TRAINING_METRICS).progress_line(record(training))
    assert line == ("[trial 1/4 baseline] batch_size=16 -> 40.7 samples/s, $2.5/1M samples, p50 step 0.3929 s, "
                    "overhead 12.50 s [finished]")
    unpriced = {**training, "usd_per_1m_samples": float("nan")}
    assert callback().progress_line(record(unpriced, number=2)) == (  # no declaration: the training loop's
        "[trial 2/4] batch_size=16 -> 40.7 samples/s, p50 step 0.3929 s, overhead 12.50 s [finished]")
    kernel = {"latency_p50_s": 1.5e-3, "latency_cv": 0.01, "max_abs_error": 0.0, "interpreted": 1}
    assert callback(KERNEL_METRICS).progress_line(record(kernel, number=3)) == (
        "[trial 3/4] batch_size=16 -> p50 1.5000 ms, cv 1.0%, max error 0 (interpreted: not ranked) [finished]")
    assert callback(CUSTOM).progress_line(record({"tokens_per_s": 1234.4, "loss": 2.0}, number=2)) == (
        "[trial 2/4] batch_size=16 -> 1234 tok/s, loss 2.000 [finished]")
    # Cut by the time budget while it started or warmed up: no figure to show, and no row of nan.
    cut = record({name: float("nan") for name in training}, number=4, status="cut by time budget")
    assert callback(TRAINING_METRICS).progress_line(cut) == (
        "[trial 4/4] batch_size=16 -> nothing measured: the time budget ended it before its first window "
        "[cut by time budget]")
    assert "-> 40.7 samples/s" in callback().progress_line(record(training, number=4, status="cut by time budget"))


def test_summary_rows_come_from_the_declaration():
    def text(records, metrics, objective="throughput_samples_per_s"):
        return summary("s", records, objective, "max", ["batch_size"], "", "", 1.0, metrics=metrics)

    training = [record({"throughput_samples_per_s": 10.0, "trial_cost_usd": 0.001})]
    default = text(training, None)
    for metric in TRAINING_METRICS.summarised:
        assert metric.label in default
    assert "trial cost ($)" in default and "0.00100" in default
    custom = text([record({"tokens_per_s": 99.0}, measured_by=CUSTOM.measurement)], CUSTOM, "tokens_per_s")
    assert re.search(r"^tokens/s +99\.0 +99\.0 +\+0\.0%$", custom, re.M) and "throughput (samples/s)" not in custom
    relabelled = text([record({"latency_p50_s": 2e-3, "tflops": 1.5}, measured_by="latency_p50_s")],
                      KERNEL_METRICS.replace("tflops", label="TFLOP/s (int8: TOP/s)"), "latency_p50_s")
    assert "TFLOP/s (int8: TOP/s)" in relabelled and "latency p50 (s)" in relabelled
    unrowed = text([record({"latency_p50_s": 2e-3}, measured_by="latency_p50_s")],
                   KERNEL_METRICS.replace("tflops", label=None), "latency_p50_s")
    assert "TFLOP/s" not in unrowed and "window-to-window cv" in unrowed


def test_a_measurement_is_a_finite_first_objective():
    assert record({"latency_p50_s": 1e-3}, measured_by="latency_p50_s").has_measurement
    assert not record({"latency_p50_s": 1e-3}).has_measurement  # a training record: it measured no throughput
    assert not record({"latency_p50_s": float("nan")}, measured_by="latency_p50_s").has_measurement
    assert not record({"latency_p50_s": 1e-3}, measured_by="latency_p50_s", error="x").has_measurement  # it failed
    cb = callback(CUSTOM)
    made = cb._record(SimpleNamespace(trial_id="x", config={"batch_size": 16}))
    assert made.measured_by == "tokens_per_s" and made.is_baseline  # no objective given: the headline
    tracker = SimpleNamespace(tracking_uri="sqlite:///unused.db", experiment="e", parent_run_id="p")
    by_loss = SweepCallback(tracker, dict, lambda searched: {}, {}, None, {}, 4, metrics=CUSTOM,
                            objective_metrics=["loss"])
    assert by_loss._record(SimpleNamespace(trial_id="y", config={})).measured_by == "loss"


def test_per_window_curves_are_the_declared_ones():
    logged = []
    cb = callback(None, logged)  # no declaration: the training loop's curves
    trial = SimpleNamespace(trial_id="x", config={"batch_size": 16})
    cb._record(trial)
    cb.on_trial_result(1, [], trial, {"throughput_samples_per_s": 5.0, "window_throughput_samples_per_s": 6.0,
                                      "final_loss": 1.0, "step_time_p50_s": 0.1, "training_iteration": 1})
    # The declared curves are the windows' own figures (the run's throughput, over every
    # window, is logged once at the end).
    assert logged == [(1, {"window_throughput_samples_per_s": 6.0, "final_loss": 1.0})]
    logged.clear()
    cb = callback(CUSTOM, logged)
    cb._record(trial)
    cb.on_trial_result(1, [], trial, {"tokens_per_s": 7.0, "loss": 1.0, "training_iteration": 2})
    assert logged == [(2, {"tokens_per_s": 7.0})]
    logged.clear()
    tracker = SimpleNamespace(tracking_uri="sqlite:///unused.db", experiment="e", parent_run_id="p",
                              log_metrics=lambda run_id, metrics, step: logged.append((step, metrics)))
    cb = SweepCallback(tracker, dict, lambda searched: {}, {}, None, {}, 4, metrics=CUSTOM,
                       objective_metrics=["tokens_per_s", "loss"])  # an objective is a curve, declared one or not
    cb._record(trial)
    cb.on_trial_result(1, [], trial, {"tokens_per_s": 7.0, "loss": 1.0, "training_iteration": 2})
    assert logged == [(2, {"tokens_per_s": 7.0, "loss": 1.0})]


def test_the_harness_reports_every_declared_kernel_metric():
    from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench

    result = run_microbench(KernelConfig.make(op="giou", impl="torch-naive", batch=2, boxes=16, warmup_calls=1,
                                              window_min_calls=1, window_min_s=0.0, windows=2))
    assert set(KERNEL_METRICS.names) <= set(result)
    assert not set(m.name for m in DRIVER_METRICS) & set(result)  # those are the driver's to measure


def test_a_trials_end_is_logged_at_its_last_window_without_tunes_bookkeeping():
    logged, finished = [], {}
    tracker = SimpleNamespace(tracking_uri="sqlite:///unused.db", experiment="e", parent_run_id="p",
                              log_metrics=lambda run_id, metrics, step: logged.append((step, metrics)),
                              finish=lambda run_id, status, metrics, tags, step: finished.update(
                                  status=status, metrics=metrics, tags=tags, step=step))
    cb = SweepCallback(tracker, dict, lambda searched: {}, {}, None, {}, 4, print_line=lambda line: None)
    trial = SimpleNamespace(trial_id="x", config={"batch_size": 16})
    cb._record(trial).run_id = "run-x"
    tune_keys = {"training_iteration": 2, "pid": 123, "iterations_since_restore": 2, "time_total_s": 3.0,
                 "time_this_iter_s": 1.5, "timestamp": 99, "hostname": "h", "node_ip": "1.2.3.4", "done": False,
                 "date": "2026-11-23", "trial_id": "x"}
    for window, throughput in ((1, 5.0), (2, 7.0)):
        cb.on_trial_result(1, [], trial, {**tune_keys, "training_iteration": window, "windows_done": window,
                                          "throughput_samples_per_s": 6.0, "window_throughput_samples_per_s":
                                          throughput, "final_loss": 1.0, "loop_s": 2.0, "device": "cpu (x)",
                                          "my_note": "a trainable's own tag"})
    cb.on_trial_complete(1, [], trial)
    assert [step for step, _ in logged] == [1, 2]
    assert finished["step"] == 2  # not step 0: a curve does not start with the trial's final value
    assert not set(tune_keys) & set(finished["metrics"])
    assert "window_throughput_samples_per_s" not in finished["metrics"]  # its curve ends with its final value
    assert finished["metrics"]["throughput_samples_per_s"] == 6.0 and "overhead_s" in finished["metrics"]
    assert finished["tags"]["my_note"] == "a trainable's own tag" and finished["tags"]["device"] == "cpu (x)"
    assert "hostname" not in finished["tags"] and finished["tags"]["status"] == "finished"

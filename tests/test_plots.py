"""The sweep report's plots (sweeps/driver/reporting/plots.py), from hand-made trial records: each
writes a PNG that is not blank, marks what the report computes (the Pareto set, the best
so far), and says why when it has nothing to draw. No Ray, no MLflow."""

from __future__ import annotations

import math

import pytest

from accelsweep.sweeps.driver.reporting import plots
from accelsweep.sweeps.driver.run.callbacks import FAILED, FINISHED, REJECTED, REUSED, STOPPED_EARLY, TrialRecord
from accelsweep.sweeps.driver.reporting.summary import pareto_set
from accelsweep.trainables.cost import NO_BASIS_CLI_HINT, NO_BASIS_HINT
from accelsweep.trainables.errors import ConfigError

NAN = float("nan")
THROUGHPUT, PRICE = "throughput_samples_per_s", "usd_per_1m_samples"
STAMP = plots.PlotStamp("toy on cpu", "Test CPU, 2 CPUs (x86_64)", "cpu (test)", "2026-11-23")


def trial(number, status=FINISHED, baseline=False, error="", **result):
    knobs = {"batch_size": 2 ** (number % 5 + 3), "precision": ("fp32", "bf16")[number % 2]}
    return TrialRecord(number, f"t{number}", dict(knobs), dict(knobs), {}, baseline, 0.0, status=status,
                       result=result, error=error)


def training_trials():
    """Ten trials: a Pareto front of 3, 4, 7 (throughput up, price up), one dominated
    baseline, a failure, a rejection and a reuse whose figures must not count."""
    return [
        trial(1, baseline=True, **{THROUGHPUT: 100.0, PRICE: 2.0}),
        trial(2, **{THROUGHPUT: 150.0, PRICE: 1.8}),
        trial(3, **{THROUGHPUT: 160.0, PRICE: 1.0}),
        trial(4, **{THROUGHPUT: 220.0, PRICE: 1.5}),
        trial(5, status=FAILED, error="RuntimeError: boom", **{THROUGHPUT: 9999.0, PRICE: 0.01}),
        trial(6, status=REJECTED, **{THROUGHPUT: 5000.0, PRICE: 0.1}),
        trial(7, status=STOPPED_EARLY, **{THROUGHPUT: 300.0, PRICE: 2.5}),
        trial(8, status=REUSED, **{THROUGHPUT: 8000.0, PRICE: 0.2}),
        trial(9, **{THROUGHPUT: 120.0, PRICE: 2.2}),
        trial(10, **{THROUGHPUT: 140.0, PRICE: NAN}),
    ]


def assert_png(path):
    """A PNG file with something drawn on it (its pixels vary)."""
    import numpy as np
    from matplotlib.image import imread

    with open(path, "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 200
    assert float(np.var(pixels[..., :3])) > 1e-3


def says(written, words):
    """The figure's texts include ``words``."""
    return any(words in text for text in written.texts)


def test_tradeoff_marks_exactly_the_pareto_set_and_annotates_baseline_and_best(tmp_path):
    records = training_trials()
    written = plots.tradeoff_plot(records, THROUGHPUT, "max", PRICE, "min", str(tmp_path / "a" / "tradeoff.png"),
                                  STAMP, labels={THROUGHPUT: "throughput (samples/s)", PRICE: "$ per 1M samples"})
    assert written == str(tmp_path / "a" / "tradeoff.png")
    assert_png(written)
    expected = pareto_set(records, [(THROUGHPUT, "max"), (PRICE, "min")])
    assert sorted(written.marked["pareto"]) == sorted(r.number for r in expected) == [3, 4, 7]
    # Failed, rejected (a projection) and reused (a copy) trials are no points; nor one without a price.
    assert written.marked["points"] == (1, 2, 3, 4, 7, 9)
    assert says(written, "best (trial 7)") and says(written, "baseline (trial 1)")
    assert says(written, "throughput (samples/s) (higher is better)") and says(written, STAMP.footer)


def test_tradeoff_staircase_turns_at_the_worse_corner():
    front = [trial(1, **{THROUGHPUT: 100.0, PRICE: 1.0}), trial(2, **{THROUGHPUT: 200.0, PRICE: 2.0})]
    # Max throughput, min price: between the two, the corner is (price 2.0, throughput 100).
    assert plots._staircase(front, PRICE, "min", THROUGHPUT, "max") == ([1.0, 2.0, 2.0], [100.0, 100.0, 200.0])


@pytest.mark.parametrize("note, advice", [
    (NO_BASIS_CLI_HINT, "Pass --instance-type (one of "),  # a study's command line
    (NO_BASIS_HINT, "Give the Sweep one: cost, cost_note = resolve_cost_basis("),  # a script calling run_sweep
])
def test_tradeoff_without_a_price_basis_says_so_in_the_sweeps_terms(tmp_path, note, advice):
    records = [trial(1, baseline=True, **{THROUGHPUT: 100.0, PRICE: NAN}), trial(2, **{THROUGHPUT: 120.0})]
    written = plots.tradeoff_plot(records, THROUGHPUT, "max", PRICE, "min", str(tmp_path / "t.png"), STAMP,
                                  labels={PRICE: "$ per 1M samples"}, cost_note=note)
    assert_png(written)
    assert says(written, f"no price basis: $ per 1M samples unknown. {advice}")
    assert says(written, STAMP.footer)


def test_tradeoff_without_measurements_says_so(tmp_path):
    records = [trial(1, status=FAILED, error="boom", **{THROUGHPUT: 10.0, PRICE: 1.0})]
    written = plots.tradeoff_plot(records, THROUGHPUT, "max", PRICE, "min", str(tmp_path / "t.png"), STAMP)
    assert_png(written)
    assert written.marked["nothing"] == (f"no trial measured {THROUGHPUT}",)


def test_bad_mode_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="x_mode must be one of max, min; got 'up'"):
        plots.tradeoff_plot(training_trials(), THROUGHPUT, "max", PRICE, "up", str(tmp_path / "t.png"), STAMP)
    with pytest.raises(ConfigError, match="top must be an integer >= 1; got 0"):
        plots.curves_plot({1: [(1, 1.0)]}, str(tmp_path / "c.png"), STAMP, "x", top=0)


def test_progress_best_so_far_counts_ranked_trials_only(tmp_path):
    written = plots.progress_plot(training_trials(), THROUGHPUT, "max", str(tmp_path / "p.png"), STAMP,
                                  label="throughput (samples/s)")
    assert_png(written)
    steps = dict(written.marked["best_so_far"])
    # The failure's 9999, the rejection's projection and the reuse's copy never enter the line.
    assert set(steps) == {1, 2, 3, 4, 7, 9, 10}
    assert [steps[n] for n in sorted(steps)] == [100.0, 150.0, 160.0, 220.0, 300.0, 300.0, 300.0]
    assert written.marked["failed"] == (5,) and written.marked["best"] == (7,)
    for words in ("finished (6)", "failed (1)", "rejected (a projection, not ranked) (1)", "stopped early (1)",
                  "reused (an earlier trial's result) (1)", "best so far", "best (trial 7)"):
        assert says(written, words), words


def test_progress_min_mode_and_nothing_measured(tmp_path):
    records = [trial(1, latency=3.0), trial(2, latency=2.0), trial(3, latency=2.5)]
    written = plots.progress_plot(records, "latency", "min", str(tmp_path / "p.png"), STAMP)
    assert [v for _, v in written.marked["best_so_far"]] == [3.0, 2.0, 2.0]
    empty = plots.progress_plot([trial(1, status=FAILED, error="x")], "latency", "min", str(tmp_path / "e.png"),
                                STAMP)
    assert_png(empty)
    assert says(empty, "no trial measured latency")


def test_importance_largest_on_top_and_empty_says_why(tmp_path):
    written = plots.importance_plot({"precision": 0.2, "batch_size": 0.7, "num_workers": 0.1},
                                    str(tmp_path / "i.png"), STAMP, evaluator="FanovaImportanceEvaluator")
    assert_png(written)
    assert written.marked["order"] == ("batch_size", "precision", "num_workers")
    assert says(written, "knob importance (FanovaImportanceEvaluator)")
    why = "importance needs at least 2 finished trials with a value; 1 finished"
    empty = plots.importance_plot({}, str(tmp_path / "e.png"), STAMP, note=why)
    assert_png(empty)
    assert says(empty, why)


def test_parallel_draws_a_line_per_ranked_trial_and_labels_categories(tmp_path):
    written = plots.parallel_plot(training_trials(), ["batch_size", "precision"], THROUGHPUT, "max",
                                  str(tmp_path / "par.png"), STAMP)
    assert_png(written)
    assert written.marked["lines"] == (1, 2, 3, 4, 7, 9, 10) and written.marked["best"] == (7,)
    for words in ("fp32", "bf16", "batch_size", "thick line: the best, trial 7"):
        assert says(written, words), words
    none = plots.parallel_plot(training_trials(), [], THROUGHPUT, "max", str(tmp_path / "n.png"), STAMP)
    assert_png(none)
    assert says(none, "no knobs were searched")


def test_parallel_axis_scales_numbers_and_spaces_categories():
    heights, ticks = plots._axis([8, 16, 128])  # positive, 16x: log scale
    assert heights[0] == 0.0 and heights[-1] == 1.0 and math.isclose(heights[1], 0.25)
    assert [text for _, text in ticks] == ["8", "16", "128"]
    heights, ticks = plots._axis(["bf16", "fp32", "bf16", "fp8"])
    assert heights == [0.0, 0.5, 0.0, 1.0] and [t for _, t in ticks] == ["bf16", "fp32", "fp8"]
    assert plots._axis([4, 4])[0] == [0.5, 0.5]


def test_curves_top_and_missing_values(tmp_path):
    curves = {7: [(1, 280.0), (2, 300.0)], 4: [(1, 200.0), (2, NAN), (3, 220.0)], 3: [(1, 160.0)], 9: []}
    written = plots.curves_plot(curves, str(tmp_path / "c.png"), STAMP, "throughput (samples/s)", top=2)
    assert_png(written)
    assert written.marked["trials"] == (7, 4)
    assert says(written, "trial 7") and not says(written, "trial 3")
    empty = plots.curves_plot({9: [], 2: [(1, NAN)]}, str(tmp_path / "e.png"), STAMP, "throughput")
    assert_png(empty)
    assert says(empty, "no per-window values of throughput were recorded")


def kernel_trial(number, impl, op="giou", status=FINISHED, error="", interpreted=False, tflops=NAN,
                 p50=1e-3, **shape):
    result = {} if error else {"latency_p50_s": p50, "latency_p10_s": p50 * 0.9, "latency_p90_s": p50 * 1.3,
                               "tflops": tflops, "interpreted": int(interpreted)}
    searched = {"impl": impl, **shape}
    return TrialRecord(number, f"k{number}", searched, {"op": op, "dtype": "float32", **searched}, {}, number == 1,
                       0.0, status=status, result=result, error=error)


def test_kernel_latency_marks_baseline_series_and_interpreted_points(tmp_path):
    records = [kernel_trial(1, "torch-naive", batch=4, boxes=256), kernel_trial(2, "torch-naive", batch=4, boxes=1024),
               kernel_trial(3, "torch-compile", batch=4, boxes=256, p50=5e-4),
               kernel_trial(4, "pallas", batch=4, boxes=256, interpreted=True, p50=2e-2),
               kernel_trial(5, "jax-jit", batch=4, boxes=1024, status=FAILED, error="KernelMismatch: off"),
               kernel_trial(6, "torch-compile", batch=4, boxes=256, status=REUSED, p50=5e-4)]
    written = plots.kernel_latency_plot(records, str(tmp_path / "lat.png"), STAMP)
    assert_png(written)
    assert written.marked == {"drawn": (1, 2, 3, 4), "reference": (1, 2), "interpreted": (4,), "failed": (5,)}
    for words in ("giou: latency per implementation and shape", "torch-naive (baseline)",
                  f"pallas ({plots.NOT_A_SPEED_FIGURE})", "boxes=256", "batch=4 throughout", "failed: trial 5"):
        assert says(written, words), words


def test_kernel_series_name_the_tuning_knobs_that_vary(tmp_path):
    shape = {"m": 128, "k": 256, "n": 256}
    records = [kernel_trial(1, "jax-dot", op="matmul", tflops=1.0, **shape),
               kernel_trial(2, "pallas", op="matmul", tflops=0.5, **shape),
               kernel_trial(3, "pallas", op="matmul", tflops=0.7, **shape)]
    records[1].config.update(bm=64, bk=128, bn=128)
    records[2].config.update(bm=128, bk=128, bn=128)
    written = plots.kernel_tflops_plot(records, str(tmp_path / "tf.png"), STAMP)
    assert_png(written)
    assert written.marked["drawn"] == (1, 2, 3) and written.marked["reference"] == (1,)
    assert says(written, "pallas bm=64") and says(written, "pallas bm=128") and not says(written, "bk=")
    assert says(written, "TFLOP/s at p50")


def test_kernel_tflops_without_a_flop_count_says_so(tmp_path):
    records = [kernel_trial(1, "torch-naive", batch=4, boxes=256)]
    written = plots.kernel_tflops_plot(records, str(tmp_path / "tf.png"), STAMP)
    assert_png(written)
    assert says(written, "no FLOP count: op giou declares none")
    nothing = plots.kernel_latency_plot([kernel_trial(1, "torch-naive", error="boom", batch=4, boxes=256)],
                                        str(tmp_path / "lat.png"), STAMP)
    assert_png(nothing)
    assert says(nothing, "no kernel trial measured latency_p50_s")


def test_the_utilisation_plot_marks_each_measured_trial_and_the_best(tmp_path):
    measured = dict(peak_measured=1.0, peak_dtype="float32")
    records = [trial(1, baseline=True, mfu=0.10, mfu_theoretical=0.08, **measured),
               trial(2, mfu=0.30, mfu_theoretical=0.24, **measured),
               trial(3, status=FAILED, error="RuntimeError: boom", mfu=0.9, **measured),
               trial(4, status=REUSED, mfu=0.95, **measured),
               trial(5, mfu=NAN, **measured)]
    drawn = plots.utilisation_plot(records, records[1], str(tmp_path / "u.png"), STAMP)
    assert_png(drawn)
    assert drawn.marked == {"trials": (1, 2), "best": (2,)}
    assert "best (trial 2): 30.0%" in drawn.texts and "% of float32 peak (higher is better)" in drawn.texts
    assert "of the theoretical peak (ISA x clock)" in drawn.texts
    nothing = plots.utilisation_plot([trial(1, mfu=NAN)], None, str(tmp_path / "n.png"), STAMP)
    assert nothing.marked["nothing"] == ("no trial reported its utilisation (model FLOPs and a peak)",)


def test_the_plots_name_the_sweeps_answer_and_the_search_leader_beside_it(tmp_path):
    """When a confirmation named another config than the search's leader (trial 7), the
    plots mark that one as the confirmed best, as the summary does, and the leader as such."""
    records = training_trials()
    answer = records[3]  # trial 4
    progress = plots.progress_plot(records, THROUGHPUT, "max", str(tmp_path / "p.png"), STAMP, answer=answer)
    tradeoff = plots.tradeoff_plot(records, THROUGHPUT, "max", PRICE, "min", str(tmp_path / "t.png"), STAMP,
                                   answer=answer)
    parallel = plots.parallel_plot(records, ["batch_size", "precision"], THROUGHPUT, "max",
                                   str(tmp_path / "par.png"), STAMP, answer=answer)
    for written in (progress, tradeoff):
        assert written.marked["best"] == (4,) and written.marked["leader"] == (7,)
        assert says(written, "confirmed best (trial 4)") and says(written, "search's leader (trial 7)")
        assert not says(written, "best (trial 7)")  # the leader is not called best
    assert parallel.marked["best"] == (4,) and says(parallel, "thick line: the confirmed best, trial 4")
    # The answer is the leader: named "best" alone, as before.
    same = plots.progress_plot(records, THROUGHPUT, "max", str(tmp_path / "s.png"), STAMP, answer=records[6])
    assert same.marked["best"] == (7,) and "leader" not in same.marked and says(same, "best (trial 7)")

"""The tool-cost benchmark (benchmarks/tool_cost.py): its arithmetic, verdicts and table
on made-up numbers, and one --quick run end to end (slow) that must leave every figure
with its target and a verdict. No timing is asserted: on 2 shared cores it is noise."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from accelsweep.trainables.processes import ProcessStat, descendants
from benchmarks.tool_cost import (TARGETS, Figure, SweepClock, coefficient_of_variation, default_out,
                                  effective_concurrency, figure, figure_concurrency, figures_driver, format_table,
                                  judge, later_trial_parts, main, others_cpu_ticks, outside_loop_parts,
                                  paired_slowdown, peak_overlap, repeat_figures, slot_seconds_per_trial,
                                  tool_cores)
from accelsweep.sweeps.driver.run.callbacks import TrialRecord
from accelsweep.trainables.errors import ConfigError
from tests.conftest import REPO

EVERY_FIGURE = ("1", "2", "3a", "3b", "4a", "4b", "5", "6")


def record(number, created_at, wall_s, status="finished", **result):
    return TrialRecord(number=number, trial_id=f"t{number}", searched={}, config={}, resources={},
                       is_baseline=number == 1, created_at=created_at, status=status, wall_s=wall_s,
                       result=dict(result))


def clock_of(records, called=0.0, returned=100.0, slots=2, marks=None):
    lines = [(called + 0.5, "using the Ray instance already initialised"),
             (called + 1.0, f"s: up to {len(records)} trials, {slots} at a time ({slots} trial(s) fit ...)")]
    return SweepClock(called=called, returned=returned, fit_started=called + 1.5, lines=lines,
                      result=SimpleNamespace(records=records), marks=marks or {})


def test_judge_meets_at_the_target_and_refuses_an_unknown_comparison():
    assert judge(0.02, "<=", 0.02) is True and judge(0.021, "<=", 0.02) is False
    assert judge(1.8, ">=", 1.8) is True and judge(1.7, ">=", 1.8) is False
    assert judge(float("nan"), "<=", 1.0) is None and judge(None, ">=", 1.0) is None
    with pytest.raises(ConfigError, match="op"):
        judge(1.0, "<", 2.0)


def test_a_figure_says_its_target_and_verdict():
    passed = Figure("1", "measurement overhead", 0.01, "fraction", "<=", 0.02).to_dict()
    assert passed["target"] == "<= 2.0%" and passed["verdict"] == "pass" and passed["passed"] is True
    failed = Figure("3a", "first trial", 4.5, "s", "<=", 3.0).to_dict()
    assert failed["target"] == "<= 3.00 s" and failed["verdict"] == "FAIL" and failed["passed"] is False
    missing = Figure("6", "compile", math.nan, "fraction", "<=", 0.2, error="not measured: boom",
                     detail={"hits": [math.nan, 1.0], "per": {"a": math.inf}}).to_dict()
    assert missing["measured"] is None and missing["verdict"] == "not measured" and missing["passed"] is None
    assert missing["detail"] == {"hits": [None, 1.0], "per": {"a": None}}
    json.dumps(missing, allow_nan=False)  # the JSON file is strict JSON


def test_every_figure_has_its_issues_target():
    assert sorted(TARGETS) == sorted(EVERY_FIGURE)
    made = figure("3b", 0.7)
    assert (made.name, made.unit, made.op, made.target, made.passed) == ("later trials outside their loop", "s", "<=",
                                                                        0.5, False)


def test_other_processes_cpu_leaves_out_ours_and_processes_not_seen_twice():
    # pid -> (parent, CPU ticks): 10 is the benchmark, 11 its Ray (a child), 12 a trial under it;
    # 20 a neighbour; 21 a neighbour that started in between (its ticks cannot be split)
    def table(rows):
        return {pid: ProcessStat(parent=parent, state="S", cpu_ticks=ticks, started=0, name=name)
                for pid, (parent, ticks, name) in rows.items()}

    before = table({1: (0, 100, "init"), 10: (1, 50, "python"), 11: (10, 20, "raylet"), 12: (11, 0, "ray::Implicit"),
                    20: (1, 5, "pytest")})
    after = table({1: (0, 100, "init"), 10: (1, 80, "python"), 11: (10, 60, "raylet"), 12: (11, 90, "ray::Implicit"),
                   20: (1, 45, "pytest"), 21: (1, 7, "sh")})
    ours = descendants(after, [10])
    assert ours == {10, 11, 12}
    assert others_cpu_ticks(before, after, ours) == 40


def test_the_tools_cores_beside_a_loop_leave_out_the_training_process():
    # 100 ticks a second; 1 s samples; the trial (pid 12) trains, the driver (10) and raylet (11) work beside it
    samples = [(t, t + 1.0, {10: ("python", 10), 11: ("raylet", 5), 12: ("ray::Implicit", 190)})
               for t in (0.0, 1.0, 2.0, 3.0)]
    beside = tool_cores(samples, start=1.0, end=3.0, hertz=100)
    assert beside["training_process"] == "ray::Implicit"
    assert beside["cores"] == pytest.approx(0.15) and beside["by_process"] == pytest.approx({"python": 0.1,
                                                                                              "raylet": 0.05})
    half = tool_cores(samples, start=0.5, end=1.5, hertz=100)  # half of two samples each
    assert half["cores"] == pytest.approx(0.15)
    assert math.isnan(tool_cores(samples, start=10.0, end=11.0, hertz=100)["cores"])


def test_coefficient_of_variation_is_the_loops_population_cv():
    assert coefficient_of_variation([100.0, 100.0, 100.0]) == 0.0
    assert coefficient_of_variation([90.0, 110.0]) == pytest.approx(0.1)
    assert math.isnan(coefficient_of_variation([100.0]))


def test_paired_slowdown_is_the_median_of_each_pairs_ratio():
    # bare, path: 1%, 3% and -1% (the trial path measured faster) slower
    assert paired_slowdown([(100.0, 99.0), (200.0, 194.0), (100.0, 101.0)]) == pytest.approx(0.01)
    # one loaded pair does not decide it
    assert paired_slowdown([(100.0, 99.0), (100.0, 98.0), (100.0, 40.0)]) == pytest.approx(0.02)
    assert math.isnan(paired_slowdown([]))


def test_slot_seconds_per_trial_is_the_slots_held_less_the_loops():
    # 2 slots for 10 s = 20 slot-s; the loops took 4 s; 4 trials: 4 slot-s of overhead each
    assert slot_seconds_per_trial(10.0, 2, [1.0, 1.0, 1.0, 1.0], 4) == pytest.approx(4.0)
    assert slot_seconds_per_trial(4.0, 2, [2.0, 2.0, 2.0, 2.0], 4) == pytest.approx(0.0)
    assert math.isnan(slot_seconds_per_trial(10.0, 2, [], 0))


def test_concurrency_counts_trials_at_once():
    two_at_once = [(0.0, 4.0), (0.0, 4.0), (4.0, 8.0), (4.0, 8.0)]
    assert effective_concurrency(two_at_once) == pytest.approx(2.0) and peak_overlap(two_at_once) == 2
    one_at_a_time = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert effective_concurrency(one_at_a_time) == pytest.approx(1.0) and peak_overlap(one_at_a_time) == 1
    assert peak_overlap([(0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 3


def test_the_parts_outside_a_loop_add_up_to_its_total():
    marks = {"entered": 12.0, "imported": 15.0, "left": 26.0}
    first = outside_loop_parts(start=10.0, created=11.0, end=26.5, loop_s=10.0, setup_s=0.5, marks=marks,
                               fit_started=10.2)
    assert first["total_s"] == pytest.approx(6.5)
    assert first["driver_before_tune_s"] == pytest.approx(0.2) and first["tune_start_s"] == pytest.approx(0.8)
    assert first["trial_process_start_s"] == pytest.approx(1.0) and first["imports_s"] == pytest.approx(3.0)
    assert first["trial_end_s"] == pytest.approx(0.5)
    assert sum(v for k, v in first.items() if k != "total_s") == pytest.approx(first["total_s"])
    later = outside_loop_parts(start=26.5, created=27.0, end=38.0, loop_s=10.0, setup_s=0.4)
    assert later["total_s"] == pytest.approx(1.5) and later["between_trials_s"] == pytest.approx(0.5)
    assert sum(v for k, v in later.items() if k != "total_s") == pytest.approx(later["total_s"])


def test_later_trials_are_measured_from_the_end_of_the_one_before():
    records = [record(1, 10.0, 12.0, loop_s=10.0, setup_s=0.5), record(2, 22.5, 11.0, loop_s=10.0, setup_s=0.4),
               record(3, 34.0, 11.0, loop_s=10.0, setup_s=0.4), record(4, 0.0, 0.0, status="reused")]
    later = later_trial_parts(clock_of(records))
    assert [parts["total_s"] for parts in later] == pytest.approx([1.5, 1.5])  # (33.5 - 22) - 10, (45 - 33.5) - 10
    assert [parts["between_trials_s"] for parts in later] == pytest.approx([0.5, 0.5])


def test_repeatability_figures_of_made_up_trials():
    records = [record(i, 10.0 * i, 9.0, throughput_samples_per_s=t, throughput_cv=0.01, host_cv=0.02,
                      host_probe_s=p) for i, (t, p) in enumerate([(90.0, 0.001), (110.0, 0.001)], 1)]
    figures = repeat_figures(clock_of(records))
    assert figures["trial_to_trial_cv"] == pytest.approx(0.1) and figures["host_probe_trial_to_trial_cv"] == 0.0
    assert figures["window_to_window_cv_median"] == pytest.approx(0.01) and figures["trials"] == 2


def test_driver_figures_of_a_made_up_sweep():
    # 4 trials of 1 s loop in a 2-slot sweep of 10 s: (10 * 2 - 4) / 4 = 4 slot-s each
    records = [record(i, 1.0 + i, 2.0, loop_s=1.0, overhead_s=1.0) for i in range(1, 5)]
    slots, errors = figures_driver({"clock": clock_of(records, called=0.0, returned=10.0),
                                    "unwritten_runs": [3], "logged_errors": ["mlflow: database is locked"]})
    assert slots.key == "4a" and slots.measured == pytest.approx(4.0) and slots.passed is False
    assert slots.detail["slots"] == 2 and slots.detail["before_first_trial_s"] == pytest.approx(2.0)
    assert errors.key == "4b" and errors.measured == 2 and errors.passed is False


def test_concurrency_figure_of_made_up_sleepers():
    records = [record(i, 10.0 + 5.0 * ((i - 1) // 2), 5.0, loop_s=4.0, slept_s=4.0) for i in range(1, 5)]
    figure = figure_concurrency({"clock": clock_of(records)})
    assert figure.measured == pytest.approx(2.0) and figure.passed is True
    assert figure.detail["peak_overlap"] == 2 and figure.detail["sum_sleep_s"] == pytest.approx(16.0)


def test_the_table_has_every_figure_its_target_verdict_and_the_machine():
    figures = [Figure("1", "measurement overhead", 0.01, "fraction", "<=", 0.02, note="5 pairs"),
               Figure("3a", "first trial outside its loop", 4.2, "s", "<=", 3.0),
               Figure("6", "compile reuse", math.nan, "fraction", "<=", 0.2, error="not measured: X")]
    report = {"figures": [f.to_dict() for f in figures], "started_utc": "2026-11-23 18:00", "elapsed_s": 600.0,
              "machine": {"cpu_model": "AMD EPYC", "usable_cpus": 2, "versions": {"torch": "2.14.1"},
                          "load_average_1m_before": 0.1, "load_average_1m_after": 0.3}}
    table = format_table(report)
    lines = table.splitlines()
    assert [cell.strip() for cell in lines[0].split(" | ")] == ["figure", "measured", "target", "pass/fail"]
    assert any(line.startswith("1. measurement overhead") and "1.0%" in line and "<= 2.0%" in line
               and line.endswith("pass") for line in lines)
    assert any(line.startswith("3a. first trial") and "4.20 s" in line and line.endswith("FAIL") for line in lines)
    assert any(line.startswith("6. compile reuse") and line.endswith("not measured") for line in lines)
    assert "AMD EPYC, 2 CPUs" in table and "2026-11-23 18:00 UTC" in table
    assert "  1: 5 pairs" in table and "  6: not measured: X" in table and "BUSY" not in table
    report["figures"][0]["others_cpu"] = {"others_cores_mean": 0.6, "others_cores_max_1s": 1.9}
    busy = format_table(report)
    assert "BUSY: other processes used up to 0.60 cores" in busy
    assert "  1: 5 pairs [other processes: 0.60 cores mean, 1.90 at most]" in busy


def test_a_bad_figure_list_is_refused_before_anything_runs():
    with pytest.raises(ConfigError, match="--figures"):
        main(["--figures", "1,7"])


def test_the_default_output_names_the_machine_and_keeps_quick_runs_out_of_the_repository():
    full, quick = default_out(quick=False), default_out(quick=True)
    assert full.startswith(os.path.join(REPO, "benchmarks", "data", "tool_cost_")) and full.endswith("cpu.json")
    assert not quick.startswith(REPO) and quick.endswith("_quick.json")


@pytest.mark.slow
def test_a_quick_run_leaves_each_figure_it_measures_with_its_target_and_verdict(tmp_path):
    # Groups 4 and 5 (the driver at many trials, concurrency): a quick run of every group
    # takes 95 s of the suite's 20 minutes; figures 1-3 run real training trials and 6 a
    # cold torch.compile, which tests/test_compile_cache.py and the e2e sweeps cover.
    measured = ("4a", "4b", "5")
    out = tmp_path / "tool_cost.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run([sys.executable, "benchmarks/tool_cost.py", "--quick", "--figures", "4,5", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    figures = {f["key"]: f for f in report["figures"]}
    assert sorted(figures) == sorted(measured)
    for key, figure in figures.items():
        assert figure["error"] is None, f"figure {key}: {figure['error']}"
        assert figure["target"] and figure["op"] in ("<=", ">=") and figure["verdict"] in ("pass", "FAIL")
        assert isinstance(figure["measured"], (int, float)) and figure["passed"] == (figure["verdict"] == "pass")
        assert figure["passed"] == judge(figure["measured"], figure["op"], figure["target_value"])
    assert report["quick"] is True and report["machine"]["cpu_model"]
    for key in measured:  # the printed table is the JSON's
        assert f"{key}. {figures[key]['name']}" in done.stdout

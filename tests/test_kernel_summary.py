"""A kernel grid over several shapes in the summary (sweeps/driver/reporting/summary.py): each shape
ranked apart, its best implementation named and set against the baseline's implementation
at that shape; the baseline's own table compares within its shape."""

from __future__ import annotations

from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.reporting.summary import kernel_shapes, summary
from accelsweep.trainables.metrics import KERNEL_METRICS
from tests.test_kernel_ops_api import ROW_SUM_PATH

# (impl, rows) -> p50 latency (s): numpy is the baseline; torch wins at 4096 rows only,
# and the fastest trial of all is numpy at 4 rows (the smallest shape, not a better impl).
LATENCY = {("numpy-sum", 4): 1e-6, ("torch-sum", 4): 5e-6, ("numpy-sum", 4096): 4e-4, ("torch-sum", 4096): 1e-4}


def records():
    found = []
    for number, ((impl, rows), p50) in enumerate(LATENCY.items(), start=1):
        config = {"op": ROW_SUM_PATH, "impl": impl, "rows": rows, "cols": 16, "platform": "cpu"}
        found.append(TrialRecord(number, f"t{number}", {"impl": impl, "rows": rows}, config, {"CPU": 2.0},
                                 number == 1, 0.0, status="finished",
                                 result={"latency_p50_s": p50, "latency_cv": 0.01, "max_abs_error": 0.0,
                                         "host_cv": 0.01, "host_probe_s": 0.02, "impl": impl}))
    return found


def test_each_shape_is_ranked_apart_against_its_own_baseline():
    text = summary("row_sum on cpu", records(), "latency_p50_s", "min", ["impl", "rows"],
                   "kernel sweeps are not priced", "", 1.0, metrics=KERNEL_METRICS)
    lines = text.splitlines()
    assert "per shape (2 shapes, ranked apart; latency p50 (s), lower is better; change against numpy-sum at the " \
           "same shape):" in lines
    table = lines[lines.index("per shape (2 shapes, ranked apart; latency p50 (s), lower is better; change against "
                              "numpy-sum at the same shape):") + 2:][:3]
    assert table[0].split() == ["shape", "best", "latency", "p50", "(s)", "baseline:", "numpy-sum", "change"]
    assert table[1].split() == ["rows=4", "numpy-sum", "(trial", "1)", "1.000e-06", "1.000e-06", "+0.0%"]
    assert table[2].split() == ["rows=4096", "torch-sum", "(trial", "4)", "1.000e-04", "4.000e-04", "-75.0%"]
    assert any(line.startswith("at rows=4: no config beat the baseline") for line in lines)
    assert any(line.startswith("at rows=4096: trial 4 at +75.0% over the baseline") for line in lines)
    # The baseline's table is within its shape: its best is itself, not "trial 1 against trial 1 at another shape".
    header = next(line for line in lines if line.lstrip().startswith("baseline"))
    assert "best at the baseline's shape (trial 1)" in header


def test_one_shape_keeps_the_single_table():
    one = [r for r in records() if r.config["rows"] == 4096]
    one[0].is_baseline = True
    text = summary("row_sum on cpu", one, "latency_p50_s", "min", ["impl", "rows"], "", "", 1.0,
                   metrics=KERNEL_METRICS)
    assert "per shape" not in text and "best (trial 4)" in text


def test_shapes_are_grouped_smallest_first_and_failures_left_out():
    found = records()
    found[2].status, found[2].error = "failed", "boom"
    shapes = kernel_shapes(found, "latency_p50_s")
    assert [dict(shape)["rows"] for shape in shapes] == [4, 4096]
    assert [r.number for r in shapes[next(iter(shapes))]] == [1, 2]
    assert [r.number for r in list(shapes.values())[1]] == [4]

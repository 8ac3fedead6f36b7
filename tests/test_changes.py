"""A change against the baseline (sweeps/driver/reporting/changes.py): relative where the baseline
is far from zero next to the figures, absolute otherwise; and the summary's table uses it."""

from __future__ import annotations

import pytest

from accelsweep.sweeps.driver.reporting.changes import describe_change, is_relative
from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.reporting.summary import summary
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import Metric, MetricSet

NAN = float("nan")


@pytest.mark.parametrize("baseline, value, kwargs, text", [
    (120.0, 192.2, {}, "+60.2%"),  # throughput: far from zero, a percentage
    (0.1317, 0.3283, {}, "+149.3%"),
    (1e-7, 1.2e-3, {"fmt": "{:.2e}"}, "+1.20e-03"),  # an error near zero: the difference, not +1199900%
    (1.2e-3, 1e-7, {"fmt": "{:.2e}"}, "-100.0%"),  # from far from zero to near it: nearly all of it gone
    (0.178, 10.41, {"fmt": "{:.3f}"}, "+10.232"),  # past 10x: the difference reads better
    (-1.0, 1.0, {}, "+2"),  # across zero a percentage has no meaning
    (0.0, 0.0, {}, "+0"),
    (0.10, 0.15, {"fmt": "{:.1%}"}, "+50.0%"),
    (0.001, 0.05, {"fmt": "{:.1%}"}, "+4.9 pp"),  # a fraction near zero: percentage points
    (0.30, 0.21, {"mode": "min"}, "+30.0%"),  # with a mode, + is better
    (0.30, 0.21, {"mode": "max"}, "-30.0%"),
    (1e-7, 1.2e-3, {"mode": "min", "fmt": "{:.2e}"}, "-1.20e-03"),
    (NAN, 1.0, {}, ""),
    (1.0, float("inf"), {}, ""),
])
def test_relative_only_where_the_baseline_is_far_from_zero(baseline, value, kwargs, text):
    assert describe_change(baseline, value, **kwargs) == text


def test_the_boundary_is_a_baseline_ten_times_smaller():
    assert is_relative(1.0, 10.0) and is_relative(10.0, 1.0) and is_relative(1000.0, 1.0)  # a fall: -100% at most
    assert not is_relative(1.0, 10.01)
    assert not is_relative(0.0, 1.0) and not is_relative(-1.0, 1.0)


def test_a_bad_mode_names_the_field_the_allowed_values_and_the_value():
    with pytest.raises(ConfigError, match="mode must be one of max, min; got 'up'"):
        describe_change(1.0, 2.0, "up")


def test_the_summary_shows_an_error_near_zero_as_an_absolute_change():
    metrics = MetricSet(metrics=(
        Metric("samples_per_s", "samples/s", "max", label="samples/s", fmt="{:.1f}", progress="{:.1f}/s"),
        Metric("error", "", "min", label="error", fmt="{:.2e}")), headline=("samples_per_s",))

    def record(number, speed, error):
        return TrialRecord(number, f"t{number}", {"size": number}, {"size": number}, {}, number == 1, 0.0,
                           status="finished", result={"samples_per_s": speed, "error": error})

    text = summary("user sweep", [record(1, 100.0, 1e-7), record(2, 150.0, 1.2e-3)], "samples_per_s", "max",
                   ["size"], "", "", 1.0, metrics=metrics, objectives=[("samples_per_s", "max")])
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("samples/s", "error"))}
    assert rows["samples/s"].split()[-1] == "+50.0%"
    assert rows["error"].split()[1:] == ["1.00e-07", "1.20e-03", "+1.20e-03"]

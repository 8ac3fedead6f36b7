"""A figure's change against the baseline's, as the summary and the report print it.

    describe_change(120.0, 192.2)                  # '+60.2%'
    describe_change(1e-7, 1.2e-3, fmt="{:.2e}")   # '+1.20e-03': an error near zero, absolute
    describe_change(0.30, 0.21, "min")             # '+30.0%': with a mode, + is better

A percentage is the change's size only when the baseline is far from zero next to the
figures: a loss or an error that goes from 1e-7 to 1.2e-3 is "+1199900%", a number that
says nothing but that the baseline was nearly zero. So the change is relative when the
baseline and the value have the same sign and the baseline is at least RELATIVE_FLOOR of
the larger of the two (a percentage is then between -100% and +900%), and absolute, in
the metric's own format, otherwise.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from accelsweep.trainables.errors import one_of

__all__ = ["RELATIVE_FLOOR", "describe_change", "is_relative"]

# The smallest baseline, as a share of the larger of baseline and value, whose change is
# given in percent: past 10x either way a percentage is harder to read than the difference.
RELATIVE_FLOOR = 0.1


def is_relative(baseline: float, value: float) -> bool:
    """Whether the change from ``baseline`` to ``value`` reads as a percentage: both
    finite, of the same sign, the baseline not zero and at least RELATIVE_FLOOR of the
    larger magnitude."""
    if not (math.isfinite(baseline) and math.isfinite(value)) or baseline == 0 or baseline * value < 0:
        return False
    return abs(baseline) >= RELATIVE_FLOOR * max(abs(baseline), abs(value))


def describe_change(baseline: float, value: float, mode: Optional[str] = None, fmt: str = "{:.4g}") -> str:
    """The change from ``baseline`` to ``value`` as text: "+60.1%" where a percentage
    means something (``is_relative``), else the difference in ``fmt`` (the metric's own
    format, e.g. "{:.2e}"; a "%" format's difference is in percentage points, "pp").
    ``mode``: None gives the change of the value itself; "max" or "min" the improvement
    (+ is better: a lower latency is a + change with "min"). "" when either figure is not
    finite."""
    if mode is not None:
        one_of("mode", mode, ("max", "min"))
    if not (isinstance(baseline, (int, float)) and isinstance(value, (int, float))
            and math.isfinite(baseline) and math.isfinite(value)):
        return ""
    sign = -1.0 if mode == "min" else 1.0
    if is_relative(baseline, value):
        return f"{sign * (value - baseline) / abs(baseline) * 100:+.1f}%"
    difference = sign * (value - baseline)
    signed = re.sub(r"\{:", "{:+", fmt, count=1) if "{:" in fmt and "{:+" not in fmt else fmt
    if signed.rstrip().endswith("%}"):  # a fraction shown in percent: its difference is in points
        return signed.format(difference).replace("%", " pp")
    return signed.format(difference)

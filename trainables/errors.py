"""Bad input, said so it can be fixed without reading the code: ``ConfigError`` and the
checks that raise it. A leaf: it imports nothing of accelsweep, so every module (configs,
platforms, kernels, the sweep driver) can use it without an import circle."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["ConfigError", "MAX_SEED", "SweepStopped", "boolean", "non_negative_float", "one_of", "optional_str",
           "positive_float", "positive_int", "random_seed"]

# numpy's legacy RandomState, which Optuna's samplers seed, takes 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1


class ConfigError(ValueError):
    """A bad value for a named field. The message names the field, what is allowed and
    the value given, so it can be fixed without reading the code."""

    def __init__(self, field: str, allowed: str, given: Any, hint: str = ""):
        self.field = field
        message = f"{field} must be {allowed}; got {given!r}"
        super().__init__(f"{message}. {hint}" if hint else message)


class SweepStopped(RuntimeError):
    """A sweep that stopped before its end and can go on with --resume: the message says
    why, what was kept and how to resume. Scripts print it and exit with
    ``exit_status``: 75, EX_TEMPFAIL in sysexits.h ("a temporary failure; try again
    later"), apart from bad input (2) and a crash (1)."""

    exit_status = 75


def one_of(field: str, value: Any, allowed: tuple, hint: str = "") -> None:
    if value not in allowed:
        listed = ", ".join(str(a) for a in allowed)
        raise ConfigError(field, f"one of {listed}", value, hint)


def positive_int(field: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, f"an integer >= {minimum}", value)


def positive_float(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(field, "a finite number > 0", value)


def non_negative_float(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(field, "a finite number >= 0", value)


def random_seed(field: str, value: Any) -> None:
    """A seed every generator a sweep seeds takes (Optuna's samplers: numpy's RandomState;
    torch's: anything up to 2**64 - 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_SEED:
        raise ConfigError(field, f"an integer from 0 to {MAX_SEED} (2**32 - 1)", value)


def boolean(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(field, "True or False", value)


def optional_str(field: str, value: Any, what: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(field, f"{what}, or None", value)

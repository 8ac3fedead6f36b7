"""Flags that shorten (or lengthen) a training study's measurement: its warm-up steps and
windows. Each study's defaults fit its platform (a GPU's: 10-20 warm-up steps and windows
of 5-10 s); a run with little time, such as a lent GPU machine's few minutes, asks for
shorter ones, and every trial's MLflow params record what was used."""

from __future__ import annotations

import argparse

from accelsweep.sweeps.driver.define.cli import at_least_one, positive_seconds
from accelsweep.trainables.config import TrialConfig

FLAGS = {"warmup_steps": "--warmup-steps", "window_min_steps": "--window-steps", "window_min_s": "--window-s",
         "windows": "--windows"}


def add_measurement_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("measurement (default: the study's, for the platform)")
    group.add_argument("--warmup-steps", type=at_least_one, default=None, help="untimed steps before the windows")
    group.add_argument("--window-steps", type=at_least_one, default=None, help="steps each window runs at least")
    group.add_argument("--window-s", type=positive_seconds, default=None, help="seconds each window runs at least")
    group.add_argument("--windows", type=at_least_one, default=None, help="measured windows per trial")


def with_measurement_flags(base: TrialConfig, args: argparse.Namespace) -> TrialConfig:
    """``base`` with the measurement the flags name (the others kept)."""
    chosen = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in FLAGS.items()}
    chosen = {field: value for field, value in chosen.items() if value is not None}
    return base.replace(**chosen) if chosen else base

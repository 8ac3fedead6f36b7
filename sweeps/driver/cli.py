"""Command-line flags every sweep script shares, and the run-or-dry-run ending."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, Optional

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.cost import CostBasis, resolve_cost_basis
from accelsweep.trainables.platforms import PLATFORM_NAMES


def checked(convert: Callable, accept: Callable, allowed: str) -> Callable[[str], object]:
    """An argparse type that refuses, at parse time, what a script would otherwise
    replace with its default (``args.num_samples or 24`` turns 0 into 24):
    "argument --num-samples: must be an integer >= 1; got '0'", exit status 2."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {text!r}")
        return value

    return parse


at_least_one = checked(int, lambda n: n >= 1, "an integer >= 1")
positive_seconds = checked(float, lambda s: s > 0 and math.isfinite(s), "a number of seconds > 0")


def common_parser(description: str, default_samples: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", default="auto", choices=("auto",) + PLATFORM_NAMES,
                        help="where trials run; auto picks the best platform present (default: auto)")
    parser.add_argument("--num-samples", type=at_least_one, default=None,
                        help=f"trials to run, baseline included (default: {default_samples}; --smoke: 4)")
    parser.add_argument("--time-budget-s", type=positive_seconds, default=None,
                        help="stop starting trials after this many seconds; running ones are cut")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db",
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the sweep's name)")
    parser.add_argument("--storage-path", default=None, help="Ray Tune storage path (default: ~/ray_results)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                        help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray instance)")
    parser.add_argument("--instance-type", default=None,
                        help="EC2 instance type for the price basis (default: read from EC2 metadata)")
    parser.add_argument("--price-per-hour", type=float, default=None,
                        help="USD per hour for the whole machine; overrides the price table")
    parser.add_argument("--seed", type=int, default=0, help="seed for the searcher and the models")
    parser.add_argument("--scheduler", default="asha", choices=("asha", "median", "none"),
                        help="early stopping of hopeless trials (default: asha)")
    parser.add_argument("--max-concurrent-trials", type=at_least_one, default=None,
                        help="default: as many as the cluster's resources fit")
    parser.add_argument("--smoke", action="store_true", help="tiny model and few steps (for tests)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the newest stopped run of this sweep (same --storage-path and "
                             "--tracking-uri): finished trials are kept, interrupted ones run again")
    parser.add_argument("--retries", type=int, default=1,
                        help="restarts of a trial whose process or node was lost (default: 1); a trial's "
                             "own errors are recorded, never retried")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the search space, resources and environment per trial, then exit")
    return parser


def cost_basis(args: argparse.Namespace) -> tuple[Optional[CostBasis], str]:
    return resolve_cost_basis(args.instance_type, args.price_per_hour)


def fail(error: Exception) -> None:
    """Bad input ends the script before any trial, with the message and exit status 2."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def main_guard(main) -> None:
    try:
        main()
    except ConfigError as error:
        fail(error)

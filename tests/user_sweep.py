"""A user's sweep script, copied into a folder of its own by the tests: its trainable and
config are defined beside it (``user_sweep:...``), as a user's are. No torch: its trials
sleep through two short windows.

    python user_sweep.py --tracking-uri sqlite:///m.db --storage-path ray --num-samples 2 \\
        --trials measure|fail|measure-nothing [--environment-left FILE]

``--environment-left FILE``: the variables that differ after ``run_sweep`` from before
it (set, changed or unset), written to FILE as JSON.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Optional

from accelsweep import Objective, Sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, main_guard, sweep_options
from accelsweep.trainables.config import DictConfig
from accelsweep.trainables.metrics import TRAINING_METRICS


@dataclass(frozen=True)
class UserConfig(DictConfig):
    platform: str = "cpu"
    x: int = 0
    trials: str = "measure"
    cpus_per_worker: int = 1
    workers: int = 1
    instance_type: Optional[str] = None


def user_trainable(searched, base, cost=None):
    from ray import tune

    config = UserConfig.from_dict({**base, **searched})
    if config.trials == "fail":
        raise RuntimeError(f"injected failure for x={config.x}")
    for window in range(1, 3):
        time.sleep(0.2)
        # measure-nothing: a window that timed nothing (a zero-length clock, a device that never synced)
        throughput = 100.0 + config.x if config.trials == "measure" else float("nan")
        tune.report({"throughput_samples_per_s": throughput, "windows_done": window, "loss": 1.0})


user_trainable.metrics = TRAINING_METRICS


def main() -> None:
    parser = common_parser(__doc__.split("\n\n")[0], default_samples=2)
    parser.add_argument("--trials", choices=("measure", "fail", "measure-nothing"), default="measure")
    parser.add_argument("--environment-left", default=None)
    args = parser.parse_args()
    sweep = Sweep(name="user_sweep", trainable=user_trainable, base=UserConfig(trials=args.trials),
                  space=lambda trial: {"x": trial.suggest_categorical("x", [0, 1, 2, 3])},
                  objectives=[Objective("throughput_samples_per_s", "max")], **sweep_options(args, default_samples=2))
    before = dict(os.environ)
    try:
        run_sweep(sweep)
    finally:
        if args.environment_left:
            after = dict(os.environ)
            left = {name: [before.get(name), after.get(name)] for name in {*before, *after}
                    if before.get(name) != after.get(name)}
            with open(args.environment_left, "w") as out:
                json.dump(left, out)


if __name__ == "__main__":
    main_guard(main)

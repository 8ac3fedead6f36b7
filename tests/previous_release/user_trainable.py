"""A trainable of one's own with its own metrics, two objectives and their Pareto set: numpy matmul.

    python examples/user_trainable.py --smoke   # 4 trials, a second or so each
"""
import time
from dataclasses import dataclass

import numpy as np
from ray import tune

from accelsweep.sweeps.driver.api import Objective, Sweep, SweepConfig, declare_metrics, plan_sweep, run_sweep
from accelsweep.sweeps.driver.cli import common_parser, main_guard, sweep_options
from accelsweep.trainables.errors import one_of
from accelsweep.trainables.metrics import Metric, MetricSet

SIZES, DTYPES = (64, 128, 256, 512), ("float32", "float64")


@dataclass(frozen=True)
class MatmulConfig(SweepConfig):  # platform, cpus_per_worker and workers come with SweepConfig
    size: int = 128
    dtype: str = "float32"
    windows: int = 3  # reports per trial: early stopping compares trials at each
    window_s: float = 0.3

    def __post_init__(self):
        super().__post_init__()
        one_of("size", self.size, SIZES)
        one_of("dtype", self.dtype, DTYPES)


@declare_metrics(MetricSet(metrics=(
    Metric("gflops", "GFLOP/s", "max", label="GFLOP/s", fmt="{:.2f}", curve=True, progress="{:.2f} GFLOP/s"),
    Metric("seconds_per_call", "s", "min", label="seconds per call", fmt="{:.2e}", progress="{:.2e} s/call")),
    headline=("gflops", "seconds_per_call")))
def matmul_trainable(searched, base, cost=None):
    config = MatmulConfig.from_dict({**base, **searched})
    a, b = np.random.default_rng(0).standard_normal((2, config.size, config.size)).astype(config.dtype)
    for _ in range(config.windows):
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < config.window_s:
            a @ b
            calls += 1
        tune.report({"gflops": 2 * config.size ** 3 * calls / elapsed / 1e9, "seconds_per_call": elapsed / calls})


def main():
    args = common_parser(__doc__.split("\n\n")[0], default_samples=12).parse_args()
    one_of("--platform", args.platform, ("auto", "cpu"), "numpy multiplies on the CPU.")
    base = MatmulConfig(windows=2, window_s=0.05) if args.smoke else MatmulConfig()
    sweep = Sweep(name="user_matmul", trainable=matmul_trainable, base=base,
                  space={"size": tune.choice(SIZES), "dtype": tune.choice(DTYPES)},
                  objectives=[Objective("gflops", "max"), Objective("seconds_per_call", "min")],
                  **sweep_options(args, default_samples=4 if args.smoke else 12))
    print(plan_sweep(sweep).describe()) if args.dry_run else run_sweep(sweep)  # result.best, .pareto, .records


if __name__ == "__main__":
    main_guard(main)

"""What every kernel sweep script shares: a grid over implementations and shapes,
each point checked against the reference and then timed, one MLflow run per point."""

from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

from sweeps.api import Objective, Sweep, plan_sweep, run_sweep
from sweeps.cli import common_parser, main_guard
from trainables.config import ConfigError
from trainables.microbench import KERNEL_METRICS, KernelConfig, kernel_trainable

KERNEL_SUMMARY = (
    ("latency_p50_s", "latency p50 (s)", "{:.3e}"),
    ("latency_p10_s", "latency p10 (s)", "{:.3e}"),
    ("latency_p90_s", "latency p90 (s)", "{:.3e}"),
    ("latency_cv", "window-to-window cv", "{:.2%}"),
    ("items_per_s", "items/s", "{:.4g}"),
    ("max_abs_error", "max abs error", "{:.2e}"),
)


def kernel_main(op: str, description: str, shapes: Mapping[str, Sequence[int]],
                smoke_shapes: Mapping[str, Sequence[int]]) -> None:
    from kernels.registry import KernelUnavailable, get_op

    parser = common_parser(description, default_samples=0)
    args = parser.parse_args()
    platform = "cpu" if args.platform == "auto" else args.platform
    spec = get_op(op)
    impls = []
    for implementation in spec.impls_for(platform):
        try:
            if not args.dry_run:
                implementation.load()
            impls.append(implementation.name)
        except KernelUnavailable as missing:
            print(f"skipping {implementation.name}: {missing}")
    if not impls:
        raise ConfigError("platform", f"a platform with an implementation of {op}", platform)
    grid = {"impl": impls, **(smoke_shapes if args.smoke else shapes)}

    def space(trial):
        for name, choices in grid.items():
            trial.suggest_categorical(name, list(choices))

    base = KernelConfig.make(op=op, impl=impls[0], platform=platform, cpus_per_worker=os.cpu_count() or 1,
                        seed=args.seed, **{name: choices[0] for name, choices in grid.items() if name != "impl"},
                        **(dict(window_min_calls=5, window_min_s=0.1, windows=2) if args.smoke else {}))
    sweep = Sweep(
        name=f"{op}_kernels", trainable=kernel_trainable, base=base, space=space,
        objectives=[Objective("latency_p50_s", "min")], metric_names=KERNEL_METRICS,
        num_samples=args.num_samples or math.prod(len(c) for c in grid.values()),
        time_budget_s=args.time_budget_s, scheduler="none", sampler="grid", seed=args.seed,
        summary_metrics=KERNEL_SUMMARY, tracking_uri=args.tracking_uri, experiment=args.experiment,
        storage_path=args.storage_path, address=args.address, max_concurrent_trials=args.max_concurrent_trials,
        resume=args.resume, retries=args.retries,
        cost_note="kernel sweeps are not priced (no cost basis applies to a microbenchmark)",
        platform_note=f"{platform}: implementations {', '.join(impls)}",
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    run_sweep(sweep)


def run(op: str, description: str, shapes, smoke_shapes) -> None:
    main_guard(lambda: kernel_main(op, description, shapes, smoke_shapes))

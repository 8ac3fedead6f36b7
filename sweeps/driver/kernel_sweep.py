"""What every kernel sweep script shares: a grid over implementations and shapes,
each point checked against the reference and then timed, one MLflow run per point."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.api import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.cli import common_parser, main_guard, platform_from_args, sweep_options
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import PLATFORM_NAMES
from accelsweep.trainables.metrics import KERNEL_METRICS
from accelsweep.trainables.microbench import KernelConfig, kernel_trainable


def kernel_main(op: str, description: str, shapes: Mapping[str, Sequence[int]],
                smoke_shapes: Mapping[str, Sequence[int]],
                variants: Optional[Mapping[str, Mapping[str, Any]]] = None) -> None:
    """``variants``: named sets of the op's options (the first is the default), one per
    sweep (``--variant``): each is its own table in the seed, with its own contenders."""
    from accelsweep.kernels.registry import KernelUnavailable, get_op

    spec = get_op(op)
    variants = variants or {"default": {}}
    parser = common_parser(description, default_samples=0)
    parser.add_argument("--dtype", default=spec.dtypes[0], choices=spec.dtypes,
                        help=f"input and compute dtype (default: {spec.dtypes[0]})")
    if len(variants) > 1:
        parser.add_argument("--variant", default=next(iter(variants)), choices=tuple(variants),
                            help="which computation: " + "; ".join(
                                f"{name}: {', '.join(f'{k}={v}' for k, v in options.items()) or 'no options'}"
                                for name, options in variants.items()))
    args = parser.parse_args()
    options = dict(variants[getattr(args, "variant", next(iter(variants)))])
    grid_shapes = smoke_shapes if args.smoke else shapes
    first_shape = {name: choices[0] for name, choices in grid_shapes.items()}
    contenders = {platform: accepted_impls(op, platform, args.dtype, first_shape, options)
                  for platform in PLATFORM_NAMES}
    # auto: the best platform present that has contenders (a GPU has Triton's, a CPU only
    # the reference stacks); the note says which were passed over and why.
    platform, why = platform_from_args(args, [p for p, (impls, _) in contenders.items() if impls],
                                       f"implementations of {op}")
    impls, skipped = contenders[platform]
    for implementation in list(impls):
        try:
            if not args.dry_run:
                spec.impl(implementation).load()
        except KernelUnavailable as missing:
            impls.remove(implementation)
            skipped.append(f"skipping {implementation}: {missing}")
    for line in skipped:
        print(line)
    if not impls:
        raise ConfigError("platform", f"a platform with an implementation of {op} for dtype {args.dtype} and "
                                      f"options {options or '(none)'}", platform)
    grid = {"impl": impls, **grid_shapes}

    def space(trial):
        for name, choices in grid.items():
            trial.suggest_categorical(name, list(choices))

    base = KernelConfig.make(op=op, impl=impls[0], platform=platform, dtype=args.dtype,
                             cpus_per_worker=os.cpu_count() or 1, seed=args.seed, **first_shape, **options,
                             **(dict(window_min_calls=5, window_min_s=0.1, windows=2) if args.smoke else {}))
    sweep = Sweep(
        name=f"{op}_kernels", trainable=kernel_trainable, base=base, space=space,
        objectives=[Objective("latency_p50_s", "min")], sampler="grid",
        # An op without a FLOP count has no TFLOP/s: no row for it.
        metrics=KERNEL_METRICS if spec.flops else KERNEL_METRICS.replace("tflops", label=None),
        cost_note="kernel sweeps are not priced (no cost basis applies to a microbenchmark)",
        platform_note=f"{platform}, {args.dtype}, options {options or '(none)'}: implementations {', '.join(impls)}; "
                      f"{why}",
        # A grid runs every point once: no early stopping between them.
        **sweep_options(args, default_samples=math.prod(len(c) for c in grid.values()), scheduler="none"),
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
    else:
        run_sweep(sweep)


def accepted_impls(op: str, platform: str, dtype: str, shape: Mapping[str, int],
                   options: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The implementations of ``op`` registered for ``platform`` that take this dtype and
    these options (checked without importing their stacks), and a line for each one left
    out, with the reason."""
    from accelsweep.kernels.registry import get_op

    accepted, skipped = [], []
    for implementation in get_op(op).impls_for(platform):
        try:
            KernelConfig.make(op=op, impl=implementation.name, platform=platform, dtype=dtype, **shape, **options)
            accepted.append(implementation.name)
        except ConfigError as missing:
            skipped.append(f"skipping {implementation.name}: {missing}")
    return accepted, skipped


def run(op: str, description: str, shapes, smoke_shapes, variants=None) -> None:
    main_guard(lambda: kernel_main(op, description, shapes, smoke_shapes, variants))

"""What every kernel sweep shares: a grid over implementations and shapes, each point
checked against the reference and then timed, one MLflow run per point.

From a script of one's own (no command line read):

    import accelsweep

    sweep = accelsweep.build_kernel_sweep("my_package.ops:SPEC", {"rows": [256, 4096]}, platform="auto",
                                          tracking_uri="sqlite:///mlflow.db")
    accelsweep.run_sweep(sweep)

The built-in studies (sweeps/*_kernels.py) call ``run``, which reads their flags
(``kernel_main``) and builds the same sweep.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, Mapping, Optional, Sequence, Union

from accelsweep.kernels.registry import KernelUnavailable, get_op
from accelsweep.sweeps.driver.define.plan import plan_sweep
from accelsweep.sweeps.driver.define.sweep import Objective, Sweep
from accelsweep.sweeps.driver.run.lifecycle import run_sweep
from accelsweep.sweeps.driver.define.cli import (at_least_one, common_parser, main_guard, platform_from_args,
                                                 sweep_options)
from accelsweep.trainables.errors import ConfigError, one_of
from accelsweep.trainables.platforms import PLATFORM_NAMES
from accelsweep.trainables.harness.microbench import KernelConfig, kernel_metrics, kernel_trainable

__all__ = ["SMOKE_MEASUREMENT", "accepted_impls", "build_kernel_sweep", "kernel_main", "run"]

MEASUREMENT_FIELDS = ("warmup_calls", "window_min_calls", "window_min_s", "windows")  # KernelConfig's
# A few short windows: enough to check every point and rank them roughly, in seconds.
SMOKE_MEASUREMENT = {"window_min_calls": 5, "window_min_s": 0.1, "windows": 2}


def build_kernel_sweep(op: str, shapes: Optional[Mapping[str, Sequence[int]]] = None, *, platform: str = "auto",
                       dtype: Optional[str] = None, options: Optional[Mapping[str, Any]] = None,
                       smoke: bool = False, measurement: Optional[Mapping[str, Any]] = None, seed: int = 0,
                       address: Optional[str] = None, dry_run: bool = False, name: Optional[str] = None,
                       num_samples: Optional[int] = None, threads: Union[int, Sequence[int], None] = None,
                       **sweep_settings: Any) -> Sweep:
    """A grid sweep: every implementation of ``op`` that runs on ``platform``, at every
    combination of ``shapes``, each point checked against the op's reference, then timed.

    - ``op``: a built-in op, one installed under entry point group ``accelsweep.ops``, or
      ``"package.module:ATTR"`` (kernels/registry.py); it travels to the trials as given.
    - ``shapes``: shape parameter -> values to sweep; parameters left out keep the op's
      default (None: the op's default shape only).
    - ``platform``: a platform name, or ``"auto"``: the best one present that has an
      implementation of the op.
    - ``dtype``: default the op's first; ``options``: the op's semantic options (one
      computation per sweep: a causal mask, a soft-cap).
    - ``smoke``: ``SMOKE_MEASUREMENT``; ``measurement``: KernelConfig's measurement
      fields (warmup_calls, window_min_calls, window_min_s, windows), over either.
    - ``dry_run``: a plan only: implementation stacks are not imported, and a named
      platform need not be present.
    - ``num_samples``: default every point of the grid once. ``sweep_settings``: the rest of
      ``Sweep``'s options (tracking_uri, storage_path, experiment, print_line, ...).
    - ``threads``: torch's intra-op thread count in each trial (KernelConfig.threads), from
      1 to this machine's CPUs (what a trial holds); several values are a knob of the grid.
      None: every CPU the trial holds. Given, it leaves out the implementations that are
      not torch's (numpy's BLAS and JAX choose their own threads), each with a line.

    Implementations that cannot run here (a dtype or option they lack, a stack not
    installed) are left out, each with a line saying why; none left is a ConfigError.
    """
    spec = get_op(op)
    if platform != "auto":
        one_of("platform", platform, ("auto",) + PLATFORM_NAMES)
    dtype = spec.dtypes[0] if dtype is None else dtype
    one_of("dtype", dtype, spec.dtypes, f"Those are the dtypes op {spec.name!r} has a tolerance for.")
    options = dict(options or {})
    measurement = {**(SMOKE_MEASUREMENT if smoke else {}), **dict(measurement or {})}
    for setting in measurement:
        if setting not in MEASUREMENT_FIELDS:
            raise ConfigError("measurement", f"keyed by {', '.join(MEASUREMENT_FIELDS)}", setting)
    grid_shapes = _grid(shapes, spec)
    cpus = os.cpu_count() or 1
    thread_counts = _thread_counts(threads, cpus)
    for option in options:
        if option not in spec.options:
            raise ConfigError("options", f"keyed by the options of op {spec.name!r} "
                                         f"({', '.join(spec.options) or 'it has none'})", option)
    first_shape = {name: choices[0] for name, choices in grid_shapes.items()}
    contenders = {name: accepted_impls(op, name, dtype, first_shape, options,
                                       threads=thread_counts[-1] if thread_counts else None)
                  for name in PLATFORM_NAMES}
    # auto: the best platform present that has contenders (a GPU has Triton's, a CPU only
    # the reference stacks); the note says which were passed over and why.
    where = argparse.Namespace(platform=platform, address=address, dry_run=dry_run)
    platform, why = platform_from_args(where, [p for p, (impls, _) in contenders.items() if impls],
                                       f"implementations of {spec.name}")
    impls, skipped = contenders[platform]
    for implementation in list(impls):
        try:
            if not dry_run:
                spec.impl(implementation).load()
        except KernelUnavailable as missing:
            impls.remove(implementation)
            skipped.append(f"skipping {implementation}: {missing}")
    print_line = sweep_settings.get("print_line") or print
    for line in skipped:
        print_line(line)
    if not impls:
        raise ConfigError("platform", f"a platform with an implementation of {spec.name} for dtype {dtype} and "
                                      f"options {options or '(none)'}", platform)
    grid = {"impl": impls, **grid_shapes, **({"threads": thread_counts} if len(thread_counts) > 1 else {})}

    def space(trial):
        for knob, choices in grid.items():
            trial.suggest_categorical(knob, list(choices))

    base = KernelConfig.make(op=op, impl=impls[0], platform=platform, dtype=dtype,
                             cpus_per_worker=cpus, seed=seed, threads=thread_counts[0] if thread_counts else None,
                             **first_shape, **options, **measurement)
    settings = dict(
        # A grid runs every point once: no early stopping between them.
        scheduler="none",
        # An op without a FLOP count has no TFLOP/s: no row for it.
        metrics=kernel_metrics(base),
        cost_note="kernel sweeps are not priced (no cost basis applies to a microbenchmark)",
        platform_note=(f"{platform}, {dtype}, options {options or '(none)'}: implementations {', '.join(impls)}"
                       + (f"; torch threads {', '.join(map(str, thread_counts))}" if thread_counts else "")
                       + f"; {why}"),
    )
    return Sweep(name=name or f"{spec.name}_kernels", trainable=kernel_trainable, base=base, space=space,
                 objectives=[Objective("latency_p50_s", "min")], sampler="grid", seed=seed, address=address,
                 num_samples=math.prod(len(c) for c in grid.values()) if num_samples is None else num_samples,
                 **{**settings, **sweep_settings})


def _grid(shapes: Optional[Mapping[str, Sequence[int]]], spec) -> dict[str, list]:
    """Each shape parameter's values as a non-empty list (a lone value is a list of one)."""
    grid = {}
    for name, values in dict(shapes or {}).items():
        if name not in spec.shape_params:
            raise ConfigError("shapes", f"keyed by the shape parameters of op {spec.name!r} "
                                        f"({', '.join(spec.shape_params)})", name)
        values = [values] if isinstance(values, int) else list(values)
        if not values:
            raise ConfigError(f"shapes[{name!r}]", "a non-empty list of values", values)
        grid[name] = values
    return grid


def _thread_counts(threads: Union[int, Sequence[int], None], cpus: int) -> list[int]:
    """``threads`` as a list (empty: not set), each checked against this machine's CPUs."""
    if threads is None:
        return []
    counts = [threads] if isinstance(threads, int) and not isinstance(threads, bool) else list(threads)
    if not counts:
        raise ConfigError("threads", f"an integer from 1 to {cpus} or a non-empty list of them", threads)
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= cpus:
            raise ConfigError("threads", f"integers from 1 to {cpus} (this machine's CPUs, all of which a kernel "
                                         "trial holds)", count)
    return list(dict.fromkeys(counts))


def kernel_main(op: str, description: str, shapes: Mapping[str, Sequence[int]],
                smoke_shapes: Mapping[str, Sequence[int]],
                variants: Optional[Mapping[str, Mapping[str, Any]]] = None,
                argv: Optional[Sequence[str]] = None):
    """A kernel study's command line (common_parser's flags, --dtype, --variant) made into
    ``build_kernel_sweep``'s arguments. ``variants``: named sets of the op's options (the
    first is the default), one per sweep (``--variant``): each is its own table in the
    seed, with its own contenders. ``argv``: default sys.argv. Returns the SweepResult
    (None for --dry-run)."""
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
    parser.add_argument("--threads", type=at_least_one, nargs="+", default=None, metavar="N",
                        help="torch's intra-op threads per trial (torch.set_num_threads), at most this machine's "
                             "CPUs; several values: each is a point of the grid. Only torch implementations take "
                             "it: the others are left out, each with a line (default: every CPU a trial holds)")
    args = parser.parse_args(argv)
    sweep = build_kernel_sweep(op, smoke_shapes if args.smoke else shapes, platform=args.platform,
                               dtype=args.dtype, options=variants[getattr(args, "variant", next(iter(variants)))],
                               smoke=args.smoke, dry_run=args.dry_run, threads=args.threads,
                               # default_samples None: the builder's, every point of the grid once;
                               # a grid has no early stopping between its points.
                               **sweep_options(args, default_samples=None, scheduler="none"))
    if args.dry_run:
        print(plan_sweep(sweep).describe())
    else:
        return run_sweep(sweep)


def accepted_impls(op: str, platform: str, dtype: str, shape: Mapping[str, int],
                   options: Mapping[str, Any], threads: Optional[int] = None) -> tuple[list[str], list[str]]:
    """The implementations of ``op`` registered for ``platform`` that take this dtype,
    these options and a thread count (``threads``: only torch's do), checked without
    importing their stacks, and a line for each one left out, with the reason."""
    accepted, skipped = [], []
    held = {} if threads is None else {"threads": threads, "cpus_per_worker": max(threads, os.cpu_count() or 1)}
    for implementation in get_op(op).impls_for(platform):
        try:
            KernelConfig.make(op=op, impl=implementation.name, platform=platform, dtype=dtype, **shape, **options,
                              **held)
            accepted.append(implementation.name)
        except ConfigError as missing:
            skipped.append(f"skipping {implementation.name}: {missing}")
    return accepted, skipped


def run(op: str, description: str, shapes, smoke_shapes, variants=None) -> None:
    """A kernel study's ``__main__``: ``kernel_main`` with bad input ending the script
    (its message, exit status 2)."""
    main_guard(lambda: kernel_main(op, description, shapes, smoke_shapes, variants))

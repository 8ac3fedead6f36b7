"""Seed 003's Pallas matmul study as a sweep: the block sizes bm, bk, bn of a blocked
Pallas matmul, searched by Optuna TPE, with the library matmul (jnp.dot) as the baseline.

    python sweeps/pallas_matmul.py                      # int8, 1024^3, 16 trials
    python sweeps/pallas_matmul.py --dtype bfloat16
    python sweeps/pallas_matmul.py --smoke              # 128 x 256 x 256, 4 trials

The seed (TPU v5e, 8192^3, blocks 512, 1024, 1024): the int8 kernel ran 71% faster than the
bfloat16 one, and slower than XLA's int8 matmul. Trial 1 is the library matmul; TPE then
searches the blocks, among those that tile the problem, obey TPU tiling and fit VMEM (all
checked before the first trial: kernels/matmul/checks.py). Where Pallas only runs
interpreted (a CPU), each block shape is checked against the reference but its time is the
interpreter's, never ranked; where it runs natively (a TPU) the shape is the seed's.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Mapping, Optional, Sequence

from accelsweep import (ConfigError, KERNEL_METRICS, Objective, Sweep, common_parser, main_guard, plan_sweep,
                        platform_from_args, run_sweep, sweep_options)
from accelsweep.kernels.registry import get_op
from accelsweep.sweeps.driver.run.kernel_sweep import SMOKE_MEASUREMENT
from accelsweep.trainables.harness.microbench import KernelConfig, kernel_trainable

LIBRARY, KERNEL = "jax-dot", "pallas"
DTYPES = ("int8", "bfloat16")
DEFAULT_SAMPLES, SMOKE_SAMPLES = 16, 4

# Powers of two. 128 must be a choice of each knob: the library's trial carries the
# kernel's default blocks (128), and the baseline has to be a point of the space.
SHAPE = {"m": 1024, "k": 1024, "n": 1024}
BLOCKS = {"bm": (32, 64, 128, 256, 512), "bk": (128, 256, 512, 1024), "bn": (128, 256, 512, 1024)}
SEED_SHAPE = {"m": 8192, "k": 8192, "n": 8192}  # the seed's (TPU v5e)
SMOKE_SHAPE = {"m": 128, "k": 256, "n": 256}
SMOKE_BLOCKS = {"bm": (32, 64, 128), "bk": (128, 256), "bn": (128, 256)}

METRICS = KERNEL_METRICS.replace("tflops", label="TFLOP/s (int8: TOP/s)")


def library_then_blocks(blocks: Mapping[str, Sequence[int]], defaults: Mapping[str, int]):
    """A define-by-run space whose first trial may be the library and whose others are
    all the kernel. sweeps/driver/run/lifecycle.py enqueues the baseline as the study's first trial
    (trial.number 0); were ``impl`` a knob of every trial, TPE would learn that the
    library is the fastest and keep proposing it instead of searching blocks."""

    def space(trial) -> dict[str, Any]:
        if trial.number == 0 and trial.suggest_categorical("impl", [LIBRARY, KERNEL]) == LIBRARY:
            return dict(defaults)  # the library takes no blocks: they stay at their defaults
        for name, choices in blocks.items():
            trial.suggest_categorical(name, list(choices))
        return {"impl": KERNEL}

    return space


def refuse_invalid_blocks(base: KernelConfig, blocks: Mapping[str, Sequence[int]]) -> None:
    """Check every block shape the space can propose, not a sample of them: one that
    cannot run must stop the sweep here, not fail (or worse, run something else) later."""
    base_dict = base.to_dict()
    for values in itertools.product(*blocks.values()):
        point = dict(zip(blocks, values))
        try:
            KernelConfig.from_dict({**base_dict, **point, "impl": KERNEL})
        except ConfigError as error:
            raise ConfigError(error.field, "valid for every block shape the sweep can propose", point,
                              f"Refused before any trial: {error}") from None


def build_sweep(args, shape: Optional[Mapping[str, int]], blocks: Mapping[str, Sequence[int]]) -> Sweep:
    """``shape``: None for the platform's (the seed's where Pallas runs natively)."""
    kernel = get_op("matmul").impl(KERNEL)
    if args.platform not in ("auto", *kernel.platforms):
        raise ConfigError("--platform", f"one the {KERNEL} kernel runs on ({', '.join(kernel.platforms)})",
                          args.platform)
    platform, why = platform_from_args(args, kernel.platforms, f"implementations of {KERNEL} matmul")
    # Where the kernel's declaration has it compiled, not interpreted (a TPU), the shape is the seed's.
    native = platform not in kernel.interpreted_on
    shape = shape or (SEED_SHAPE if native else SHAPE)
    base = KernelConfig.make(op="matmul", impl=LIBRARY, platform=platform, dtype=args.dtype, seed=args.seed,
                             cpus_per_worker=os.cpu_count() or 1, **shape,
                             **(SMOKE_MEASUREMENT if args.smoke else {}))
    refuse_invalid_blocks(base, blocks)
    note = (f"{platform}, {args.dtype}, m x k x n = {shape['m']} x {shape['k']} x {shape['n']}: trial 1 is {LIBRARY}, "
            f"the rest {KERNEL} with TPE-searched blocks"
            + ("; Pallas runs in interpret mode here: each block shape is checked against the reference, and its "
               "time is the interpreter's, not a speed figure (not ranked)" if not native else "") + f"; {why}")
    return Sweep(
        name="pallas_matmul", trainable=kernel_trainable, base=base,
        space=library_then_blocks(blocks, {name: base.tuning[name] for name in blocks}),
        objectives=[Objective("latency_p50_s", "min")], metrics=METRICS, sampler="tpe",
        **sweep_options(args, default_samples=SMOKE_SAMPLES if args.smoke else DEFAULT_SAMPLES),
        cost_note="kernel sweeps are not priced (no cost basis applies to a microbenchmark)",
        platform_note=note,
    )


def main():
    parser = common_parser(__doc__.split("\n\n")[0], default_samples=DEFAULT_SAMPLES)
    parser.add_argument("--dtype", choices=DTYPES, default="int8", help="input dtype (default: int8, the seed's)")
    args = parser.parse_args()
    sweep = build_sweep(args, SMOKE_SHAPE if args.smoke else None, SMOKE_BLOCKS if args.smoke else BLOCKS)
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    result = run_sweep(sweep)
    interpreted = [r for r in result.records if r.result.get("interpreted")]
    if interpreted:
        print(f"{len(interpreted)} Pallas trial(s) ran in interpret mode: checked against the reference, not ranked; "
              "their times are the interpreter's, not speed figures.")
    return result


if __name__ == "__main__":
    main_guard(main)

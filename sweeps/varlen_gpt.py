"""Seed 003's variable-length study as a sweep: a GPT-style decoder on documents of random
length, batched padded or packed, in real (non-pad) tokens per second.

    python sweeps/varlen_gpt.py                        # local default: CPU, under 10 min
    python sweeps/varlen_gpt.py --smoke                # tiny model, seconds per trial
    python sweeps/varlen_gpt.py --dry-run --platform cuda

The seed's table (one H100, bf16 autocast, a 24-layer decoder of width 1024, batches of 32
documents of length 1..1023; step time in ms, eval then train, eager then compiled):

    SDPA, padded to 1024              batching=pad-max             132    130      342    299
    SDPA, padded to batch's longest   batching=pad-longest         129    116      337    294
    NestedTensor SDPA (eval only)     batching=packed-nested       131    42       -      -
    flash_attn_varlen_func (2.7.0)    batching=packed-flash-attn   51     -        160    -
"""

from __future__ import annotations

import os

from accelsweep import (ConfigError, Objective, Sweep, TrialConfig, common_parser, cost_basis, import_path,
                        main_guard, plan_sweep, platform_from_args, run_sweep, sweep_options, train_trainable)
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.varlen_gpt import LENGTHS, NOT_XLA, TRAINS_ON, VarlenGPT, runnable_on, space_for

CPU_TIME_BUDGET_S = 480  # keeps the local default run (with Ray's start) under 10 minutes


def base_config(platform: str, smoke: bool, lengths: str, seed: int) -> TrialConfig:
    """The seed's baseline, padded to the maximum length: its model and batch, smaller ones on a CPU."""
    trains_here = get_platform(platform)
    if smoke:
        sizes, measurement = dict(model="gpt-micro", max_len=64, batch_size=8, documents=256), \
            dict(warmup_steps=2, window_min_steps=3, window_min_s=0.25, windows=2)
    elif trains_here.sized_for_cpu:
        sizes, measurement = dict(model="gpt-small", max_len=256, batch_size=16), \
            dict(warmup_steps=3, window_min_steps=5, window_min_s=3.0, windows=3)
    else:
        sizes, measurement = dict(model="gpt-seed", max_len=1024, batch_size=32), \
            dict(warmup_steps=10, window_min_steps=20, window_min_s=5.0, windows=3)
    return TrialConfig.make(platform=platform, workload=import_path(VarlenGPT), batching="pad-max", lengths=lengths,
                            precision=trains_here.training_precision, seed=seed,
                            **trains_here.trial_cpus(os.cpu_count() or 1), **sizes, **measurement)


def make_space(rows: list[str], compile_modes: list[str]):
    def space(trial):
        trial.suggest_categorical("batching", rows)
        if len(compile_modes) > 1:
            trial.suggest_categorical("torch_compile", compile_modes)

    return space


def main():
    parser = common_parser(__doc__.split("\n\n")[0], default_samples=len(runnable_on("cpu")))
    parser.add_argument("--lengths", choices=LENGTHS, default="uniform",
                        help="document length distribution (default: uniform, the seed's)")
    parser.add_argument("--compile", action="store_true",
                        help="cpu: also search torch.compile (inductor; minutes per trial on 2 cores); "
                             "cuda searches it always")
    args = parser.parse_args()
    if args.platform not in ("auto", *TRAINS_ON):
        raise ConfigError("--platform", f"auto, {' or '.join(TRAINS_ON)} for this study", args.platform, NOT_XLA + ".")
    platform, platform_note = platform_from_args(args, TRAINS_ON, "this study")
    sized_for_cpu = get_platform(platform).sized_for_cpu
    rows, left_out = space_for(platform)
    # torch.compile takes minutes a trial on a 2-core CPU: searched there only when asked.
    compile_modes = ["none", "inductor"] if not sized_for_cpu or (args.compile and not args.smoke) else ["none"]
    basis, cost_note = cost_basis(args)
    note = "; ".join([f"rows: {', '.join(rows)}"] + [f"left out {line}" for line in left_out]
                     + [f"lengths {args.lengths}", platform_note])
    sweep = Sweep(
        name="varlen_gpt", trainable=train_trainable,
        base=base_config(platform, args.smoke, args.lengths, args.seed),
        space=make_space(rows, compile_modes),
        objectives=[Objective("throughput_tokens_per_s", "max")],
        cost=basis, cost_note=cost_note, platform_note=note, sampler="grid",
        **sweep_options(args, default_samples=len(rows) * len(compile_modes),
                        default_time_budget_s=CPU_TIME_BUDGET_S if sized_for_cpu and not args.smoke else None,
                        scheduler="none"),  # a grid runs every row: none is stopped early
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    return run_sweep(sweep)


if __name__ == "__main__":
    main_guard(main)

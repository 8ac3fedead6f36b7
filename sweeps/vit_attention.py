"""Seed 003's attention post as a sweep: ViT training step time per attention implementation, eager and compiled.

    python sweeps/vit_attention.py                        # CPU: 4 implementations x eager/inductor, under 10 min
    python sweeps/vit_attention.py --smoke                # tiny ViT, eager only, about a minute
    python sweeps/vit_attention.py --platform cuda --model vit-attn-3136   # the seed's long-sequence table

The seed's table (one H100, timm's ViT of 196 tokens, batch 128, bf16 autocast; ms a step). What a
platform cannot train, or has not installed, is removed from the space before any trial, with why.

    seed's attention            knobs here                               eager  compiled
    hand-written (baseline)     attention=naive                            370       242
    FlashAttention-3 beta       attention=flash-attn (FlashAttention-2)    240         -
    Transformer Engine, fused   attention=transformer-engine               243       204
    xFormers 0.0.28             attention=xformers                         246       203
"""

from __future__ import annotations

import os

from accelsweep import (ConfigError, KernelUnavailable, Objective, Sweep, TRAINING_METRICS, TrialConfig,
                        common_parser, cost_basis, main_guard, plan_sweep, platform_from_args, run_sweep,
                        sweep_options, train_trainable)
from accelsweep.kernels.registry import get_op
from accelsweep.trainables.platforms import get_platform

# The seed's rows in its order; "sdpa" is timm's own module (the dispatcher's choice).
ATTENTIONS = ["naive", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn", "flash-attn",
              "transformer-engine", "xformers", "flex"]
COMPILE = ["none", "inductor"]  # the seed's eager and compiled
# Batch per model: the seed's for its two ViTs (on its GPU); a CPU's for the small ones.
BATCH_SIZES = {"vit-attn-196": 128, "vit-attn-3136": 8, "vit-attn-cpu": 16, "vit-micro": 8}
LOADER_CPUS = 8  # at most, where loader processes feed the device: the training process and 7 loaders
MEASUREMENT = {
    "smoke": dict(warmup_steps=2, window_min_steps=3, window_min_s=0.25, windows=2),
    "cpu": dict(warmup_steps=3, window_min_steps=5, window_min_s=2.0, windows=3),
    # The seed skipped 20 steps and averaged about 80.
    "accelerator": dict(warmup_steps=20, window_min_steps=20, window_min_s=5.0, windows=3),
}
CPU_TIME_BUDGET_S = 480  # a net under the local default run on 2 cores, which takes about half of it


def default_model(platform: str, smoke: bool) -> str:
    if smoke:
        return "vit-micro"
    return "vit-attn-cpu" if get_platform(platform).sized_for_cpu else "vit-attn-196"


def default_batch_size(platform: str, model: str, smoke: bool) -> int:
    """The seed's for its ViTs (a CPU's for the small ones), at most the platform's cap."""
    cap = get_platform(platform).max_study_batch
    return BATCH_SIZES[model] if smoke or cap is None else min(cap, BATCH_SIZES[model])


def base_config(platform: str, model: str, batch_size: int, smoke: bool, cpus: int, seed: int) -> TrialConfig:
    """The seed's baseline: its hand-written attention, eager, at the precision the platform
    trains at (``Platform.training_precision``: the seed's bf16 autocast on a GPU)."""
    trains_here = get_platform(platform)
    measurement = MEASUREMENT["smoke" if smoke else "cpu" if trains_here.sized_for_cpu else "accelerator"]
    if trains_here.loader_processes:  # its CPUs feed it with loader processes (the seed used 12)
        held = dict(cpus_per_worker=cpus, num_workers=max(0, cpus - 1))
    else:
        held = dict(trains_here.trial_cpus(cpus), num_workers=0)
    return TrialConfig.make(platform=platform, model=model, attention="naive", torch_compile="none",
                            batch_size=batch_size, precision=trains_here.training_precision, seed=seed,
                            **held, **measurement)


def space_axes(base: TrialConfig, smoke: bool, check_installed: bool) -> tuple[list[str], list[str], dict[str, str]]:
    """The attention implementations and compile modes this platform can train with,
    and the reason for each value removed ("knob=value" -> why)."""
    removed = {}

    def accepted(knob: str, values: list[str]) -> list[str]:
        kept = []
        for value in values:
            try:
                base.replace(**{knob: value})
                kept.append(value)
            except ConfigError as refused:
                removed[f"{knob}={value}"] = str(refused)
        return kept

    attentions = accepted("attention", ATTENTIONS)
    if check_installed:
        for name in [a for a in attentions if a != "sdpa"]:  # sdpa: timm's own module, no kernel of ours
            try:
                get_op("attention").impl(name).load()
            except KernelUnavailable as missing:
                attentions.remove(name)
                removed[f"attention={name}"] = str(missing)
    if smoke:
        compiles = ["none"]
        removed["torch_compile=inductor"] = "--smoke (an inductor compile takes tens of seconds on 2 cores)"
    else:
        compiles = accepted("torch_compile", COMPILE)
    return attentions, compiles, removed


def main():
    parser = common_parser(__doc__.split("\n\n")[0], default_samples=0)
    parser.add_argument("--model", default=None, choices=tuple(BATCH_SIZES),
                        help="the ViT (default: cpu vit-attn-cpu, else vit-attn-196; --smoke vit-micro); "
                             "vit-attn-3136 is the seed's long-sequence table")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: the seed's for its ViTs (128, 8), at most 16 on xla, neuron and tpu")
    parser.add_argument("--cpus-per-worker", type=int, default=None,
                        help="CPUs a trial holds (default: cpu, xla: all of this machine's; cuda: up to 8, "
                             "the rest of them loader processes; else 1)")
    args = parser.parse_args()

    platform, platform_note = platform_from_args(args)
    model = args.model or default_model(platform, args.smoke)
    loaders = get_platform(platform).loader_processes
    default_cpus = min(LOADER_CPUS, os.cpu_count() or 1) if loaders else os.cpu_count() or 1
    base = base_config(platform, model, args.batch_size or default_batch_size(platform, model, args.smoke),
                       args.smoke, args.cpus_per_worker or default_cpus, args.seed)
    attentions, compiles, removed = space_axes(base, args.smoke,
                                               check_installed=not (args.dry_run or args.address))
    for value, why in removed.items():
        print(f"removed from the space: {value}: {why}")
    if not attentions:
        raise ConfigError("platform", "one where an attention implementation can train", platform)
    unchecked = [a for a in attentions if a != "sdpa" and get_op("attention").impl(a).install != "torch"]
    if unchecked and (args.dry_run or args.address):
        why = "a dry run imports no implementation's stack" if args.dry_run else "the cluster's workers run them"
        print(f"not checked whether installed: {', '.join(unchecked)} ({why})")

    def space(trial):
        trial.suggest_categorical("attention", attentions)
        trial.suggest_categorical("torch_compile", compiles)

    basis, cost_note = cost_basis(args)
    sweep = Sweep(
        name="vit_attention",
        trainable=train_trainable,
        base=base,
        space=space,
        sampler="grid",  # every row of the seed's table, once
        objectives=[Objective("step_time_p50_s", "min")],  # the seed's figure
        metrics=TRAINING_METRICS,
        cost=basis, cost_note=cost_note,
        platform_note=f"{platform_note}; {model}, batch {base.batch_size}, {base.precision}; "
                      f"removed from the space: {', '.join(removed) or 'nothing'}",
        # A grid runs every pair once, all of its windows: no early stopping between rows.
        **sweep_options(args, default_samples=len(attentions) * len(compiles), scheduler="none",
                        default_time_budget_s=CPU_TIME_BUDGET_S
                        if get_platform(platform).sized_for_cpu and not args.smoke else None),
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    return run_sweep(sweep)


if __name__ == "__main__":
    main_guard(main)

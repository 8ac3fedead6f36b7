"""Seed 003's attention post as a sweep: ViT training step time per attention implementation, eager and compiled.

    python sweeps/vit_attention.py                        # CPU: 4 implementations x eager/inductor, under 10 min
    python sweeps/vit_attention.py --smoke                # tiny ViT, eager only, about a minute
    python sweeps/vit_attention.py --platform cuda --dry-run
    python sweeps/vit_attention.py --platform cuda --model vit-attn-3136   # the seed's long-sequence table

The seed's figures (its own, hand-run: one H100, CUDA 12.4, PyTorch 2.5.1; timm's ViT
with 196 tokens, 24 blocks of 16 heads of 64, batch 128, bf16 autocast; average step
time in ms, lower is better), as knobs here:

    seed's attention            knobs here                               eager  compiled
    hand-written (baseline)     attention=naive                            370       242
    SDPA, each backend forced   attention=sdpa-flash, sdpa-efficient,     (the seed's image table only:
                                sdpa-math, sdpa-cudnn                      apart eager, close compiled)
    FlashAttention-3 beta       attention=flash-attn (FlashAttention-2)    240         -  (FA3 did not compile)
    Transformer Engine, fused   attention=transformer-engine               243       204
    xFormers 0.0.28             attention=xformers                         246       203

Not rows of that table: attention=sdpa (timm's own module: SDPA, the dispatcher's choice)
and attention=flex (plain FlexAttention; the seed ran it on its variants, below).

The seed's text adds: flash-attn-3 eager 240 ms was 5% faster than SDPA's flash backend
and 54% faster than the baseline; xFormers eager 10.5% faster than SDPA's memory-efficient
backend; compiled, the best reached 202 ms (20% below the compiled baseline). At 3136
tokens (--model vit-attn-3136: batch 8, 6 blocks of 12 heads of 64) flash-attn-3 was
~5x the hand-written attention eager, and Transformer Engine compiled the best at 53 ms.
Its FlexAttention soft-cap (~3.5x eager, ~1.5x compiled) and neighbourhood-mask (2.19x
eager, 2.59x compiled) tables are the kernel study's variants (sweeps/attention_kernels.py
--variant soft-cap / neighborhood); here every implementation computes plain attention.

What each knob is here: ``attention`` swaps the computation inside timm's Attention
module (same projections and weights) for the implementation of that name in
kernels/attention; an SDPA backend is forced with ``sdpa_kernel`` and raises rather than
fall back. ``torch_compile`` none / inductor is the seed's eager / compiled. The grid
runs every pair once; the baseline is the seed's (naive, eager). The seed's ViT has no
class token and average-pools (presets vit-attn-196, vit-attn-3136); it trained with
SGD, this loop with AdamW (the same for every row). An implementation the platform lacks
is removed from the space before any trial, with the reason: on a CPU SDPA's
memory-efficient and cuDNN backends, flash-attn, xFormers and Transformer Engine are
CUDA-only, and FlexAttention has no backward pass (torch 2.14.1); on xla, neuron and
tpu only naive and sdpa lower (eager: their step is one XLA graph already, and inductor
is not theirs). Those not installed are removed too (not checked by --dry-run, nor with
--address, where the workers' installation is what counts).

Verified where: on this CPU (torch 2.14.1), naive, sdpa, sdpa-math and sdpa-flash (ATen's
CPU flash kernel) train eager and compiled, agree with each other, and the forced backend
is the one the profiler sees (tests/test_vit_attention.py). On a lent H100 (torch 2.11,
2026-11-26; docs/gpu.md), eager, batch 128, bf16 autocast, short windows: naive 251.7 ms a
step, sdpa 185.4, sdpa-flash 189.9, sdpa-efficient 201.1, sdpa-cudnn 184.6, sdpa-math
298.8 (each forced backend's kernel seen in a profile of neuron_vit's ViT-B/16); the
compiled rows, flex, flash-attn, xFormers and Transformer Engine did not run there.
"""

from __future__ import annotations

import os

from accelsweep.kernels.registry import KernelUnavailable, get_op
from accelsweep import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, cost_basis, main_guard, platform_from_args, sweep_options
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import TRAINING_METRICS
from accelsweep.trainables.trainable import train_trainable

# The seed's rows in its order; "sdpa" is timm's own module (the dispatcher's choice).
ATTENTIONS = ["naive", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn", "flash-attn",
              "transformer-engine", "xformers", "flex"]
COMPILE = ["none", "inductor"]  # the seed's eager and compiled
# Batch per model: the seed's for its two ViTs (on its GPU); a CPU's for the small ones.
BATCH_SIZES = {"vit-attn-196": 128, "vit-attn-3136": 8, "vit-attn-cpu": 16, "vit-micro": 8}
XLA_BATCH_SIZE = 16  # seed 000's batch per NeuronCore
MEASUREMENT = {
    "smoke": dict(warmup_steps=2, window_min_steps=3, window_min_s=0.25, windows=2),
    "cpu": dict(warmup_steps=3, window_min_steps=5, window_min_s=2.0, windows=3),
    # The seed skipped 20 steps and averaged about 80.
    "accelerator": dict(warmup_steps=20, window_min_steps=20, window_min_s=5.0, windows=3),
}
CPU_TIME_BUDGET_S = 480  # a net under the local default run (4.5 min on the 2-core AMD EPYC VM, shared, 2026-11-23)


def default_model(platform: str, smoke: bool) -> str:
    if smoke:
        return "vit-micro"
    return "vit-attn-cpu" if platform == "cpu" else "vit-attn-196"


def base_config(platform: str, model: str, batch_size: int, smoke: bool, cpus: int, seed: int) -> TrialConfig:
    """The seed's baseline: its hand-written attention, eager; bf16 autocast on a GPU (as
    the seed), fp32 elsewhere (a CPU without bf16 units; XLA compilers cast themselves)."""
    measurement = MEASUREMENT["smoke" if smoke else "cpu" if platform == "cpu" else "accelerator"]
    extra = {"threads": cpus} if platform == "cpu" else {}
    # A GPU trial feeds it with loader processes (the seed used 12); a CPU's cores train.
    num_workers = max(0, cpus - 1) if platform == "cuda" else 0
    # CPU and the XLA CPU client use every core they are given: one trial owns the node.
    cpus_per_worker = cpus if platform in ("cpu", "xla", "cuda") else 1
    return TrialConfig.make(platform=platform, model=model, attention="naive", torch_compile="none",
                            batch_size=batch_size, num_workers=num_workers,
                            precision="bf16-autocast" if platform == "cuda" else "fp32",
                            cpus_per_worker=cpus_per_worker, seed=seed, **measurement, **extra)


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
        removed["torch_compile=inductor"] = "--smoke (an inductor compile takes 40 s or more on 2 cores)"
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
    default_cpus = min(8, os.cpu_count() or 1) if platform == "cuda" else os.cpu_count() or 1
    batch_size = args.batch_size or (BATCH_SIZES[model] if platform in ("cpu", "cuda") or args.smoke
                                     else min(XLA_BATCH_SIZE, BATCH_SIZES[model]))
    base = base_config(platform, model, batch_size, args.smoke,
                       args.cpus_per_worker or default_cpus, args.seed)
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
                        default_time_budget_s=None if platform != "cpu" or args.smoke else CPU_TIME_BUDGET_S),
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    return run_sweep(sweep)


if __name__ == "__main__":
    main_guard(main)

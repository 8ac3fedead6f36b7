"""Seed 003's CPU post as a sweep: ResNet training throughput on the host CPU, knob by knob.

    python sweeps/cpu_resnet.py                       # local default: ResNet-18 at 64x64, under 10 min on 2 cores
    python sweeps/cpu_resnet.py --smoke               # CI: ResNet-18 at 32x32, 4 short trials
    python sweeps/cpu_resnet.py --full --instance-type c7i.2xlarge --spot   # the seed's ResNet-50 at 224, spot
    python sweeps/cpu_resnet.py --dry-run             # the space, each trial's environment (LD_PRELOAD)

The seed's table (c7i.2xlarge, ResNet-50 at 224, batch 128; its samples/s): baseline, fp32
9.12; precision=bf16-autocast 24.34; channels_last=True 37.93; torch_compile=inductor +27%
without channels_last, slower with it; allocator=tcmalloc (run_cpu) 39.05; ipex.optimize 40.73
(not a knob: no IPEX pairs with this torch); workers=2 with numa_bind: no gain; priced at
$0.357/h on demand, $0.1291/h spot. Searched here too: batch_size, num_workers, threads. bf16
is offered only where the CPU does it natively, and each trial runs in a fresh process
started with its allocator, which it checks it got.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from accelsweep import (ConfigError, Objective, Sweep, TrialConfig, common_parser, cost_basis, import_path,
                        main_guard, plan_sweep, platform_from_args, run_sweep, sweep_options)
from accelsweep.trainables.fresh_process import fresh_process_trainable
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.cpu_resnet import CpuResNet

DEFAULT_SAMPLES = 16
CPU_TIME_BUDGET_S = 420  # stops starting trials in time for the default run to end within 10 minutes on 2 cores
SEED_INSTANCE = "c7i.2xlarge"
# The seed's spot quote (c7i.2xlarge, seed 003's CPU post); spot prices move by the hour.
SEED_SPOT_USD_PER_HOUR = {SEED_INSTANCE: 0.1291}
ALLOCATORS = ("glibc", "jemalloc", "tcmalloc")  # run_cpu's choices


def allocators_here(platform: str) -> list[str]:
    """The allocators a trial can get on this machine: those a config accepts (the platform
    looks for each library and refuses one it cannot find)."""
    found = []
    for name in ALLOCATORS:
        try:
            TrialConfig.make(platform=platform, workload=import_path(CpuResNet), allocator=name)
        except ConfigError:
            continue
        found.append(name)
    return found


# ---- the sweep -----------------------------------------------------------------------------------------
def presets(args) -> dict[str, Any]:
    """Model, image size, baseline batch and measurement of each run size."""
    if args.full:  # the seed's script: 10 steps skipped, 100 timed
        size = dict(model="resnet50", image_size=224, batch_size=128, warmup_steps=10, window_min_steps=30,
                    window_min_s=30.0, windows=3)
    elif args.smoke:
        size = dict(model="resnet18", image_size=32, batch_size=8, warmup_steps=2, window_min_steps=3,
                    window_min_s=0.25, windows=2)
    else:
        size = dict(model="resnet18", image_size=64, batch_size=32, warmup_steps=2, window_min_steps=3,
                    window_min_s=2.0, windows=3)
    return {**size, **{key: value for key, value in (("model", args.model), ("image_size", args.image_size))
                       if value is not None}}


def make_space(smoke: bool, full: bool, cpus: int, bf16: bool, allocators: list[str], nodes: int):
    batch_sizes = [4, 8, 16] if smoke else [32, 64, 128] if full else [16, 32, 64]

    def space(trial):
        trial.suggest_categorical("batch_size", batch_sizes)
        trial.suggest_categorical("num_workers", [0, 1] if smoke else [0, 1, 2])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast"] if bf16 else ["fp32"])
        trial.suggest_categorical("channels_last", [False, True])
        if not smoke:  # inductor compiles a ResNet for a minute or more on 2 cores: not in CI's run
            trial.suggest_categorical("torch_compile", ["none", "inductor", "max-autotune"])
        if nodes > 1 and not smoke and trial.suggest_categorical("workers", [1, nodes]) > 1:
            # One worker per NUMA node, pinned there; Ray Train's processes have glibc's malloc.
            per_node = cpus // nodes
            return {"cpus_per_worker": per_node, "threads": per_node, "numa_bind": True, "allocator": "glibc"}
        trial.suggest_categorical("threads", sorted({1, max(1, cpus // 2), cpus}))
        trial.suggest_categorical("allocator", allocators)
        return None

    return space


def main():
    parser = common_parser(__doc__.split("\n\n")[0], DEFAULT_SAMPLES)
    parser.add_argument("--full", action="store_true",
                        help="the seed's workload: ResNet-50 at 224x224, baseline batch 128 (hours on 2 cores)")
    parser.add_argument("--model", choices=CpuResNet.Knobs.__dataclass_fields__["model"].metadata["choices"],
                        default=None, help="the ResNet (default: resnet18; --full: resnet50)")
    parser.add_argument("--image-size", type=int, default=None, help="image side (default: 64; --smoke: 32; "
                                                                     "--full: 224)")
    parser.add_argument("--spot", action="store_true",
                        help="price at the seed's spot quote for --instance-type (" + ", ".join(
                            f"{k}: ${v}/h" for k, v in SEED_SPOT_USD_PER_HOUR.items()) + "; spot prices move: "
                        "--price-per-hour gives today's)")
    args = parser.parse_args()

    platform, platform_note = platform_from_args(args, supported=["cpu"], what="space in this study")
    if not get_platform(platform).sized_for_cpu:
        message = (f"cpu_resnet is a CPU study (seed 003's CPU post: allocator, threads, NUMA, bf16 on the host "
                   f"CPU); it has no {platform} space. For {platform}, see sweeps/neuron_vit.py.")
        if args.dry_run:
            print(message)
            return
        raise ConfigError("--platform", "cpu or auto", platform, message)
    basis, cost_note = spot_basis(args) if args.spot else cost_basis(args)
    cpus = os.cpu_count() or 1
    size = presets(args)
    base = TrialConfig.make(platform=platform, workload=import_path(CpuResNet), num_workers=0, precision="fp32",
                            cpus_per_worker=cpus, threads=cpus, allocator="glibc", seed=args.seed,
                            instance_type=args.instance_type if args.address else None, **size)
    # What this CPU does natively (bf16 or not) and its NUMA nodes, as the platform reads them.
    hardware = get_platform(platform).capabilities(base)
    emulated = hardware.emulated.get("precision", {})
    bf16 = hardware.known and "bf16-autocast" not in emulated
    bf16_reason = emulated.get("bf16-autocast") or hardware.describe()
    allocators, nodes = allocators_here(platform), int(hardware.facts.get("numa_nodes", 1))
    sweep = Sweep(
        name="cpu_resnet", trainable=fresh_process_trainable, base=base,
        space=make_space(args.smoke, args.full, cpus, bf16, allocators, nodes),
        objectives=[Objective("throughput_samples_per_s", "max")],
        cost=basis, cost_note=cost_note,
        platform_note=(f"{platform_note}; bf16: {'offered' if bf16 else 'not offered'} ({bf16_reason}); allocators "
                       f"found: {', '.join(allocators)}; NUMA nodes: {nodes}"
                       + ("" if nodes > 1 else " (workers across nodes not searched)")),
        **sweep_options(args, default_samples=4 if args.smoke else DEFAULT_SAMPLES,
                        default_time_budget_s=None if args.smoke or args.full else CPU_TIME_BUDGET_S),
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    return run_sweep(sweep)


def spot_basis(args):
    """The seed's spot price for --instance-type, as if given with --price-per-hour."""
    if args.instance_type not in SEED_SPOT_USD_PER_HOUR or args.price_per_hour is not None:
        raise ConfigError("--spot", f"with --instance-type {' or '.join(SEED_SPOT_USD_PER_HOUR)} and no "
                          "--price-per-hour", args.instance_type, "The seed quoted a spot price for that type only.")
    args.price_per_hour = SEED_SPOT_USD_PER_HOUR[args.instance_type]
    basis, _ = cost_basis(args)
    source = f"{args.instance_type} spot, seed 003's quote"
    return (dataclasses.replace(basis, source=source),
            f"price basis: {args.instance_type} at ${args.price_per_hour:g}/h ({source}; spot prices move)")


if __name__ == "__main__":
    main_guard(main)

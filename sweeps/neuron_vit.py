"""Seed 000 as a sweep: ViT training throughput, knob by knob, on whatever is present.

    python sweeps/neuron_vit.py                          # local default: CPU, under 10 min
    python sweeps/neuron_vit.py --smoke --num-samples 4  # tiny model, seconds per trial
    python sweeps/neuron_vit.py --dry-run --platform neuron --instance-type trn1.2xlarge
    python sweeps/neuron_vit.py --platform neuron-standin-cpu --instance-type trn1.32xlarge --address ...
                                # Neuron's placement, the CPU's loop: no Neuron figure (docs/cluster.md)
    ray up cluster.yaml && python sweeps/neuron_vit.py --address auto   # on trn1/inf2

The seed's hand-run table (inf2.xlarge, 2 NeuronCores, ViT-B/16 at 224), as knobs:

    experiment              knob                                   seed's samples/s
    baseline                batch 16/core, 0 loader workers, fp32  251.98
    multi-process loading   num_workers=1                          253.56
    batch size              batch_size=8                           265.68
    PyTorch AMP             precision=bf16-autocast                196.64
    bf16 (was XLA_USE_BF16) precision=bf16                         394.51
    MpDeviceLoader          batches_per_execution=10               1027.39
    compiler                neuron_model_type=transformer,
                            neuron_optlevel=3, --target inf2       1093.25
    fp8                     neuron_auto_cast=all, fp8_e4m3          940.36

On a machine with no accelerator the same study runs on the CPU with a ViT sized for
it, searching the CPU post's knobs (threads, channels_last, torch.compile) instead of
the Neuron compiler's. The seed's figures above are the seed's; nothing here has run
on a NeuronCore (see README: "What was verified where").
"""

from __future__ import annotations

import functools
import os

from accelsweep import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import (at_least_one, common_parser, cost_basis, main_guard, platform_from_args,
                                          sweep_options)
from accelsweep.sweeps.driver.run.neuron_precompile import check_precompile, describe_plan, first_proposals, run_precompile
from accelsweep.sweeps.driver.define.measurement_flags import add_measurement_flags, with_measurement_flags
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import TRAINING_METRICS
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.neuron import neuron_target_for_instance
from accelsweep.trainables.platforms.neuron_standin import STANDIN_NAME
from accelsweep.trainables.trainable import train_trainable

DEFAULT_SAMPLES = 24
# The verdict is confirmed: the baseline and the search's best configs measured again, in
# turns on a CPU (sweeps/driver/run/confirm.py), within the time budget.
CONFIRM_ROUNDS = 3
# With Ray's start and the summary, the local default run ends within 4 minutes: ahead of a
# plain Ray Tune script on the same knobs (benchmarks/vs_plain_tune.py, issue 37), whose
# 24 trials took 281-413 s here: at 225 s the tool's 231 s was 0.82x the fastest of them.
CPU_TIME_BUDGET_S = 195
# inductor compiled vit-tiny in 19-44 s on 2-core EPYC VMs: one compile past this is stuck, not slow
CPU_MAX_COMPILE_S = 120


def batch_sizes(platform: str, smoke: bool) -> list[int]:
    if smoke:
        return [8, 16, 32]
    if platform == "cuda":  # one GPU, not a NeuronCore: the seed's 16 and up
        return [16, 32, 64, 128]
    return [8, 16, 32, 64] if platform == "cpu" else [4, 8, 16, 32]


# On a GPU: the precisions, compile modes and attention kernels searched. An SDPA backend
# forced (kernels/attention) needs 16-bit inputs for flash and cuDNN: with fp32 the trial
# keeps timm's own SDPA (the dispatcher's choice). The space is the same on every GPU; a
# GPU that lacks one (sm < 80: bf16, flash, cuDNN) refuses those trials before they start.
CUDA_PRECISIONS = ["fp32", "bf16-autocast", "fp16-autocast", "bf16"]
CUDA_COMPILE = ["none", "inductor", "max-autotune", "reduce-overhead"]
CUDA_ATTENTIONS = ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"]


def worker_choices(instance_type) -> list[int]:
    """Data-parallel workers (one NeuronCore each): powers of two up to the cores of the
    instance type (2 when it is unknown, the smallest trn1/inf2)."""
    cores = int(PRICE_TABLE[instance_type].units().get("neuron_cores", 2)) if instance_type in PRICE_TABLE else 2
    return [n for n in (1, 2, 4, 8, 16, 32) if n <= cores]


def make_space(platform: str, smoke: bool, cpus: int, instance_type=None, nan_capture: bool = False,
               instance_types=None):
    """``instance_types``: CPU node types searched too; a trial owns the node it draws (its
    CPUs, as threads), so threads are not searched then."""
    def space(trial):
        owned = None
        trial.suggest_categorical("batch_size", batch_sizes(platform, smoke))
        trial.suggest_categorical("num_workers", [0, 1, 2])
        precision = trial.suggest_categorical("precision", CUDA_PRECISIONS if platform == "cuda"
                                              else ["fp32", "bf16-autocast", "bf16"])
        trial.suggest_categorical("patch_embed", ["conv", "linear"])
        if platform == "cuda":
            trial.suggest_categorical("channels_last", [False, True])
            trial.suggest_categorical("torch_compile", CUDA_COMPILE)
            if precision == "fp32":
                return {"attention": "sdpa"}
            trial.suggest_categorical("attention", CUDA_ATTENTIONS)
        if platform == "cpu" and instance_types:
            node_cpus = PRICE_TABLE[trial.suggest_categorical("instance_type", list(instance_types))].vcpus
            owned = {"cpus_per_worker": node_cpus, "threads": node_cpus}
        elif platform == "cpu":
            trial.suggest_categorical("threads", sorted({1, max(1, cpus // 2), cpus}))
            trial.suggest_categorical("channels_last", [False, True])
            if not smoke:  # inductor compiles for 40 s or more on 2 cores: not for smoke runs
                trial.suggest_categorical("torch_compile", ["none", "inductor"])
        if platform in ("xla", "neuron"):
            trial.suggest_categorical("batches_per_execution", [1, 4, 10])
        if platform in ("neuron", STANDIN_NAME):
            if not nan_capture:  # a capture replays one worker's step: it needs workers=1
                trial.suggest_categorical("workers", worker_choices(instance_type))
        if platform == "neuron":
            trial.suggest_categorical("neuron_model_type", ["generic", "transformer"])
            trial.suggest_categorical("neuron_optlevel", [1, 2, 3])
            if precision != "fp32":  # torch decides the casts; the compiler must not (NeuronPlatform)
                return {"neuron_auto_cast": None, "neuron_auto_cast_type": None}
            if trial.suggest_categorical("neuron_auto_cast", ["none", "matmult", "all"]) == "none":
                return {"neuron_auto_cast_type": None}
            trial.suggest_categorical("neuron_auto_cast_type", ["bf16", "fp8_e4m3"])
        return owned

    return space


def searched_instance_types(text: str, args, platform: str) -> tuple[str, ...]:
    """--instance-types, checked before anything starts: CPU types of the price table, on
    a cluster, for the cpu platform, with no other price basis given."""
    types = tuple(t.strip() for t in text.split(",") if t.strip())
    cpu_types = [t for t, price in PRICE_TABLE.items() if not price.accelerators and not t.startswith("m7i")]
    for kind in types:
        if kind not in cpu_types:
            raise ConfigError("--instance-types", f"CPU instance types of the price table ({', '.join(cpu_types)}), "
                                                  "comma-separated", kind)
    if len(types) < 2 or len(set(types)) != len(types):
        raise ConfigError("--instance-types", "two or more different instance types, comma-separated", text)
    if not args.address:
        raise ConfigError("--instance-types", "given with --address (a cluster that has those node types)", text,
                          "Locally there is one machine: its type is not a choice.")
    if platform != "cpu" or args.instance_type or args.price_per_hour is not None:
        raise ConfigError("--instance-types", "with --platform cpu and neither --instance-type nor --price-per-hour "
                          "(each trial is priced by its own type from the price table)", text)
    return types


def base_config(platform: str, smoke: bool, cpus: int, instance_type, seed: int,
                compile_cache=None, pin_instance_type=None, nan_capture: bool = False) -> TrialConfig:
    """The seed's baseline: batch 16 per core, no loader workers, fp32, conv patch embed.
    ``pin_instance_type``: on a cluster, the node type trials must run on (the one named
    by --instance-type, which prices the sweep); locally there is one node, nothing to pin.
    ``nan_capture``: every trial saves the step of its first non-finite gradient."""
    if smoke or platform == STANDIN_NAME:  # the stand-in shows placement: its speed means nothing
        model, measurement = "vit-micro", dict(warmup_steps=2, window_min_steps=3, window_min_s=0.25, windows=2)
    elif platform == "cpu":
        model, measurement = "vit-tiny", dict(warmup_steps=3, window_min_steps=5, window_min_s=2.0, windows=3)
    else:
        model, measurement = "vit-b16", dict(warmup_steps=10, window_min_steps=20, window_min_s=10.0, windows=3)
    extra = {}
    if platform == "cpu":
        extra["threads"] = cpus
    if platform == "neuron":
        # The compiler's own defaults, spelled out so the baseline is a point of the space.
        extra.update(neuron_target=neuron_target_for_instance(instance_type), neuron_model_type="generic",
                     neuron_optlevel=2, neuron_auto_cast="matmult", neuron_auto_cast_type="bf16")
    if pin_instance_type:
        extra["instance_type"] = pin_instance_type
    if compile_cache:  # every platform's compiler caches there (trainables/loop/compile_cache.py)
        extra["compile_cache"] = compile_cache
    # CPU and the XLA CPU client use every core they are given: one trial owns the node.
    cpus_per_worker = cpus if platform in ("cpu", "xla") else 1
    return TrialConfig.make(platform=platform, model=model, batch_size=16, num_workers=0, precision="fp32",
                            cpus_per_worker=cpus_per_worker, seed=seed, nan_capture=nan_capture, **measurement,
                            **extra)


def main():
    parser = common_parser(__doc__.split("\n\n")[0], DEFAULT_SAMPLES, default_confirm_rounds=CONFIRM_ROUNDS)
    parser.add_argument("--cpus-per-worker", type=at_least_one, default=None,
                        help="CPUs each trial holds (default: cpu platform: all of the node's, i.e. "
                             "--instance-type's on a cluster, else this machine's; else 1)")
    parser.add_argument("--compile-cache", default=None,
                        help="where every trial's compiler caches what it builds, shared by trials and sweeps: "
                             "inductor's caches on cpu/cuda, torch-xla's on xla, Neuron's on neuron (a directory "
                             "every node sees, or s3:// on Neuron; off: none; default: $ACCELSWEEP_COMPILE_CACHE, "
                             "else ~/.cache/accelsweep/compile)")
    parser.add_argument("--nan-capture", action="store_true",
                        help="on a non-finite gradient, save the step (weights, optimizer, batch, RNG) with the "
                             "trial and end it as nan; replay: python -m accelsweep.trainables.loop.nan_replay FILE")
    parser.add_argument("--precompile", type=int, default=0, metavar="N",
                        help="neuron: before the first trial, compile the first N configs the search will propose "
                             "with neuron_parallel_compile into --compile-cache (at most TPE's start-up count)")
    parser.add_argument("--instance-types", default=None, metavar="TYPE,TYPE",
                        help="on a cluster (--address), search the node type too (cpu platform, types of the price "
                             "table, e.g. c7i.xlarge,c7i.2xlarge): each trial runs on, owns and is priced by the type "
                             "it draws; the sweep ranks throughput and $ per 1M samples together (their Pareto front)")
    add_measurement_flags(parser)
    args = parser.parse_args()

    platform, platform_note = platform_from_args(args)
    instance_types = searched_instance_types(args.instance_types, args, platform) if args.instance_types else None
    if instance_types:  # the first type pins the baseline and names the price table's basis
        args.instance_type = instance_types[0]
    if args.address and platform in ("neuron", STANDIN_NAME) and not args.instance_type:
        # On a cluster the driver's own instance (the head) is not where trials run: the
        # compiler target, the price and the node type the autoscaler starts all come from this.
        raise ConfigError("--instance-type", "the Neuron node type to sweep on the cluster (one of "
                          + ", ".join(t for t in PRICE_TABLE if neuron_target_for_instance(t)) + ")", None)
    check_precompile(platform, args.precompile, args.compile_cache)
    # A trial owns its node's CPUs: on a cluster the node the instance type names (the
    # driver's own machine is the head, not where trials run), else this machine.
    on_node_type = args.address and args.instance_type in PRICE_TABLE
    cpus = args.cpus_per_worker or (PRICE_TABLE[args.instance_type].vcpus if on_node_type else os.cpu_count()) or 1
    basis, cost_note = cost_basis(args)
    if instance_types:
        cost_note = (f"price basis: each trial at its node type's price ({', '.join(instance_types)}), "
                     f"price table {basis.source.removeprefix('price table ')}")
    instance_type = args.instance_type or (basis and basis.instance_type)
    sweep = Sweep(
        name="neuron_vit",
        trainable=train_trainable,
        base=with_measurement_flags(base_config(platform, args.smoke, cpus, instance_type, args.seed,
                                                args.compile_cache,
                                                pin_instance_type=args.instance_type if args.address else None,
                                                nan_capture=args.nan_capture), args),
        space=make_space(platform, args.smoke, cpus, instance_type, nan_capture=args.nan_capture,
                         instance_types=instance_types),
        objectives=[Objective("throughput_samples_per_s", "max"),
                    *([Objective("usd_per_1m_samples", "min")] if instance_types else [])],
        metrics=TRAINING_METRICS,
        cost=basis, cost_note=cost_note, platform_note=platform_note,
        before_trials=functools.partial(precompile, count=args.precompile, basis=basis) if args.precompile else None,
        **sweep_options(args, default_samples=4 if args.smoke else DEFAULT_SAMPLES,
                        default_time_budget_s=CPU_TIME_BUDGET_S if platform == "cpu" and not args.smoke else None,
                        default_max_compile_s=CPU_MAX_COMPILE_S if platform == "cpu" else None),
    )
    if args.dry_run:
        plan = plan_sweep(sweep)
        print(plan.describe())
        if args.precompile:
            print("\n".join(describe_plan(plan.config_for, first_proposals(plan, args.precompile))))
        return
    return run_sweep(sweep)


def precompile(plan, count: int, basis) -> dict[str, float]:
    """Seed 002's ahead-of-time compile, before any trial (run_sweep runs it once Ray is
    connected); its time and cost are reported apart from the trials' (parent run
    metrics precompile_*)."""
    proposals = first_proposals(plan, count)
    print("\n".join(describe_plan(plan.config_for, proposals)), flush=True)
    results = run_precompile(plan.config_for, proposals)
    cost = 0.0
    for result in results:
        outcome = "compiled" if result.returncode == 0 else f"FAILED (exit {result.returncode}): {result.output_tail}"
        print(f"  precompile {result.searched}: {result.seconds:.1f} s, {outcome}", flush=True)
        if basis is not None:
            config = plan.config_for(result.searched)
            cost += basis.hourly_rate(get_platform(config.platform).worker_resources(config)) * result.seconds / 3600
    return {"precompile_configs": len(results), "precompile_failures": sum(r.returncode != 0 for r in results),
            "precompile_s": sum(r.seconds for r in results),
            "precompile_cost_usd": cost if basis is not None else float("nan")}


if __name__ == "__main__":
    main_guard(main)

"""Seed 000 as a sweep: ViT training throughput, knob by knob, on whatever is present.

    python sweeps/neuron_vit.py                          # local default: CPU, under 10 min
    python sweeps/neuron_vit.py --smoke --num-samples 4  # tiny model, seconds per trial
    python sweeps/neuron_vit.py --dry-run --platform neuron --instance-type trn1.2xlarge
    ray up cluster.yaml && python sweeps/neuron_vit.py --address auto   # on trn1/inf2

The seed's table (inf2.xlarge, ViT-B/16 at 224; its samples/s) as knobs: baseline (batch 16
per core, fp32, no loader workers) 251.98; num_workers=1 253.56; batch_size=8 265.68;
precision=bf16-autocast 196.64; precision=bf16 394.51; batches_per_execution=10 1027.39;
neuron_model_type=transformer, neuron_optlevel=3 1093.25; neuron_auto_cast=all with
neuron_auto_cast_type=fp8_e4m3 940.36. What each platform searches and starts from is its
own (trainables/platforms/, ``Platform.study_*``): on a CPU, the CPU post's knobs.
"""

from __future__ import annotations

import argparse
import functools
import os

from accelsweep import (ConfigError, Objective, Sweep, TRAINING_METRICS, TrialConfig, common_parser, cost_basis,
                        main_guard, plan_sweep, platform_from_args, run_sweep, sweep_options, train_trainable)
from accelsweep.sweeps.driver.define.cli import at_least_one, at_least_zero
from accelsweep.sweeps.driver.define.measurement_flags import add_measurement_flags, with_measurement_flags
from accelsweep.sweeps.driver.run.neuron_precompile import (check_precompile, describe_plan, first_proposals,
                                                            run_precompile)
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.base import TrainingStudy

DEFAULT_SAMPLES = 24
# The verdict is confirmed: the baseline and the search's best configs measured again, in
# turns on a CPU (sweeps/driver/run/confirm.py), within the time budget.
CONFIRM_ROUNDS = 3
# The local default run's budget for starting trials: with Ray's start and the summary it ends
# within 4 minutes, and within 0.75x the wall time of a plain Ray Tune script on the same knobs
# (benchmarks/vs_plain_tune.py): 0.75x the shortest plain wall recorded on this host kind
# (benchmarks/results/host_rules.md), less the few seconds a run ends past its budget (the
# last trial's end, the summary); its growth over the earlier budget is the confirmation's
# rounds (run/confirm.py; docs/budget.md).
CPU_TIME_BUDGET_S = 210
# About three times the longest inductor compile of vit-tiny on 2 cores: one compile past this is stuck.
CPU_MAX_COMPILE_S = 120
SMOKE_BATCH_SIZES = [8, 16, 32]


def batch_sizes(platform: str, smoke: bool) -> list[int]:
    return SMOKE_BATCH_SIZES if smoke else list(get_platform(platform).study_batch_sizes)


def make_space(platform: str, smoke: bool, cpus: int, instance_type=None, nan_capture: bool = False,
               instance_types=None, resident: bool = False):
    """The seed's knobs, then the platform's own (``Platform.study_space``). ``instance_types``:
    CPU node types searched too; a trial owns the node it draws (its CPUs, as threads).
    ``resident``: batches kept on the device (--resident-batches): no loader to search."""
    study = TrainingStudy(smoke=smoke, cpus=cpus, instance_type=instance_type, nan_capture=nan_capture,
                          instance_types=tuple(instance_types or ()))

    def space(trial):
        trial.suggest_categorical("batch_size", batch_sizes(platform, smoke))
        if not resident:
            trial.suggest_categorical("num_workers", [0, 1, 2])
        precision = trial.suggest_categorical("precision", list(get_platform(platform).precisions))
        trial.suggest_categorical("patch_embed", ["conv", "linear"])
        return get_platform(platform).study_space(trial, precision, study)

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
    if not get_platform(platform).sized_for_cpu or args.instance_type or args.price_per_hour is not None:
        raise ConfigError("--instance-types", "with --platform cpu and neither --instance-type nor --price-per-hour "
                          "(each trial is priced by its own type from the price table)", text)
    return types


def base_config(platform: str, smoke: bool, cpus: int, instance_type, seed: int,
                compile_cache=None, pin_instance_type=None, nan_capture: bool = False) -> TrialConfig:
    """The seed's baseline: batch 16 per core, no loader workers, fp32, conv patch embed; the
    model, windows and CPUs the platform gives it (``Platform.study_model``, ``study_baseline``).
    ``pin_instance_type``: on a cluster, the node type trials must run on (the one named
    by --instance-type, which prices the sweep); locally there is one node, nothing to pin.
    ``nan_capture``: every trial saves the step of its first non-finite gradient."""
    study = TrainingStudy(smoke=smoke, cpus=cpus, instance_type=instance_type, nan_capture=nan_capture)
    here = get_platform(platform)
    own = {**here.study_model(study), **here.study_baseline(study)}
    if pin_instance_type:
        own["instance_type"] = pin_instance_type
    if compile_cache:  # every platform's compiler caches there (trainables/compile_cache.py)
        own["compile_cache"] = compile_cache
    return TrialConfig.make(platform=platform, batch_size=16, num_workers=0, precision="fp32", seed=seed,
                            nan_capture=nan_capture, **own)


def parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--resident-batches", type=at_least_zero, default=0, metavar="N",
                        help="keep the loader's first N batches on the device and cycle through them: each config's "
                             "own ceiling, apart from its input pipeline (num_workers leaves the space; cpu and cuda "
                             "platforms); compare with the same sweep without it (default: 0, the loader every step)")
    add_measurement_flags(parser)
    return parser


def build_sweep(args: argparse.Namespace) -> Sweep:
    """The sweep the flags ask for, every input checked before anything starts."""
    platform, platform_note = platform_from_args(args)
    sized_for_cpu = get_platform(platform).sized_for_cpu
    instance_types = searched_instance_types(args.instance_types, args, platform) if args.instance_types else None
    if instance_types:  # the first type pins the baseline and names the price table's basis
        args.instance_type = instance_types[0]
    if args.address:
        get_platform(platform).check_cluster_node_type(args.instance_type)
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
    return Sweep(
        name="neuron_vit",
        trainable=train_trainable,
        base=with_measurement_flags(base_config(platform, args.smoke, cpus, instance_type, args.seed,
                                                args.compile_cache,
                                                pin_instance_type=args.instance_type if args.address else None,
                                                nan_capture=args.nan_capture), args).replace(
            resident_batches=args.resident_batches),
        space=make_space(platform, args.smoke, cpus, instance_type, nan_capture=args.nan_capture,
                         instance_types=instance_types, resident=bool(args.resident_batches)),
        objectives=[Objective("throughput_samples_per_s", "max"),
                    *([Objective("usd_per_1m_samples", "min")] if instance_types else [])],
        metrics=TRAINING_METRICS,
        cost=basis, cost_note=cost_note, platform_note=platform_note,
        # Past the space's edge where the host's best may lie beyond it; not in a smoke run,
        # whose toy space (a micro model's batches 8-32) says nothing of the host.
        past_edge=not args.smoke,
        before_trials=functools.partial(precompile, count=args.precompile, basis=basis) if args.precompile else None,
        **sweep_options(args, default_samples=4 if args.smoke else DEFAULT_SAMPLES,
                        default_time_budget_s=CPU_TIME_BUDGET_S if sized_for_cpu and not args.smoke else None,
                        default_max_compile_s=CPU_MAX_COMPILE_S if sized_for_cpu else None),
    )


def main():
    args = parser().parse_args()
    sweep = build_sweep(args)
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

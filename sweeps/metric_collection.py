"""Seed 003's metric-collection study as a sweep: what per-step TorchMetrics costs, naive and fixed.

    python sweeps/metric_collection.py                       # local default: CPU, 7 trials, under 10 min
    python sweeps/metric_collection.py --smoke               # tiny images, seconds per trial
    python sweeps/metric_collection.py --dry-run --platform cuda

The seed (NVIDIA A40, ResNet-18 on random 224x224 images, batch 128, TorchMetrics 1.6.1: a
MeanMetric of the loss and multiclass Accuracy, Precision, Recall and F1 updated every step)
found the naive updates "nearly 10%" slower, with "eight" cudaStreamSynchronize a step, and
each fix (knob ``metrics_mode``: explicit-weights, no-nan-check, tensor-updates,
host-placement, all-fixes) won time back until, together, they matched the baseline
(``none``). The grid runs each mode once, then prints and logs each trial's throughput cost
against ``none`` and its mode's would-be syncs a step (trainables/workloads/metric_collection.py).
"""

from __future__ import annotations

import os

from accelsweep import (Objective, Sweep, TrialConfig, common_parser, import_path, main_guard, mlflow_client,
                        plan_sweep, platform_from_args, run_sweep, sweep_options, train_trainable)
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.metric_collection import (COMPUTE_EVERY, MODES, NUM_CLASSES, MetricCollection,
                                                               count_syncs)

CPU_TIME_BUDGET_S = 540  # the local default run stays under 10 minutes on 2 cores, however slow the machine
# As Ray's workers import it.
WORKLOAD = import_path(MetricCollection)


def base_config(platform: str, smoke: bool, cpus: int, seed: int) -> TrialConfig:
    """The baseline: no metrics. The seed's ResNet-18 on 224x224 images, batch 128; on a CPU a
    small CNN on 16x16 images, whose steps of a few ms leave the metrics' host work (about a
    millisecond a step) a share that shows through a shared machine's noise, with one intra-op
    thread (tiny ops gain nothing from a second)."""
    on_cpu = get_platform(platform).sized_for_cpu
    if smoke:
        sizes = dict(network="small-cnn", image_size=16, batch_size=8, warmup_steps=2, window_min_steps=5,
                     window_min_s=0.5, windows=2)
    elif on_cpu:
        sizes = dict(network="small-cnn", image_size=16, batch_size=32, warmup_steps=5, window_min_steps=50,
                     window_min_s=10.0, windows=3)
    else:  # the seed's; windows long enough to hold its compute() every 100 steps
        sizes = dict(network="resnet18", image_size=224, batch_size=128, warmup_steps=10, window_min_steps=100,
                     window_min_s=10.0, windows=3, num_workers=4)
    extra = {"threads": 1, "cpus_per_worker": cpus} if on_cpu else {}
    return TrialConfig.make(platform=platform, workload=WORKLOAD, metrics_mode="none",
                            seed=seed, **sizes, **extra)


def report_costs(result, syncs: dict[str, dict[str, float]]) -> str:
    """Each trial's throughput against the no-metrics baseline, and its mode's would-be
    syncs per step; both also logged on the trial's MLflow run."""
    metric = "throughput_samples_per_s"
    baseline = result.baseline.metric(metric) if result.baseline else float("nan")
    client = mlflow_client(result.tracking_uri)
    lines = [f"{'metrics_mode':<18}{'samples/s':>11}{'cost vs none':>14}{'would-be syncs/step':>21}"]
    for record in sorted(result.records, key=lambda r: MODES.index(r.config["metrics_mode"])):
        mode, value = record.config["metrics_mode"], record.metric(metric)
        cost = 1 - value / baseline
        figures = {"throughput_cost_vs_baseline": cost, "would_be_syncs_per_step": syncs[mode]["total"]}
        if record.run_id:
            for name, figure in figures.items():
                if figure == figure:  # not NaN (a failed trial, or no baseline)
                    client.log_metric(record.run_id, name, figure)
        shown = "baseline" if record.is_baseline else f"{cost:+.1%}" if cost == cost else record.status
        lines.append(f"{mode:<18}{value:>11.1f}{shown:>14}{syncs[mode]['total']:>21g}")
    lines.append("cost: the share of the no-metrics trial's throughput lost (negative: faster); syncs: counted "
                 "on this CPU (what would wait for an accelerator)")
    return "\n".join(lines)


def main():
    parser = common_parser(__doc__.split("\n\n")[0], len(MODES))
    args = parser.parse_args()
    platform, note = platform_from_args(args)
    cpus = os.cpu_count() or 1
    sweep = Sweep(name="metric_collection", trainable=train_trainable, platform_note=note,
                  base=base_config(platform, args.smoke, cpus, args.seed),
                  space=lambda trial: {"metrics_mode": trial.suggest_categorical("metrics_mode", list(MODES))},
                  objectives=[Objective("throughput_samples_per_s", "max")],
                  # Every mode once, each measured to the end: a grid, no early stopping.
                  **sweep_options(args, default_samples=len(MODES), sampler="grid", scheduler="none",
                                  default_time_budget_s=CPU_TIME_BUDGET_S
                                  if get_platform(platform).sized_for_cpu and not args.smoke else None))
    syncs = {mode: count_syncs(mode) for mode in MODES}
    if args.dry_run:
        base = sweep.base
        print(plan_sweep(sweep).describe())
        print(f"\nevery trial: {base.workload_knobs.network} on {base.workload_knobs.image_size}x"
              f"{base.workload_knobs.image_size} random images, batch {base.batch_size}, {NUM_CLASSES} classes; "
              f"metrics computed and reset every {COMPUTE_EVERY} steps")
        print("would-be syncs per step (counted on this CPU): "
              + ", ".join(f"{mode} {counts['total']:g}" for mode, counts in syncs.items()))
        print(f"on {platform}: each costs {get_platform(platform).host_read_cost}")
        return
    result = run_sweep(sweep)
    print("\nThroughput cost of each way of collecting metrics, against none (seed 003):\n"
          + report_costs(result, syncs))
    return result


if __name__ == "__main__":
    main_guard(main)

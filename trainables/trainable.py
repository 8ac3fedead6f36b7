"""Ray Tune trainables: a trial's searched values + the sweep's base config -> one
validated config -> the loop, reporting to Tune after every window.

    tune.with_parameters(train_trainable, base=base_config.to_dict(), cost=basis)

A trial with ``workers > 1`` builds a Ray Train TorchTrainer inside the Tune trial (the
Ray 2.60 pattern: Train V2 does not accept a Trainer as a Tune trainable). Its workers
hold the resources; rank 0's report, already global, reaches Tune through
TuneReportCallback.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import CostBasis
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.metrics import MetricSet, training_metrics
from accelsweep.trainables.placement import reporting_node, this_node
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.base import load_workload

__all__ = ["train_trainable", "metrics_of"]


def train_trainable(searched: Mapping[str, Any], base: Mapping[str, Any],
                    cost: Optional[CostBasis] = None) -> None:
    from ray import tune

    config = TrialConfig.from_dict({**base, **searched})
    if config.workers == 1:
        report, usd_per_hour = priced_where_it_runs(tune.report, config, cost)
        run_training(config, report=report, usd_per_hour=usd_per_hour)
    else:
        run_workers(config, cost)


def priced_where_it_runs(report, config: TrialConfig, cost: Optional[CostBasis]):
    """``report`` adding the node this process runs on to each result, and what the
    trial's resources cost per hour there: at the price of the node's own type (a sweep
    whose trials land on several types prices each by its own), with the basis said."""
    node = this_node()
    platform = get_platform(config.platform)
    basis = cost.on(node.get("node_type") or None) if cost is not None else None
    if basis is not None and not platform.unpriced_because:
        node = {**node, "cost_basis": basis.describe(platform.resources(config))}
    elif cost is not None and basis is None:
        node = {**node, "cost_basis": f"unpriced: {cost.source} prices {cost.instance_type or 'this machine'}, "
                                      f"and this trial ran on {node.get('node_type')}"}
    return reporting_node(report, node), platform.usd_per_hour(basis, config)


def metrics_of(base: TrialConfig) -> MetricSet:
    """What ``train_trainable`` reports for ``base``'s workload: its unit's throughput,
    and the figures the workload declares."""
    workload = load_workload(base.workload)
    declared = training_metrics(workload.unit)
    return dataclasses.replace(declared, metrics=declared.metrics + tuple(workload.metrics))


# The driver reads a trainable's declared metrics here (Sweep.metrics when not given),
# whether it applies the sweep's rejection rule and compile limit (the loop reads them),
train_trainable.metrics = metrics_of
train_trainable.reads_trial_limits = True
# ... and whether its windows can be measured in turns with other trials' (trainables/turns.py).
train_trainable.takes_turns = True


def run_workers(config: TrialConfig, cost: Optional[CostBasis]) -> None:
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    platform = get_platform(config.platform)
    context = ray.tune.get_context()
    storage = context.get_storage()  # the sweep's storage: Train's run lands beside the trial
    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"config": config.to_dict(), "cost": cost},
        scaling_config=ray.train.ScalingConfig(num_workers=config.workers,
                                               resources_per_worker=platform.worker_resources(config),
                                               placement_strategy=config.placement_strategy),
        torch_config=platform.train_backend(config),
        run_config=ray.train.RunConfig(name=f"{context.get_trial_name()}-workers",
                                       storage_path=storage.storage_fs_path,
                                       storage_filesystem=storage.storage_filesystem,
                                       callbacks=[TuneReportCallback()]),
    )
    trainer.fit()


def _worker_loop(loop_config: Mapping[str, Any]) -> None:
    import ray.train

    # Every worker reports each window (Ray Train expects all ranks to); rank 0's
    # result, which already sums all workers, is the one Tune receives.
    config = TrialConfig.from_dict(loop_config["config"])
    report, usd_per_hour = priced_where_it_runs(ray.train.report, config, loop_config["cost"])
    run_training(config, report=report, usd_per_hour=usd_per_hour)

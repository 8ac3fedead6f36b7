"""A sweep on a two-node Ray cluster started on this machine (head + one worker node),
whose worker node is killed while a trial runs on it. Run by tests/test_node_loss.py in
a process of its own (it owns its Ray cluster):

    python -m tests.node_loss_sweep <tracking_uri> <marker_dir>
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from accelsweep.trainables.config import DictConfig

WINDOWS = 4


@dataclass(frozen=True)
class SlowConfig(DictConfig):
    platform: str = "cpu"
    x: int = 0
    cpus_per_worker: int = 1
    workers: int = 1
    instance_type: Optional[str] = None
    windows: int = WINDOWS


def slow_trainable(searched, base, cost=None):
    """Four one-second windows; leaves a marker naming the node each attempt ran on."""
    import ray
    from ray import tune

    node = ray.get_runtime_context().get_node_id()
    trial = tune.get_context().get_trial_id()
    open(os.path.join(os.environ["NODE_LOSS_MARKERS"], f"{trial}.{node}.{time.time_ns()}"), "w").close()
    for window in range(1, WINDOWS + 1):
        time.sleep(1.0)
        tune.report({"throughput_samples_per_s": 10.0 + searched["x"], "windows_done": window, "loop_s": window})


def kill_when_a_trial_runs_on(cluster, node, marker_dir: str, killed: list) -> None:
    while not killed:
        if any(name.split(".")[1] == node.node_id for name in os.listdir(marker_dir)):
            time.sleep(1.5)  # mid-trial, not at its first instruction
            cluster.remove_node(node, allow_graceful=False)
            killed.append(time.time())
            print(f"killed worker node {node.node_id}", flush=True)
            return
        time.sleep(0.1)


def main(tracking_uri: str, marker_dir: str) -> None:
    import ray
    import ray.cloudpickle
    from ray.cluster_utils import Cluster

    from accelsweep import Objective, Sweep, run_sweep
    from accelsweep.trainables.metrics import TRAINING_METRICS

    os.environ["NODE_LOSS_MARKERS"] = marker_dir  # nodes started below inherit it
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    killed: list = []
    threading.Thread(target=kill_when_a_trial_runs_on, args=(cluster, worker, marker_dir, killed),
                     daemon=True).start()
    result = run_sweep(Sweep(
        name="node_loss", trainable=slow_trainable, base=SlowConfig(),
        space=lambda trial: {"x": trial.suggest_categorical("x", [0, 1, 2, 3])},
        objectives=[Objective("throughput_samples_per_s", "max")], metrics=TRAINING_METRICS, num_samples=4,
        sampler="grid",
        scheduler="none", tracking_uri=tracking_uri, retries=2, max_concurrent_trials=2))
    print(f"node killed: {bool(killed)}; statuses: {sorted(r.status for r in result.records)}", flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

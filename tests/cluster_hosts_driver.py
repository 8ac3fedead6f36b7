"""Drivers that tests/test_cluster_hosts.py runs inside the head's network namespace of a
hosts cluster (sweeps/driver/ops/cluster_hosts.py): Ray attaches a driver to the raylet of
its own host, and the head is the driver's host, as on a real cluster. Each prints one
JSON line last.

    ip netns exec asw-head python -m tests.cluster_hosts_driver nodes <head address> <host> ...
    ip netns exec asw-head python -m tests.cluster_hosts_driver dp <head address> <tracking uri> <storage> [PACK]
    ip netns exec asw-head python -m tests.cluster_hosts_driver jobs <head address>
"""

from __future__ import annotations

import json
import logging
import os
import sys

BATCH_SIZE = 8  # per worker

def where_am_i() -> dict:
    """This process's node address and network namespace (the inode of its netns file:
    the kernel's own name for the namespace it runs in)."""
    import ray

    return {"address": ray.util.get_node_ip_address(), "netns_inode": os.stat("/proc/self/ns/net").st_ino}


def nodes(head_address: str, worker_hosts: list[str]) -> dict:
    """The alive nodes, and where one task asked for each worker host's resource ran."""
    import ray

    ray.init(address=head_address, logging_level=logging.ERROR, log_to_driver=False)
    alive = [{"address": node["NodeManagerAddress"], "resources": node["Resources"]}
             for node in ray.nodes() if node["Alive"]]
    probe = ray.remote(num_cpus=1)(where_am_i)
    placed = {host: probe.options(resources={f"host:{host}": 0.01}).remote() for host in worker_hosts}
    landed = {host: ray.get(ref, timeout=60) for host, ref in placed.items()}
    return {"alive": alive, "landed": landed, "driver": where_am_i()}


def data_parallel(head_address: str, tracking_uri: str, storage: str, placement: str = "STRICT_SPREAD") -> dict:
    """One trial of the CPU training loop with two workers, DDP over gloo; STRICT_SPREAD puts
    one on each worker host. The smallest model and measurement of tests/test_workers.py."""
    from accelsweep import Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.trainable import train_trainable

    lines: list[str] = []
    result = run_sweep(Sweep(
        name="hosts_dp", trainable=train_trainable,
        base=TrialConfig.make(model="vit-micro", workers=2, cpus_per_worker=1, batch_size=BATCH_SIZE, warmup_steps=2,
                              window_min_steps=3, window_min_s=0.3, windows=2, placement_strategy=placement),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [BATCH_SIZE])},
        num_samples=1, scheduler="none", tracking_uri=tracking_uri, storage_path=storage, address=head_address,
        print_line=lines.append,
    ))
    (record,) = result.records
    return {"status": record.status, "error": record.error, "batch_size": BATCH_SIZE,
            "result": {key: value for key, value in record.result.items() if isinstance(value, (int, float, str))},
            "lines": lines}


def jobs(head_address: str) -> dict:
    """The cluster's job table, every field of every entry (what `ray list jobs` and the
    dashboard show), as text."""
    import ray
    import ray._private.state as state

    ray.init(address=head_address, logging_level=logging.ERROR, log_to_driver=False)
    table = state.state.job_table()
    return {"jobs": len(table), "text": json.dumps(table, default=repr)}


def main(argv: list[str]) -> None:
    command, head_address, *rest = argv
    if command == "nodes":
        found = nodes(head_address, rest)
    elif command == "dp":
        found = data_parallel(head_address, *rest)
    elif command == "jobs":
        found = jobs(head_address)
    else:
        raise SystemExit(f"unknown command {command!r}: nodes, dp or jobs")
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

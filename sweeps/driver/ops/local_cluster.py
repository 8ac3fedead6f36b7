"""Try the cluster path on one machine: Ray's own autoscaler launching cluster.yaml's
node types on demand, each node a set of processes here.

    accelsweep cluster up                    # a head on 127.0.0.1:6379, no worker nodes
    accelsweep run neuron_vit --address auto --platform cpu --instance-type c7i.2xlarge
    accelsweep cluster status                # the nodes up now, by type
    accelsweep cluster down                  # every process of it stopped

The autoscaler is Ray's, unchanged; only its node provider is the fake multi-node one Ray
ships for testing (local_node_provider.py): where the AWS provider would boot an EC2
instance, it starts a raylet here with the resources that instance would report
(placement.node_resources), for cluster.yaml's node types (read here, so the two cannot drift).
What it does not show: boot and setup time, memory limits, and speed: every node shares
this machine's cores, so a trial's throughput here says nothing of that instance type's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.run.local_ray import instance_processes, stop_processes
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.peaks import cache_file
from accelsweep.trainables.placement import node_resources, node_type_of
from accelsweep.trainables.processes import command_line, process_table

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 6379
DEFAULT_IDLE_TIMEOUT_S = 60.0  # cluster.yaml says 10 minutes: too long to watch on a laptop
PROVIDER = "accelsweep.sweeps.driver.ops.local_node_provider.LocalNodeProvider"  # Ray's fake one, nodes set up
HEAD_TYPE = "ray.head.default"  # the fake provider tags its head with this type name
START_TIMEOUT_S = 60.0
# The environment of every process of the cluster (the autoscaler passes it to the nodes).
CLUSTER_ENV = {"RAY_FAKE_CLUSTER": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAY_USAGE_STATS_ENABLED": "0"}


def repository_cluster_yaml() -> str:
    """cluster.yaml at the repository root (this file is sweeps/driver/ops/local_cluster.py)."""
    return str(Path(__file__).resolve().parents[3] / "cluster.yaml")


def autoscaling_config(cluster: Mapping[str, Any], port: int, idle_timeout_s: float) -> dict[str, Any]:
    """The fake provider's autoscaling config for ``cluster`` (cluster.yaml, loaded): its
    worker types with their nodes' resources, its caps and upscaling speed; nodes scale
    from zero and go after ``idle_timeout_s`` idle."""
    types = {}
    for name, node_type in cluster["available_node_types"].items():
        if name == cluster["head_node_type"]:
            continue
        instance_type = node_type["node_config"]["InstanceType"]
        types[name] = {"resources": node_resources(instance_type, node_type.get("resources") or {}),
                       "node_config": {}, "min_workers": 0, "max_workers": node_type.get("max_workers", 0)}
    types[HEAD_TYPE] = {"resources": {}, "node_config": {}, "max_workers": 0}
    nothing: dict[str, Any] = {key: [] for key in (
        "initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
        "head_start_ray_commands", "worker_start_ray_commands", "cluster_synced_files", "rsync_exclude",
        "rsync_filter")}
    return {"cluster_name": f"{cluster['cluster_name']}-local", "max_workers": cluster["max_workers"],
            "upscaling_speed": cluster.get("upscaling_speed", 1.0), "idle_timeout_minutes": idle_timeout_s / 60,
            "provider": {"type": "external", "module": PROVIDER, "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": f"{LOOPBACK}:{port}"},
            "auth": {"ssh_user": "ubuntu"}, "available_node_types": types, "head_node_type": HEAD_TYPE,
            "file_mounts": {}, "file_mounts_sync_continuously": False, **nothing}


def head_cpus(cluster: Mapping[str, Any]) -> int:
    head = cluster["available_node_types"][cluster["head_node_type"]]
    return PRICE_TABLE[head["node_config"]["InstanceType"]].vcpus


def config_path(port: int) -> str:
    return cache_file(f"local-cluster-{port}.json")


def previous_address_path(port: int) -> str:
    """The address recorded before ``up`` on ``port``, which ``down`` puts back."""
    return config_path(port) + ".previous-address"


def session_path(port: int) -> str:
    """The session folder of the cluster ``up`` started on ``port``: how ``down`` finds what
    is left of it once its GCS, which names it otherwise, is gone."""
    return config_path(port) + ".session"


def write_files(port: int, config: Mapping[str, Any], previous: Optional[str]) -> None:
    """The cluster's files in the user's cache (made if this is its first use): its
    autoscaler's config, and the address ``down`` puts back."""
    os.makedirs(os.path.dirname(config_path(port)), exist_ok=True)
    with open(config_path(port), "w") as config_file:
        json.dump(config, config_file, indent=1)
    with open(previous_address_path(port), "w") as previous_file:
        previous_file.write(previous or "")


def ray_command() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


@dataclass(frozen=True)
class LocalCluster:
    port: int
    session_dir: str

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


def up(cluster_yaml: Optional[str] = None, port: int = DEFAULT_PORT,
       idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, record_address: bool = True,
       node_timeout_s: Optional[float] = None) -> LocalCluster:
    """Start the head (Ray's GCS, a raylet with the head type's CPUs, the autoscaler with
    the fake provider) on 127.0.0.1:``port``; no worker node until a task asks for one.
    ``record_address``: make it the cluster ``--address auto`` (and a bare ``ray.init()``)
    joins, as ``ray start`` does; ``down`` puts back the one recorded before.
    ``node_timeout_s``: how long a node may miss heartbeats before the autoscaler replaces
    it (Ray's AUTOSCALER_HEARTBEAT_TIMEOUT_S; default Ray's 30 s).

    Everything binds 127.0.0.1. Ray turns a loopback address into the machine's interface
    address unless its "no clusters" switch is set (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``):
    the cluster's processes get it here, and a sweep's driver sets it itself for a loopback
    address (ray_adapter.keep_loopback)."""
    import yaml

    path = cluster_yaml or repository_cluster_yaml()
    with open(path) as cluster_file:
        cluster = yaml.safe_load(cluster_file)
    if find(port) is not None:
        raise ConfigError("port", "a port no Ray cluster of this machine uses", port,
                          f"A cluster is up there already (accelsweep cluster down --port {port} stops it).")
    previous = _recorded_address()
    write_files(port, autoscaling_config(cluster, port, idle_timeout_s), previous)
    command = [ray_command(), "start", "--head", f"--node-ip-address={LOOPBACK}", f"--port={port}",
               f"--autoscaling-config={config_path(port)}", f"--num-cpus={head_cpus(cluster)}", "--num-gpus=0",
               "--dashboard-host=127.0.0.1", "--disable-usage-stats"]
    env = {**os.environ, **CLUSTER_ENV}
    if node_timeout_s is not None:
        env["AUTOSCALER_HEARTBEAT_TIMEOUT_S"] = str(max(1, round(node_timeout_s)))  # Ray reads an integer
    try:
        started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        running = find(port)
        if started.returncode != 0 or running is None:
            raise RuntimeError(f"`{' '.join(command)}` failed (exit {started.returncode}):\n{started.stderr[-2000:]}")
        with open(session_path(port), "w") as session_file:
            session_file.write(running.session_dir)
        if not record_address:
            _record_address(previous)
        return running
    except BaseException:
        # Whatever of it did start (a `ray start` that timed out half-way, a step after it
        # that raised, a Ctrl-C) would hold the port and Ray's recorded address with no one
        # to stop it. The port was free a moment ago, so a GCS on it now is this one's, its
        # autoscaler up or not (`find` asks for both).
        _stop_session(_gcs_session(port))
        _forget(port, ours=True)
        raise


def _address_file() -> str:
    from ray._private.utils import get_ray_address_file

    return get_ray_address_file(None)


def _recorded_address() -> Optional[str]:
    """The cluster a bare ``ray.init()`` (and ``--address auto``) joins: the last ``ray
    start`` of this machine, as Ray recorded it."""
    try:
        with open(_address_file()) as address_file:
            return address_file.read().strip() or None
    except OSError:
        return None


def _record_address(address: Optional[str]) -> None:
    if address:
        with open(_address_file(), "w") as address_file:
            address_file.write(address)
    elif os.path.exists(_address_file()):
        os.remove(_address_file())


def find(port: int) -> Optional[LocalCluster]:
    """The cluster whose GCS serves ``port`` here, if it is one ``up`` started (its
    autoscaler reads this port's config); None when there is none."""
    session_dir = _gcs_session(port)
    if session_dir is None:
        return None
    ours = any(f"--autoscaling-config={config_path(port)}" in (command_line(pid) or ())
               for pid in process_table(include_zombies=False))
    if not ours:
        raise ConfigError("port", "the port of a cluster `accelsweep cluster up` started", port,
                          f"The Ray cluster there ({session_dir}) is someone else's: it is not stopped here.")
    return LocalCluster(port, session_dir)


def _gcs_session(port: int) -> Optional[str]:
    """The session folder of the Ray GCS serving ``port`` here, whoever started it."""
    for pid in process_table(include_zombies=False):
        args = command_line(pid) or []
        if args and os.path.basename(args[0]) == "gcs_server" and f"--gcs_server_port={port}" in args:
            logs = next((a.split("=", 1)[1] for a in args if a.startswith("--log_dir=")), "")
            if logs:
                return os.path.dirname(logs.rstrip("/"))
    return None


def down(port: int = DEFAULT_PORT) -> int:
    """Stop every process of the cluster on ``port`` (head, autoscaler, fake nodes, their
    workers: the processes of its session, the fake nodes being the autoscaler's children)
    and nothing else; how many there were. Never ``ray stop``: it stops every Ray process
    of the machine."""
    cluster = find(port)
    # Its GCS gone (killed, the OOM killer), its raylets, autoscaler and workers may outlive
    # it for a while: the session ``up`` recorded names them.
    stopped = _stop_session(cluster.session_dir if cluster is not None else _recorded_session(port))
    _forget(port, ours=cluster is not None)
    return stopped


def _recorded_session(port: int) -> Optional[str]:
    try:
        with open(session_path(port)) as session_file:
            return session_file.read().strip() or None
    except OSError:
        return None


def _stop_session(session_dir: Optional[str]) -> int:
    """Stop the processes of a Ray session (None: none); how many there were."""
    pids = instance_processes(session_dir) if session_dir else []
    stop_processes(pids)
    return len(pids)


def _forget(port: int, ours: bool) -> None:
    """Put back the address recorded before ``up`` on ``port`` and remove the cluster's
    files. ``ours``: a cluster of ``up`` was found there; else only a cluster that left its
    files (one that crashed, or an ``up`` that failed) is forgotten."""
    previous_path = previous_address_path(port)
    if not ours and not os.path.exists(previous_path):
        return  # never ours: a `ray start` of someone else's may have recorded this address
    if _recorded_address() == f"{LOOPBACK}:{port}":  # else someone's `ray start` came since: theirs
        try:
            with open(previous_path) as previous_file:
                _record_address(previous_file.read().strip() or None)
        except OSError:
            _record_address(None)
    # Its autoscaler's config and the address to put back are its own: no other cluster
    # reads them, and each port's would otherwise stay in the user's cache for good.
    for leftover in (config_path(port), previous_path, session_path(port)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)


def nodes_by_type() -> dict[str, int]:
    """The cluster's live nodes, counted by node type (the ``instance_type:`` marker of
    each; "head" for the one without)."""
    import ray

    counts: dict[str, int] = {}
    for node in ray.nodes():
        if node["Alive"]:
            kind = node_type_of(node["Resources"]) or "head"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def wait_for(condition, timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accelsweep cluster",
        description="A local cluster that behaves like cluster.yaml's: Ray's autoscaler with its fake provider "
                    "launches the node types on demand, as processes on this machine (127.0.0.1).")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the head's GCS port (default 6379)")
    parser.add_argument("--cluster-yaml", default=None, help="the node types to mirror (default: cluster.yaml)")
    parser.add_argument("--idle-timeout-s", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="a worker node idle this long is stopped (default 60; cluster.yaml's is 10 minutes)")
    parser.add_argument("--node-timeout-s", type=float, default=None,
                        help="a node that misses heartbeats this long is replaced (default: Ray's 30)")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            cluster = up(args.cluster_yaml, args.port, args.idle_timeout_s, node_timeout_s=args.node_timeout_s)
            print(f"local cluster up at {cluster.address} (session {cluster.session_dir}); no worker nodes yet.\n"
                  f"node types (cluster.yaml): {describe_types(args.port)}\n"
                  f"run a sweep on it:  accelsweep run neuron_vit --address auto --platform cpu "
                  f"--instance-type c7i.2xlarge\nstop it:            accelsweep cluster down"
                  + (f" --port {args.port}" if args.port != DEFAULT_PORT else ""))
        elif args.action == "down":
            left_files = os.path.exists(config_path(args.port))
            stopped = down(args.port)
            print(f"stopped {stopped} processes of the local cluster on port {args.port}" if stopped
                  else f"no local cluster running on port {args.port}; removed the files of one that stopped "
                       f"on its own" if left_files else f"no local cluster on port {args.port}")
        else:
            cluster = find(args.port)
            if cluster is None:
                print(f"no local cluster on port {args.port}")
                return 1
            print(f"local cluster at {cluster.address}: {status_line(cluster)}")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def describe_types(port: int) -> str:
    with open(config_path(port)) as config_file:
        types = json.load(config_file)["available_node_types"]
    return "; ".join(f"{name} {_short(spec['resources'])} x{spec['max_workers']}"
                     for name, spec in types.items() if name != HEAD_TYPE)


def _short(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def status_line(cluster: LocalCluster) -> str:
    """Its live nodes by type, asked of its GCS from a short-lived process (a driver
    connected here would stay in the cluster's job table)."""
    code = ("import json, ray; from accelsweep.sweeps.driver.ops.local_cluster import nodes_by_type; "
            f"ray.init(address={cluster.address!r}, logging_level='ERROR'); print(json.dumps(nodes_by_type()))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **CLUSTER_ENV},
                          capture_output=True, text=True, timeout=START_TIMEOUT_S)
    answer = [line for line in done.stdout.splitlines() if line.startswith("{")]  # Ray may print around it
    if done.returncode != 0 or not answer:
        return f"could not ask it ({done.stderr.strip().splitlines()[-1:]})"
    counts = json.loads(answer[-1])
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))


if __name__ == "__main__":
    sys.exit(main())

"""Several hosts on one machine (sweeps/driver/ops/cluster_hosts.py): a head and two worker
hosts, each in its own network namespace with its own address, Ray token auth on. One
cluster for the module; its drivers run in the head's namespace (tests/cluster_hosts_driver.py).

Checks that work crosses hosts over their real interfaces (never 127.0.0.1): the nodes and
a task per worker host; a two-worker data-parallel trial with one worker per host (gloo
between the namespaces); and that nothing of the cluster is left after it goes down.
Root and ``ip netns`` are needed; without them the module skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelsweep.sweeps.driver.ops import cluster_hosts
from accelsweep.trainables.processes import stat_of
from tests.conftest import REPO

UNAVAILABLE = cluster_hosts.unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")]

NODES_TIMEOUT_S = 90
TRIAL_TIMEOUT_S = 300  # one trial: Tune, a TorchTrainer and two workers importing torch, on 2 busy cores
USER_TOKEN = os.path.expanduser("~/.ray/auth_token")


def file_state(path: str):
    """What a later check compares: the file's size, mtime and content, or None when absent."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as file:
        return os.stat(path).st_size, os.stat(path).st_mtime_ns, file.read()


@pytest.fixture(scope="module")
def user_token_before():
    """The user's own Ray token file as it was before the cluster (the cluster has its own)."""
    return file_state(USER_TOKEN)


@pytest.fixture(scope="module")
def cluster(user_token_before):
    """The module's cluster; ``test_nothing_is_left_after_down`` takes it down and checks,
    and the finaliser takes down whatever is left however the module ended."""
    try:
        yield cluster_hosts.up(workers=2, worker_cpus=2, print_line=lambda line: None)
    finally:
        cluster_hosts.down()


def run_driver(cluster, *args: str, timeout: float) -> dict:
    """tests/cluster_hosts_driver.py in the head's namespace, with the cluster's token; its JSON line."""
    done = cluster.run(cluster.head.name, [sys.executable, "-m", "tests.cluster_hosts_driver", *args],
                       env=cluster.driver_env, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_three_hosts_with_their_own_addresses_and_a_task_on_each_worker_host(cluster):
    found = run_driver(cluster, "nodes", cluster.head_address, *(host.name for host in cluster.workers),
                       timeout=NODES_TIMEOUT_S)
    addresses = sorted(node["address"] for node in found["alive"])
    assert addresses == sorted(host.address for host in cluster.hosts)
    assert len(set(addresses)) == 3 and not any(address.startswith("127.") for address in addresses)
    for node in found["alive"]:  # each node declares the resource naming its host
        host = next(host for host in cluster.hosts if host.address == node["address"])
        assert node["resources"].get(host.resource) == 1
    for host in cluster.workers:
        landed = found["landed"][host.name]
        assert landed["address"] == host.address
        # The kernel's word for it: the task's process ran in that host's network namespace.
        assert landed["netns_inode"] == os.stat(f"/run/netns/{host.name}").st_ino
    assert found["driver"]["netns_inode"] == os.stat(f"/run/netns/{cluster.head.name}").st_ino


@pytest.mark.alone  # the ranks' speeds must match: another test's load on one rank's core skews the ratio
def test_a_two_worker_trial_runs_one_rank_per_host_over_gloo(cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    found = run_driver(cluster, "dp", cluster.head_address, uri, str(tmp_path / "ray"), timeout=TRIAL_TIMEOUT_S)
    assert found["status"] == "finished", found["error"] + "\n".join(found["lines"])
    result = found["result"]
    assert result["workers"] == 2 and result["workers_reporting"] == 2  # both ranks' counts were summed
    ranks = result["worker_nodes"].split(",")
    assert sorted(ranks) == sorted(host.address for host in cluster.workers)  # one rank on each worker host
    # Global throughput: both ranks' samples over the slower rank's time, so about twice
    # rank 0's own rate (its steps and seconds); one rank's count alone would be about 1x.
    rank0_rate = result["measured_steps"] * found["batch_size"] / result["measured_s"]
    assert 1.3 < result["throughput_samples_per_s"] / rank0_rate < 3.0, (result["throughput_samples_per_s"],
                                                                         rank0_rate)
    from tests.test_sweep_e2e import mlflow_runs

    _, (trial,) = mlflow_runs(uri, "hosts_dp")
    assert trial.data.tags["worker_nodes"] == result["worker_nodes"]
    assert trial.data.params["placement_strategy"] == "STRICT_SPREAD"
    assert trial.data.metrics["workers_reporting"] == 2


SWEEP_TIMEOUT_S = 420  # two smoke sweeps taking turns at two slots, on 2 busy cores


def start_sweep(cluster, name: str, tmp_path, samples: int) -> subprocess.Popen:
    """The main job (--smoke, CPU trials of 2 CPUs) as a user on the head starts it."""
    argv = [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--platform", "cpu", "--address", cluster.head_address,
            "--num-samples", str(samples), "--scheduler", "none", "--no-reject", "--confirm-rounds", "0",
            "--tracking-uri", f"sqlite:///{tmp_path}/{name}.db", "--storage-path", str(tmp_path / name)]
    return subprocess.Popen(cluster.command(cluster.head.name, argv), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**cluster_hosts._clean_env(), **cluster.driver_env})


def trial_starts(tracking_uri: str) -> list[float]:
    """When each trial of the store's sweep started (its MLflow run), in order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=100)
    return sorted(r.info.start_time / 1000 for r in runs  # not a repeated proposal answered from a result
                  if "trial_number" in r.data.tags and r.data.tags.get("status") != "reused")


def test_two_sweeps_on_one_cluster_take_turns_at_its_slots(cluster, tmp_path):
    """The first sweep, alone, takes both slots (2 CPUs a trial, two 2-CPU hosts); the second
    starts once the first has measured a trial. Each trial's process used to be kept for its
    sweep's next trial, so the first kept both slots to its end and the second waited for
    it: now the second's first trial starts before the first's last (fair_share.py)."""
    first = start_sweep(cluster, "first", tmp_path, samples=6)
    lines: list[str] = []
    for line in first.stdout:  # the first sweep's first result: it holds the slots now
        lines.append(line)
        if line.startswith("[trial 1/") and "->" in line:
            break
    second = start_sweep(cluster, "second", tmp_path, samples=3)
    try:
        second_out, _ = second.communicate(timeout=SWEEP_TIMEOUT_S)
        first_out = "".join(lines) + first.communicate(timeout=SWEEP_TIMEOUT_S)[0]
    finally:
        for process in (first, second):
            process.kill()
    assert first.returncode == 0, first_out[-3000:]
    assert second.returncode == 0, second_out[-3000:]
    firsts, seconds = trial_starts(f"sqlite:///{tmp_path}/first.db"), trial_starts(f"sqlite:///{tmp_path}/second.db")
    assert len(firsts) >= 5 and len(seconds) >= 2, (firsts, seconds)  # TPE may repeat a config: answered, not run
    assert seconds[0] < firsts[-1], ("the second sweep waited for the whole first one", firsts, seconds)
    assert "sharing the cluster with 1 other sweep(s)" in second_out, second_out[-3000:]


def test_a_second_up_is_refused_and_leaves_the_first_alone(cluster):
    with pytest.raises(cluster_hosts.HostsUnavailable, match="exist already .* run `python -m "
                                                             "accelsweep.sweeps.driver.ops.cluster_hosts down` first"):
        cluster_hosts.up()
    assert cluster_hosts.existing_namespaces() == sorted(host.name for host in cluster.hosts)
    assert all(cluster.processes().values())
    assert os.path.exists(cluster.token_path)


def test_nothing_is_left_after_down(cluster, user_token_before):
    pids = {pid: stat_of(pid) for pid in cluster_hosts.cluster_processes()}
    assert pids, "the cluster had no processes to stop"
    listening = {socket for sockets in cluster.listening.values() for socket in sockets}
    assert f"*:{cluster_hosts.GCS_PORT}" in listening or f"{cluster.head.address}:{cluster_hosts.GCS_PORT}" in listening

    cluster_hosts.down()

    assert cluster_hosts.existing_namespaces() == []
    assert not [line for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                .splitlines() if line.startswith(cluster_hosts.PREFIX)]
    assert cluster_hosts.existing_links() == []
    # A process of the cluster is gone, or a zombie its new parent has not reaped yet (it
    # holds no socket and runs nothing); a pid reused meanwhile has another start time.
    alive = [pid for pid, before in pids.items()
             if (now := stat_of(pid)) is not None and now.started == before.started and now.state != "Z"]
    assert alive == []
    # Nothing listens on the cluster's addresses: the namespaces (and their sockets) are
    # gone, and no socket of the root namespace took one of their addresses.
    root = subprocess.run(["ss", "-H", "-l", "-t", "-n"], capture_output=True, text=True).stdout
    assert not [line for line in root.splitlines() if "10.77.0." in line]
    assert subprocess.run(["ip", "route", "show", cluster_hosts.SUBNET], capture_output=True, text=True).stdout == ""
    assert not cluster_hosts.head_reachable(timeout=1.0)  # the bridge's address is gone: nothing to send from
    assert not os.path.exists(cluster.state_dir)
    assert file_state(USER_TOKEN) == user_token_before  # the user's ~/.ray token never touched


def test_down_cleans_up_after_a_crashed_up():
    """What an ``up`` killed halfway leaves (a namespace with a process in it, the bridge, a
    veth, its state directory) is found by name and removed; a second down finds nothing."""
    assert cluster_hosts.existing_namespaces() == []  # the module's cluster is down already
    name = f"{cluster_hosts.PREFIX}w1"
    state_dir = os.path.join("/tmp", f"{cluster_hosts.PREFIX}cluster-crashed")
    try:
        for args in (["netns", "add", name], ["link", "add", cluster_hosts.BRIDGE, "type", "bridge"],
                     ["link", "add", f"{name}-r", "type", "veth", "peer", "name", f"{name}-n"]):
            subprocess.run(["ip", *args], check=True, timeout=30)
        os.makedirs(state_dir)
        open(os.path.join(state_dir, cluster_hosts.STATE_FILE), "w").close()
        inside = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
        lines = cluster_hosts.down()
        assert inside.wait(timeout=30) != 0  # stopped by down
        assert any("stopped 1 process" in line for line in lines), lines
        assert cluster_hosts.existing_namespaces() == [] and cluster_hosts.existing_links() == []
        assert not os.path.exists(state_dir)
        assert cluster_hosts.down() == ["nothing of a hosts cluster was here"]
    finally:
        cluster_hosts.down()

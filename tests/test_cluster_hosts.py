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
import signal
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


# A window of a sweep that must outlast another user's start: under the parallel test lane a
# second driver took 27 s to place its first trial, and 2 s windows let six trials end first.
LONG_WINDOW_S = 5.0


def start_sweep(cluster, name: str, tmp_path, samples: int, tracking_uri: str = "",
                window_s: float = 0.0) -> subprocess.Popen:
    """The main job (--smoke, CPU trials of 2 CPUs) as a user on the head starts it.
    ``window_s``: each measured window at least this long (0: the smoke run's own), so that
    a sweep still runs when another user's starts, however fast this host trains."""
    argv = [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--platform", "cpu", "--address", cluster.head_address,
            "--num-samples", str(samples), "--scheduler", "none", "--no-reject", "--confirm-rounds", "0",
            "--tracking-uri", tracking_uri or f"sqlite:///{tmp_path}/{name}.db", "--storage-path", str(tmp_path / name)]
    argv += ["--window-s", str(window_s)] if window_s else []
    return subprocess.Popen(cluster.command(cluster.head.name, argv), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**cluster_hosts._clean_env(), **cluster.driver_env})


def sweep_runs(tracking_uri: str) -> list:
    """Every MLflow run of the store: the sweep's parent and its trials."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, max_results=100)


def trial_starts(tracking_uri: str) -> list[float]:
    """When each trial of the store's sweep started (its MLflow run), in order."""
    return sorted(r.info.start_time / 1000 for r in sweep_runs(tracking_uri)  # not a repeated proposal answered
                  if "trial_number" in r.data.tags and r.data.tags.get("status") != "reused")  # from a result


def read_until(process: subprocess.Popen, lines: list[str], done) -> None:
    """The process's output lines into ``lines`` until one satisfies ``done``."""
    for line in process.stdout:
        lines.append(line)
        if done(line):
            return
    raise AssertionError("the sweep ended first:\n" + "".join(lines)[-3000:])


def test_two_sweeps_on_one_cluster_take_turns_at_its_slots(cluster, tmp_path):
    """The first sweep, alone, takes both slots (2 CPUs a trial, two 2-CPU hosts); the second
    starts once the first has measured a trial. Each trial's process used to be kept for its
    sweep's next trial, so the first kept both slots to its end and the second waited for
    it: now the second's first trial starts before the first's last (fair_share.py)."""
    # Long windows: the first sweep's trials outlast the second's start (on a fast host its
    # smoke trials, a second each, ended before the second sweep placed one).
    first = start_sweep(cluster, "first", tmp_path, samples=8, window_s=LONG_WINDOW_S)
    lines: list[str] = []
    read_until(first, lines, first_result)  # the first sweep's first result: it holds the slots now
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


def first_result(line: str) -> bool:
    return line.startswith("[trial 1/") and "->" in line


PASSWORD = "Hunter2" + "OnTheCluster"  # split: no process's own text names it


def test_one_drivers_ctrl_c_ends_only_its_sweep_and_no_node_holds_the_others_password(cluster, tmp_path):
    """Two users' sweeps on one cluster; the second records to an MLflow server on another
    host (the machine's bridge address) with a password in its --tracking-uri. Ctrl-C of the
    first, while both have trials, ends only the first (exit 130, nothing of it left
    running); the second measures every trial. Meanwhile neither the cluster's job table nor
    any process on any of its hosts holds the password (the second's driver aside: its
    command line is the user's own)."""
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path, host=cluster_hosts.BRIDGE_ADDRESS).start()
    stopped = start_sweep(cluster, "stopped", tmp_path, samples=8, window_s=LONG_WINDOW_S)  # running at the Ctrl-C
    kept = None
    try:
        stopped_lines: list[str] = []
        read_until(stopped, stopped_lines, first_result)
        kept = start_sweep(cluster, "kept", tmp_path, samples=3,
                           tracking_uri=server.uri.replace("http://", f"http://alice:{PASSWORD}@"))
        kept_lines: list[str] = []
        read_until(kept, kept_lines, first_result)  # both sweeps have trials on the cluster now
        stopped.send_signal(signal.SIGINT)  # a terminal's Ctrl-C, to the driver (no group: see stop_signals.py)
        stopped_out = "".join(stopped_lines) + stopped.communicate(timeout=120)[0]
        assert stopped.returncode == 130, stopped_out[-3000:]

        jobs = run_driver(cluster, "jobs", cluster.head_address, timeout=NODES_TIMEOUT_S)
        assert jobs["jobs"] >= 3 and "neuron_vit.py" in jobs["text"]  # both drivers' entries (and this one)
        assert PASSWORD not in jobs["text"]
        ray_processes = {}
        for host, pids in cluster.processes().items():
            seen = []
            for pid in set(pids) - {kept.pid}:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as env:
                        command, environ = cmdline.read().decode(errors="replace"), env.read().decode(errors="replace")
                except OSError:
                    continue  # ended meanwhile
                assert PASSWORD not in command + environ, (host, command.replace("\0", " ")[:300])
                seen.append(command)
            ray_processes[host] = sum("ray" in command for command in seen)
        assert all(ray_processes.values()) and len(ray_processes) == 3, ray_processes  # every host was scanned

        kept_out = "".join(kept_lines) + kept.communicate(timeout=SWEEP_TIMEOUT_S)[0]
    finally:
        for process in (stopped, kept):
            if process is not None:
                process.kill()
        server.stop()
    assert kept.returncode == 0, kept_out[-3000:]
    assert PASSWORD not in kept_out
    kept_runs = sweep_runs(server.backend_store_uri)
    kept_trials = [r for r in kept_runs if "trial_number" in r.data.tags]
    assert len(kept_trials) == 3 and all(r.info.status == "FINISHED" for r in kept_runs), [
        (r.info.run_name, r.info.status, r.data.tags.get("status")) for r in kept_runs]
    assert sum(r.data.tags.get("status") == "finished" for r in kept_trials) >= 2  # TPE may repeat one: answered
    stopped_runs = sweep_runs(f"sqlite:///{tmp_path}/stopped.db")
    assert not [r for r in stopped_runs if r.info.status == "RUNNING"], "the stopped sweep left a run open"
    assert [r.info.status for r in stopped_runs if "trial_number" not in r.data.tags] == ["KILLED"]


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

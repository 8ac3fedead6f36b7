"""The cluster path on one machine: Ray's own autoscaler, with its fake provider, launching
cluster.yaml's node types as sweeps ask for them (sweeps/driver/ops/local_cluster.py).

One cluster for the module, on a free loopback port, idle nodes stopped after a few
seconds. What is checked is the cluster's behaviour (which node type starts, where
trials land, how they are priced, nodes going back to zero, nothing left after `down`),
never a speed: every fake node shares this machine's two cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
import yaml

from accelsweep.sweeps.driver.ops import local_cluster
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.processes import process_table
from tests.conftest import ACCELSWEEP
from tests.mlflow_server import free_port

IDLE_TIMEOUT_S = 5.0
SWEEP_TIMEOUT_S = 240


def test_the_node_types_are_cluster_yamls_with_the_resources_aws_nodes_report():
    with open(local_cluster.repository_cluster_yaml()) as cluster_file:
        cluster = yaml.safe_load(cluster_file)
    config = local_cluster.autoscaling_config(cluster, 6390, idle_timeout_s=30)
    types = config["available_node_types"]
    workers = {name for name in cluster["available_node_types"] if name != cluster["head_node_type"]}
    assert set(types) == workers | {local_cluster.HEAD_TYPE}
    assert all(types[name]["min_workers"] == 0 and types[name]["max_workers"] ==
               cluster["available_node_types"][name]["max_workers"] for name in workers)
    # Ray's Neuron map counts the cores, as on AWS; the price table agrees with it.
    assert types["trn1-32xlarge"]["resources"] == {"CPU": 128, "neuron_cores": 32, "instance_type:trn1.32xlarge": 1,
                                                   "accelerator_type:aws-neuron-core": 1}
    assert types["c7i-2xlarge"]["resources"] == {"CPU": 8, "instance_type:c7i.2xlarge": 1}
    for name in workers:
        resources = types[name]["resources"]
        instance_type = cluster["available_node_types"][name]["node_config"]["InstanceType"]
        assert resources.get("neuron_cores", 0) == PRICE_TABLE[instance_type].accelerators.get("neuron_cores", 0)
    assert config["provider"]["gcs_address"] == "127.0.0.1:6390" and config["idle_timeout_minutes"] == 0.5


def test_a_gpu_type_gets_rays_gpu_count_and_accelerator_type():
    assert local_cluster.node_resources("g5.xlarge", {"instance_type:g5.xlarge": 1}) == {
        "CPU": 4, "GPU": 1, "accelerator_type:A10G": 1, "instance_type:g5.xlarge": 1}


def test_a_type_the_instance_table_lacks_is_refused_by_name():
    with pytest.raises(Exception, match="InstanceType must be one of .*got 'm5.large'"):
        local_cluster.node_resources("m5.large", {})


def test_the_clusters_files_are_written_where_the_cache_does_not_exist_yet(tmp_path, monkeypatch):
    """A fresh machine's first command can be `accelsweep cluster up`: no folder in the
    user's cache yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "never-used"))
    local_cluster.write_files(6390, {"cluster_name": "accelsweep-local"}, "127.0.0.1:6379")
    with open(local_cluster.config_path(6390)) as written:
        assert json.load(written) == {"cluster_name": "accelsweep-local"}
    with open(local_cluster.previous_address_path(6390)) as written:
        assert written.read() == "127.0.0.1:6379"
    assert local_cluster.config_path(6390).startswith(str(tmp_path / "never-used"))


def _files(port: int) -> list[str]:
    return [path for path in (local_cluster.config_path(port), local_cluster.previous_address_path(port),
                              local_cluster.session_path(port)) if os.path.exists(path)]


def test_an_up_stopped_after_ray_started_leaves_nothing_running(monkeypatch):
    """A Ctrl-C (or any error) after `ray start` succeeded: the half-started cluster would
    hold the port and Ray's recorded address with no `up` to answer for it."""
    port = free_port()
    before = local_cluster._recorded_address()
    started_find = local_cluster.find

    def interrupted_once_it_runs(asked_port):
        running = started_find(asked_port)
        if running is not None:
            raise KeyboardInterrupt
        return running

    monkeypatch.setattr(local_cluster, "find", interrupted_once_it_runs)
    with pytest.raises(KeyboardInterrupt):
        local_cluster.up(port=port)  # recording its address, as `accelsweep cluster up` does
    monkeypatch.undo()
    assert local_cluster._gcs_session(port) is None and not _listening(port)
    assert local_cluster._recorded_address() == before
    assert not _files(port)


def test_down_after_a_crash_puts_the_address_back_and_removes_the_files(tmp_path, monkeypatch, capsys):
    """Its processes gone (killed, the machine's OOM killer): `down` finds no cluster on
    the port, and still owes the user the address and the cache it took."""
    monkeypatch.setattr(local_cluster, "_address_file", lambda: str(tmp_path / "ray_current_cluster"))
    port = free_port()
    local_cluster.write_files(port, {"cluster_name": "accelsweep-local"}, "10.0.0.7:6379")
    local_cluster._record_address(f"127.0.0.1:{port}")  # what its `ray start` recorded
    assert local_cluster.main(["down", "--port", str(port)]) == 0
    assert "removed the files of one that stopped on its own" in capsys.readouterr().out
    assert local_cluster._recorded_address() == "10.0.0.7:6379"
    assert not _files(port)
    # A recorded loopback address with no files of ours is someone else's `ray start`.
    local_cluster._record_address(f"127.0.0.1:{port}")
    local_cluster.down(port)
    assert local_cluster._recorded_address() == f"127.0.0.1:{port}"


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def cluster():
    port = free_port()
    before = local_cluster._recorded_address()
    started = local_cluster.up(port=port, idle_timeout_s=IDLE_TIMEOUT_S, record_address=False, node_timeout_s=10)
    try:
        yield started
    finally:
        local_cluster.down(port)
    # Nothing of it is left, and `--address auto` still means what it meant before.
    assert not [pid for pid in process_table(include_zombies=False)
                if started.session_dir in " ".join(_args(pid))], "processes of the cluster left running"
    assert not _listening(port)
    assert local_cluster._recorded_address() == before
    assert not _files(port), "its files left in the cache"


def _args(pid: int) -> list[str]:
    from accelsweep.trainables.processes import command_line

    return command_line(pid) or []


def _sweep(cluster, tmp_path, *flags) -> subprocess.CompletedProcess:
    # --address auto through $RAY_ADDRESS, the way a head's own `ray start` is found.
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([ACCELSWEEP, "run", "neuron_vit", "--smoke", "--address", "auto", "--platform", "cpu",
                           "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--storage-path", str(tmp_path / "ray"),
                           *flags], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=SWEEP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _runs(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.data.tags.get("status") != "reused"
              and r.data.tags.get("phase") != "confirmation"]  # the search's trials, not the winner's re-runs
    return parents, trials


def _nodes(cluster) -> dict[str, int]:
    """The cluster's live nodes by type; {} while it cannot say."""
    line = local_cluster.status_line(cluster)
    if line.startswith("could not ask it"):
        return {}
    return dict((kind, int(n)) for kind, n in (part.rsplit(" x", 1) for part in line.split(", ")))


def _head_alone(cluster, timeout_s: float = 60) -> None:
    """Wait for the earlier tests' worker nodes to be stopped as idle: a test that counts
    launches, or kills "the" worker node, must start from the head alone (a node left idle
    by the test before may take the trial and then be stopped under it)."""
    assert local_cluster.wait_for(lambda: _nodes(cluster) == {"head": 1}, timeout_s=timeout_s, poll_s=1), \
        _nodes(cluster)


@pytest.mark.slow
def test_the_used_by_line_launches_the_type_asked_for_and_prices_each_trial_by_it(cluster, tmp_path):
    """`neuron_vit --address auto --platform cpu --instance-type c7i.2xlarge` against a
    cluster of no worker nodes: the autoscaler starts a c7i.2xlarge, every trial runs
    there (its node and type in its run), at that type's price, and the nodes go back to
    zero when idle."""
    _head_alone(cluster)
    done = _sweep(cluster, tmp_path, "--instance-type", "c7i.2xlarge", "--cpus-per-worker", "1",
                  "--num-samples", "2")
    parents, trials = _runs(tmp_path)
    assert trials and all(t.data.tags["node_type"] == "c7i.2xlarge" for t in trials)
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID as head_id

    assert all(t.data.tags["node_id"] and t.data.tags["node_id"] != head_id for t in trials)
    for trial in trials:  # 1 of the node's 8 vCPUs at c7i.2xlarge's price
        assert trial.data.metrics["usd_per_hour"] == pytest.approx(PRICE_TABLE["c7i.2xlarge"].usd_per_hour / 8)
        assert trial.data.tags["cost_basis"].startswith("c7i.2xlarge at $0.357/h")
    assert "cluster: 1 node launched (c7i.2xlarge x1); trials waited for a place" in done.stdout
    assert parents[0].data.tags["cluster"].startswith("cluster: 1 node launched (c7i.2xlarge x1)")
    _head_alone(cluster)  # idle for IDLE_TIMEOUT_S, then stopped: the autoscaler updates every 5 s


@pytest.mark.slow
def test_instance_type_searched_launches_each_type_and_compares_them(cluster, tmp_path):
    """--instance-types c7i.xlarge,c7i.2xlarge: both types launched as trials draw them,
    each trial owning and priced by its own type's node, and the summary comparing them."""
    done = _sweep(cluster, tmp_path, "--instance-types", "c7i.xlarge,c7i.2xlarge", "--num-samples", "4",
                  "--max-concurrent", "2", "--seed", "0")
    _, trials = _runs(tmp_path)
    seen = {t.data.tags["node_type"] for t in trials}
    assert seen == {"c7i.xlarge", "c7i.2xlarge"}
    for trial in trials:
        kind = trial.data.tags["node_type"]
        assert trial.data.params["instance_type"] == kind  # it ran where it asked to
        assert trial.data.params["threads"] == str(PRICE_TABLE[kind].vcpus)  # and owned the node
        assert trial.data.metrics["usd_per_hour"] == pytest.approx(PRICE_TABLE[kind].usd_per_hour)
    assert "by node type:\n  c7i.2xlarge: " in done.stdout and "\n  c7i.xlarge: " in done.stdout


def test_searched_instance_types_are_checked_before_anything_starts(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cases = [(["--instance-types", "c7i.xlarge,c7i.2xlarge"], "given with --address"),
             (["--address", "127.0.0.1:1", "--instance-types", "c7i.xlarge,trn1.2xlarge"],
              "--instance-types must be CPU instance types of the price table"),
             (["--address", "127.0.0.1:1", "--instance-types", "c7i.xlarge"], "two or more different")]
    for flags, said in cases:
        started = time.monotonic()
        done = subprocess.run([ACCELSWEEP, "run", "neuron_vit", "--platform", "cpu", *flags], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and said in done.stderr, done.stderr
        assert time.monotonic() - started < 60


def _node_processes(node_id: str) -> list[int]:
    """The raylet of the fake node ``node_id`` and every process below it."""
    from accelsweep.trainables.processes import descendants

    table = process_table(include_zombies=False)
    raylets = [pid for pid in table if f"--node_id={node_id}" in _args(pid)]
    return sorted(descendants(table, raylets))


@pytest.mark.slow
def test_a_worker_node_killed_mid_trial_is_replaced_and_the_trial_retried(cluster, tmp_path):
    """The node a trial runs on dies (its raylet and everything below it killed): the
    autoscaler replaces the node, the trial runs again there, and the sweep ends with
    one run per trial, none left RUNNING."""
    import signal
    import threading

    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    _head_alone(cluster)
    killed: list[str] = []

    def kill_the_first_worker_node():
        def worker_node():
            # A raylet of THIS cluster's fake worker nodes (its args name the cluster's session):
            # never another Ray instance's, such as the test session's own, whose raylet's death
            # would end this very process (a driver exits with its raylet).
            running = [pid for pid in process_table(include_zombies=False)
                       if cluster.session_dir in " ".join(_args(pid))
                       and any(a.startswith("--node_id=") and FAKE_HEAD_NODE_ID not in a for a in _args(pid))]
            return running[0] if running else None

        if not local_cluster.wait_for(lambda: worker_node() is not None, timeout_s=120, poll_s=0.5):
            return
        node_id = next(a.split("=", 1)[1] for a in _args(worker_node()) if a.startswith("--node_id="))
        time.sleep(8)  # the trial is under way on it: its process started, its model built
        for pid in _node_processes(node_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed.append(node_id)

    killer = threading.Thread(target=kill_the_first_worker_node, daemon=True)
    killer.start()
    done = _sweep(cluster, tmp_path, "--instance-type", "c7i.2xlarge", "--cpus-per-worker", "1", "--num-samples", "1",
                  "--windows", "4", "--window-s", "5", "--retries", "2")
    killer.join(timeout=10)
    assert killed, "no worker node came up to kill"
    parents, trials = _runs(tmp_path)
    assert len(trials) == 1 and trials[0].info.status == "FINISHED", done.stdout[-3000:]
    assert trials[0].data.tags.get("retries") == "1"
    assert trials[0].data.tags["node_id"] != killed[0]  # it finished on the replacement
    assert "cluster: 2 nodes launched (c7i.2xlarge x2)" in done.stdout
    assert parents[0].info.status == "FINISHED"


@pytest.mark.host_timing
@pytest.mark.slow
def test_a_detached_driver_outlives_its_terminal_and_resume_finishes_it_after_a_kill(cluster, tmp_path):
    """The driver on the head, started with --detach from a shell that is then hung up on
    (an SSH session closing): it goes on. Killed outright mid-sweep, the same command with
    --resume finishes the sweep: one run per trial, none left RUNNING."""
    import re
    import shlex
    import signal

    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    study = ["neuron_vit", "--smoke", "--address", "auto", "--platform", "cpu", "--instance-type", "c7i.2xlarge",
             "--cpus-per-worker", "1", "--num-samples", "3", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
             "--storage-path", str(tmp_path / "ray")]
    # A terminal's shell dies of SIGHUP: its default action, put back here because a test
    # run started under nohup (or any parent ignoring SIGHUP) passes SIG_IGN on to bash,
    # which would then outlive its hang-up (seen in a run of .ci/run under nohup).
    terminal = subprocess.Popen(["bash", "-c", f"{ACCELSWEEP} run --detach {shlex.join(study)}; sleep 60"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    said = "".join(terminal.stdout.readline() for _ in range(2))
    driver = int(re.search(r"pid (\d+); output in (\S+)", said).group(1))
    log = re.search(r"output in (\S+)", said).group(1)
    os.killpg(terminal.pid, signal.SIGHUP)  # the terminal goes
    terminal.wait(timeout=10)
    try:
        assert local_cluster.wait_for(lambda: "[trial 1/3" in open(log).read(), timeout_s=150, poll_s=1), open(log).read()
        assert os.path.exists(f"/proc/{driver}"), "the detached driver ended with its terminal"
        os.kill(driver, signal.SIGKILL)  # the head process killed outright, mid-sweep
    finally:
        if os.path.exists(f"/proc/{driver}"):
            os.kill(driver, signal.SIGKILL)
    done = subprocess.run([ACCELSWEEP, "run", *study, "--resume"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=SWEEP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parents, trials = _runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    numbers = [t.data.tags["trial_number"] for t in trials]
    assert sorted(numbers) == sorted(set(numbers)) and len(numbers) <= 3
    assert all(t.info.status != "RUNNING" for t in trials)
    assert all(t.data.tags.get("node_type") == "c7i.2xlarge" for t in trials if t.data.tags["status"] == "finished")


@pytest.mark.slow
def test_down_after_its_gcs_died_stops_what_outlived_it(cluster):
    """Last of the module's tests on the cluster: its GCS killed (the OOM killer's usual
    pick, the biggest process), `down` finds no GCS on the port, yet stops the raylet,
    autoscaler and the rest of its session, which `up` recorded; the fixture then checks
    that nothing of it is left."""
    import signal

    from accelsweep.sweeps.driver.run.local_ray import instance_processes
    from accelsweep.trainables.processes import command_line

    [gcs] = [pid for pid in process_table(include_zombies=False)
             if os.path.basename((command_line(pid) or [""])[0]) == "gcs_server"
             and f"--gcs_server_port={cluster.port}" in command_line(pid)]
    os.kill(gcs, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while local_cluster._gcs_session(cluster.port) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert local_cluster._gcs_session(cluster.port) is None
    assert instance_processes(cluster.session_dir), "nothing outlived the GCS: nothing to test"
    assert local_cluster.down(cluster.port) > 0
    assert not instance_processes(cluster.session_dir)
    assert not _files(cluster.port)

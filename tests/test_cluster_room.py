"""What a cluster's autoscaler can still add, in trials of one shape
(sweeps/driver/run/cluster_room.py): read from cluster.yaml's schema and from the
autoscaler's own command line, and how a sweep is sized by it."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import yaml

from accelsweep.sweeps.driver.ops.local_cluster import repository_cluster_yaml
from accelsweep.sweeps.driver.run import cluster_room
from accelsweep.sweeps.driver.run.cluster_room import Autoscaling, NodeType, from_config, slots_to_add
from accelsweep.trainables import ray_adapter

C7I_2XL = {"CPU": 4.0, "instance_type:c7i.2xlarge": 0.001}  # the main job's CPU trial on a c7i.2xlarge


def test_cluster_yamls_limits_with_each_types_resources_filled_in_from_its_instance_type():
    limits = from_config(yaml.safe_load(open(repository_cluster_yaml())))
    types = {t.name: t for t in limits.types}
    assert "head-cpu" not in types and limits.max_workers == 4
    # cluster.yaml declares only the marker; the CPUs are the EC2 type's, as Ray's AWS provider fills them in
    assert types["c7i-2xlarge"].resources == {"CPU": 8.0, "instance_type:c7i.2xlarge": 1.0}
    assert types["c7i-2xlarge"].max_workers == 2 and types["trn1-2xlarge"].resources["neuron_cores"] == 2.0
    assert slots_to_add(C7I_2XL, limits, []) == 4  # two nodes of two trials each


def test_nodes_up_and_the_cap_on_worker_nodes_leave_less_to_add():
    limits = Autoscaling((NodeType("small", {"CPU": 4.0, "instance_type:s": 1.0}, 3),
                          NodeType("big", {"CPU": 16.0, "instance_type:b": 1.0}, 2)), max_workers=3)
    head = {"CPU": 8.0, "node:__internal_head__": 1.0}
    four = {"CPU": 4.0}
    assert slots_to_add(four, limits, [head]) == 4 + 4 + 1  # big x2 first (4 each), then one small: the cap
    assert slots_to_add(four, limits, [head, {"CPU": 16.0, "instance_type:b": 1.0}]) == 4 + 1
    assert slots_to_add({"CPU": 4.0, "instance_type:s": 0.001}, limits, [head]) == 3
    assert slots_to_add({"CPU": 32.0}, limits, []) == 0  # no node type holds one
    assert slots_to_add(four, None, []) == 0  # no autoscaler: only the nodes up count


def test_the_autoscaler_v1_config_is_found_by_its_clusters_gcs_port(tmp_path):
    config = tmp_path / "autoscaling.json"
    looks_like_the_monitor = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "/x/ray/autoscaler/_private/monitor.py",
         "--gcs-address=10.0.0.5:6999", f"--autoscaling-config={config}"])
    try:
        deadline = time.monotonic() + 10
        while ray_adapter.autoscaler_config_path("127.0.0.1:6999") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ray_adapter.autoscaler_config_path("127.0.0.1:6999") == str(config)
        assert ray_adapter.autoscaler_config_path("127.0.0.1:6998") is None  # another cluster's
    finally:
        looks_like_the_monitor.kill()
        looks_like_the_monitor.wait()


def test_a_sweep_on_an_autoscaling_cluster_is_sized_to_the_nodes_up_and_those_it_may_add(monkeypatch):
    """Sized to the nodes up, a sweep on a cluster whose workers were all down ran one
    trial at a time for its whole run; Tune now may create as many as the autoscaler can
    make room for (their demand is what launches the nodes), and seats decide when each
    starts (fair_share.py)."""
    import ray

    from accelsweep.sweeps.driver.run.lifecycle import concurrency_for

    on_cluster = SimpleNamespace(max_concurrent_trials=None, num_samples=20, address="10.0.0.5:6379")
    limits = from_config(yaml.safe_load(open(repository_cluster_yaml())))
    monkeypatch.setattr(cluster_room, "read_autoscaling", lambda: limits)
    monkeypatch.setattr(ray_adapter, "nodes_up", lambda: [{"CPU": 8.0, "node:__internal_head__": 1.0}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    slots, why = concurrency_for(C7I_2XL, on_cluster)
    assert slots == 4 and "the nodes its autoscaler may add (4: up to" in why and "2 c7i-2xlarge" in why, why
    assert "trn1" not in why  # only the types that hold the trial are named
    assert concurrency_for({"CPU": 4.0}, SimpleNamespace(**{**vars(on_cluster), "address": None})) == (
        2, "2 trial(s) fit in the cluster's resources")  # a local instance: no autoscaler
    assert concurrency_for(C7I_2XL, SimpleNamespace(**{**vars(on_cluster), "max_concurrent_trials": 3})) == (
        3, "as asked")


def test_a_sweep_is_sized_to_the_whole_trials_each_node_holds_not_the_clusters_sum(monkeypatch):
    """A trial runs on one node: two nodes of 3 CPUs hold two trials of 2 CPUs, though the
    cluster has 6; sized by the sum, Tune created a third that waited for a place no node has."""
    import ray

    from accelsweep.sweeps.driver.run.lifecycle import concurrency_for

    local = SimpleNamespace(max_concurrent_trials=None, num_samples=20, address=None)
    monkeypatch.setattr(ray_adapter, "nodes_up", lambda: [{"CPU": 3.0, "node:__internal_head__": 1.0},
                                                          {"CPU": 3.0, "memory": 8e9}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 6.0, "memory": 8e9})
    assert concurrency_for({"CPU": 2.0}, local) == (2, "2 trial(s) fit in the cluster's resources")
    assert concurrency_for({"CPU": 1.0, "memory": 3e9}, local)[0] == 2  # memory on one node only: 2 there
    slots, why = concurrency_for({"CPU": 4.0}, local)
    assert slots == 1 and why.startswith("no node up holds a whole trial (4 CPU; the cluster has that only "
                                         "summed over its nodes): running one trial at a time"), why
    slots, why = concurrency_for({"CPU": 8.0}, local)
    assert slots == 1 and why.startswith("the cluster has 6 CPU now and a trial needs 8: "), why


def test_an_autoscaler_v2s_node_types_are_read_as_ray_reads_them(monkeypatch):
    import ray._private.state
    from ray.core.generated import autoscaler_pb2

    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add()
    group.name, group.min_count, group.max_count = "c7i-2xlarge", 0, 2
    group.resources["CPU"], group.resources["instance_type:c7i.2xlarge"] = 8, 1
    config.node_group_configs.add(name="off", max_count=0).resources["CPU"] = 4
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: config)
    limits = cluster_room.read_autoscaling()
    assert [(t.name, dict(t.resources), t.max_workers) for t in limits.types] == [
        ("c7i-2xlarge", {"CPU": 8.0, "instance_type:c7i.2xlarge": 1.0}, 2)]
    assert slots_to_add(C7I_2XL, limits, []) == 4

"""Node loss: on a two-node Ray cluster on this machine, killing the worker node while a
trial runs there gets that trial retried on the node left, and the sweep completes."""

import collections
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs


@pytest.mark.slow
def test_a_lost_worker_nodes_trial_is_retried_and_the_sweep_completes(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    uri = f"sqlite:///{tmp_path}/n.db"
    # Ray's test Cluster records itself as the last `ray start` (ray_current_cluster) and
    # removes the record at its end: in its own temp folder, not the machine's.
    ray_temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths go under it
    try:
        done = subprocess.run([sys.executable, "-m", "tests.node_loss_sweep", uri, str(markers)], cwd=REPO,
                              env={**os.environ, "RAY_TMPDIR": ray_temp}, capture_output=True, text=True,
                              timeout=600)
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "killed worker node" in done.stdout and "node killed: True" in done.stdout

    parents, children = mlflow_runs(uri, "node_loss")
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len(children) == 4 and all(run.info.status == "FINISHED" for run in children)
    retried = [run for run in children if run.data.tags.get("retries")]
    assert len(retried) >= 1

    attempts = collections.defaultdict(list)  # trial -> nodes, in start order
    for marker in sorted(markers.iterdir(), key=lambda m: int(m.name.split(".")[2])):
        trial, node, _ = marker.name.split(".")
        attempts[trial].append(node)
    moved = [nodes for nodes in attempts.values() if len(nodes) > 1]
    assert moved and all(nodes[-1] != nodes[0] for nodes in moved), dict(attempts)  # retried elsewhere

"""Where a trial runs: its Ray node, and the EC2 type that node is.

On a cluster the node a trial lands on decides what it costs: a trial is priced at the
rate of the type it ran on (cost.CostBasis.on), and its MLflow run names the node and
the type. The type is read from the node's own resources: cluster.yaml gives every
worker type an ``instance_type:<EC2 type>`` marker (Ray's AWS provider, and the local
cluster's fake one, start the node with it), so this holds on AWS and on one machine
alike. A node without a marker (a local instance, the head) has no type: "".
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

INSTANCE_MARKER = "instance_type:"


def node_type_of(resources: Mapping[str, float]) -> Optional[str]:
    """The EC2 type a node's resources mark (cluster.yaml's ``instance_type:<type>``)."""
    marks = sorted(key.removeprefix(INSTANCE_MARKER) for key in resources if key.startswith(INSTANCE_MARKER))
    return marks[0] if marks else None


def this_node() -> dict[str, str]:
    """The node this process runs on: ``node_id``, ``node_address`` and ``node_type``
    (strings, so they reach the trial's MLflow run as tags). Empty outside Ray."""
    import ray

    if not ray.is_initialized():
        return {}
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return {"node_id": node_id, "node_address": node["NodeManagerAddress"],
                    "node_type": node_type_of(node["Resources"]) or ""}
    return {"node_id": node_id, "node_address": "", "node_type": ""}


def reporting_node(report: Callable, node: Mapping[str, str]) -> Callable:
    """``report`` with the node's fields added to every result it sends."""
    def report_with_node(result: dict, *args, **kwargs):
        return report({**result, **node}, *args, **kwargs)

    return report_with_node

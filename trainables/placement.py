"""Where a trial runs: its Ray node, and the EC2 type that node is.

On a cluster the node a trial lands on decides what it costs: a trial is priced at the
rate of the type it ran on (cost.CostBasis.on), and its MLflow run names the node and
the type. The type is read from the node's own resources: cluster.yaml gives every
worker type an ``instance_type:<EC2 type>`` marker (Ray's AWS provider, and the local
cluster's fake one, start the node with it), so this holds on AWS and on one machine
alike. A node without a marker (a local instance, the head) has no type: "".
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.errors import ConfigError

INSTANCE_MARKER = "instance_type:"


def node_type_of(resources: Mapping[str, float]) -> Optional[str]:
    """The EC2 type a node's resources mark (cluster.yaml's ``instance_type:<type>``)."""
    marks = sorted(key.removeprefix(INSTANCE_MARKER) for key in resources if key.startswith(INSTANCE_MARKER))
    return marks[0] if marks else None


def ec2_description(instance_type: str) -> dict[str, Any]:
    """What EC2's DescribeInstanceTypes says of ``instance_type``, the fields Ray's AWS
    node provider reads (vCPUs, GPUs), from the instance table."""
    facts = PRICE_TABLE[instance_type]
    description: dict[str, Any] = {"InstanceType": instance_type, "VCpuInfo": {"DefaultVCpus": facts.vcpus}}
    gpus = facts.accelerators.get("GPU")
    if gpus:
        description["GpuInfo"] = {"Gpus": [{"Name": facts.gpu_model, "Count": gpus}]}
    return description


def node_resources(instance_type: str, declared: Mapping[str, float]) -> dict[str, float]:
    """The resources a node of ``instance_type`` reports in a Ray cluster on AWS: what Ray's
    AWS provider fills in (fillout_available_node_types_resources, with Ray's own
    accelerator managers) merged with what cluster.yaml ``declared`` for it (the
    ``instance_type:<type>`` markers). That is its vCPUs, and its accelerators as Ray counts
    them: ``neuron_cores`` from Ray's Neuron map, ``GPU`` and ``accelerator_type:<model>``
    from the GPU the type has (trainables/cost.py's instance table stands in for EC2's
    DescribeInstanceTypes)."""
    from ray._private.accelerators import get_all_accelerator_managers

    if instance_type not in PRICE_TABLE:
        raise ConfigError("InstanceType", f"one of {', '.join(PRICE_TABLE)} (the instance table in "
                                          "trainables/cost.py)", instance_type,
                          "A local cluster gives each node the resources of its EC2 type.")
    instances = {instance_type: ec2_description(instance_type)}
    resources: dict[str, float] = {"CPU": float(PRICE_TABLE[instance_type].vcpus)}
    for manager in get_all_accelerator_managers():
        count = manager.get_ec2_instance_num_accelerators(instance_type, instances)
        if count:
            resources[manager.get_resource_name()] = float(count)
            model = manager.get_ec2_instance_accelerator_type(instance_type, instances)
            if model:
                resources[f"accelerator_type:{model}"] = 1.0
    resources.update({name: float(amount) for name, amount in declared.items()})
    return resources


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

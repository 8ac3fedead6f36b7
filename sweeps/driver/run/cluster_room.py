"""What a cluster's autoscaler can still add, counted in trials of one shape.

A sweep sized to the nodes up now runs one trial at a time on a cluster whose workers
are all down, and sweeps sharing it wait for seats nobody asks the autoscaler for. So the
driver and the cluster's arbiter (fair_share.py) also count the trials the autoscaler may
yet make room for: of each worker node type, the trials one node of it holds times the
nodes of it it may still launch, within the cluster's cap on worker nodes.

The limits come from Ray: an autoscaler v2 reports its node types to the GCS; the
autoscaler v1 that ``ray up`` starts does not, so its config file is read, from its
command line, on the host it runs on (the head, where ``ray up``'s driver and the arbiter
run). A node type whose resources the config leaves to the cloud (cluster.yaml declares
only the ``instance_type:<type>`` marker) gets its EC2 type's, as Ray's AWS provider fills
them in (placement.node_resources).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from accelsweep.trainables import ray_adapter
from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.placement import INSTANCE_MARKER, node_resources

HEAD_MARK = "node:__internal_head__"
# A node group whose max_count is -1 (autoscaler v2: no cap of its own) may add nodes up
# to the cluster's cap only: counted as this many, which no cap reaches.
UNCAPPED = 10**6
# What a node reports but no trial's count of slots depends on.
UNCOUNTED = ("memory", "object_store_memory")


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: Mapping[str, float]
    max_workers: int


@dataclass(frozen=True)
class Autoscaling:
    types: tuple[NodeType, ...]
    max_workers: Optional[int] = None  # all worker nodes together; None: no cap but each type's

    def describe(self, shape: Mapping[str, float]) -> str:
        """Its limits on the node types that hold a trial of ``shape``."""
        cap = f", {self.max_workers} worker node(s) in all" if self.max_workers is not None else ""
        fitting = [f"{t.max_workers} {t.name}" for t in self.types if holds(shape, t.resources)]
        return "up to " + (", ".join(fitting) or "no node that holds a trial") + cap


def from_config(config: Mapping[str, Any]) -> Autoscaling:
    """The limits in an autoscaling config (cluster.yaml's schema)."""
    types = []
    for name, node_type in (config.get("available_node_types") or {}).items():
        if name == config.get("head_node_type"):
            continue
        declared = {k: float(v) for k, v in (node_type.get("resources") or {}).items()}
        instance_type = (node_type.get("node_config") or {}).get("InstanceType")
        resources = node_resources(instance_type, declared) if instance_type in PRICE_TABLE else declared
        types.append(NodeType(name, resources, int(node_type.get("max_workers") or 0)))
    cap = config.get("max_workers")
    return Autoscaling(tuple(types), int(cap) if cap is not None else None)


def read_autoscaling() -> Optional[Autoscaling]:
    """The connected cluster's autoscaler limits; None for a cluster without one (or one
    whose limits this host cannot read: then only the nodes up count, as before)."""
    groups = ray_adapter.autoscaler_node_groups()
    if groups:
        return Autoscaling(tuple(NodeType(name, resources, count if count >= 0 else UNCAPPED)
                                 for name, resources, count in groups))
    path = ray_adapter.autoscaler_config_path(ray_adapter.gcs_address())
    if path is None:
        return None
    import yaml

    try:
        with open(path) as config_file:
            text = config_file.read()
        config = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        return from_config(config)
    except (OSError, ValueError, yaml.YAMLError, AttributeError, TypeError):
        return None


def holds(shape: Mapping[str, float], resources: Mapping[str, float],
          uncounted: Sequence[str] = UNCOUNTED) -> int:
    """How many whole trials of ``shape`` one node with ``resources`` holds, leaving out the
    resources named in ``uncounted`` (autoscaler node types declare no memory; a node up
    reports what it has, and a trial asking for memory is held by it)."""
    counts = [math.floor(resources.get(name, 0.0) / amount + 1e-9) for name, amount in shape.items()
              if amount > 0 and name not in uncounted]
    return max(0, min(counts)) if counts else 0


def _type_of(node: Mapping[str, float], types: Sequence[NodeType]) -> Optional[str]:
    """The worker type a node up is of: the one whose markers it has (else whose resources
    it has); None for the head."""
    if HEAD_MARK in node:
        return None
    for node_type in types:
        markers = [k for k in node_type.resources if k.startswith(INSTANCE_MARKER)]
        wanted = markers or [k for k in node_type.resources if k not in UNCOUNTED]
        if wanted and all(node.get(k, 0.0) >= node_type.resources[k] for k in wanted):
            return node_type.name
    return None


def slots_to_add(shape: Mapping[str, float], autoscaling: Optional[Autoscaling],
                 nodes: Sequence[Mapping[str, float]]) -> int:
    """Trials of ``shape`` the autoscaler can still launch nodes for, beside the ``nodes``
    up now: the types that hold most of them first, within the cap on worker nodes."""
    if autoscaling is None:
        return 0
    up = Counter(_type_of(node, autoscaling.types) for node in nodes)
    workers_up = sum(n for name, n in up.items() if name is not None)
    left = math.inf if autoscaling.max_workers is None else max(0, autoscaling.max_workers - workers_up)
    launchable = sorted(((holds(shape, t.resources), max(0, t.max_workers - up[t.name])) for t in autoscaling.types),
                        reverse=True)
    slots = 0
    for per_node, can_launch in launchable:
        if per_node <= 0 or left <= 0:
            continue
        launched = int(min(can_launch, left))
        slots += per_node * launched
        left -= launched
    return slots

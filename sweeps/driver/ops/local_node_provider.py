"""The local cluster's node provider: Ray's fake multi-node provider, its nodes set up.

Ray's fake provider starts a node as a raylet on this machine, as the AWS provider boots
an instance. But it keeps the "uninitialized" status the autoscaler gives a node it
launches, and the autoscaler only checks the liveness of nodes set up ("up-to-date"):
a fake node whose raylet died stayed pending for ever, its trials waiting on it. Real
nodes reach "up-to-date" once their setup commands ran; these have none to run, so
they are up-to-date at once, and a node that stops heartbeating is terminated and
replaced as on AWS (AUTOSCALER_HEARTBEAT_TIMEOUT_S, 30 s by default).

Named in the autoscaling config as ``provider: {type: external, module:
accelsweep.sweeps.driver.ops.local_node_provider.LocalNodeProvider}``; the autoscaler
process imports it. Built on Ray 2.60's private fake provider (tests/test_local_cluster.py
runs it).
"""

from __future__ import annotations

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.tags import STATUS_UP_TO_DATE, TAG_RAY_NODE_STATUS


class LocalNodeProvider(FakeMultiNodeProvider):
    def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        super()._create_node_with_resources_and_labels(
            node_config, {**tags, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}, count, resources, labels)

"""What the cluster did during a sweep: the nodes that joined it, by type, and how long
trials waited for a place on one.

On an autoscaling cluster a sweep's first trials wait while the autoscaler starts the
node type they ask for (cluster.yaml's ``instance_type:<type>`` markers name it), and
nodes leave again when idle. The summary says so: ``cluster: 2 nodes launched
(c7i.2xlarge x2); trials waited ...``. A trial's wait is from Tune holding it pending
to its start; it includes the autoscaler's launch and the node's start-up. Nodes are
read from Ray's node table every few seconds while the sweep runs (a node that came and
went between two reads is missed: the table keeps dead nodes, but not their resources).
"""

from __future__ import annotations

import statistics
import time

from ray.tune import Callback

from accelsweep.sweeps.driver.reporting.summary import best_record
from accelsweep.trainables.placement import node_type_of

SAMPLE_EVERY_S = 2.0


class ClusterWatch(Callback):
    def __init__(self):
        self.types: dict[str, str] = {}  # node id -> its type ("" for none), every node seen alive
        self.at_start: set[str] = set()
        self.pending_since: dict[str, float] = {}
        self.waits_s: list[float] = []
        self._sampled_at = float("-inf")

    def setup(self, **info):
        self.at_start = set(self._sample())

    def on_step_begin(self, iteration, trials, **info):
        now = time.monotonic()
        for trial in trials:
            if trial.status == "PENDING":
                self.pending_since.setdefault(trial.trial_id, now)
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sample()

    def on_trial_start(self, iteration, trials, trial, **info):
        since = self.pending_since.pop(trial.trial_id, None)
        if since is not None:
            self.waits_s.append(time.monotonic() - since)
        self._sample()

    def _sample(self) -> list[str]:
        """The ids of the nodes alive now; each one's type noted."""
        import ray

        self._sampled_at = time.monotonic()
        alive = [node for node in ray.nodes() if node["Alive"]]
        for node in alive:
            self.types.setdefault(node["NodeID"], node_type_of(node["Resources"]) or "")
        return [node["NodeID"] for node in alive]

    def launched(self) -> dict[str, int]:
        """The nodes that joined during the sweep, counted by type."""
        counts: dict[str, int] = {}
        for node_id, kind in self.types.items():
            if node_id not in self.at_start:
                counts[kind or "untyped"] = counts.get(kind or "untyped", 0) + 1
        return counts

    def line(self) -> str:
        alive = self._sample()
        launched = self.launched()
        nodes = sum(launched.values())
        text = f"cluster: {nodes} node{'s' * (nodes != 1)} launched"
        if launched:
            text += " (" + ", ".join(f"{kind} x{n}" for kind, n in sorted(launched.items())) + ")"
        if self.waits_s:
            text += (f"; trials waited for a place {max(self.waits_s):.1f} s at most, "
                     f"{statistics.median(self.waits_s):.1f} s median ({len(self.waits_s)} trials)")
        return text + f"; {len(alive)} node{'s' * (len(alive) != 1)} up at the end (head included)"


def by_node_type(records, metric: str, mode: str) -> str:
    """How each node type the trials ran on did: its trials and its best by ``metric``,
    with that trial's price per 1M samples; "" when they all ran on one type (or none)."""
    kinds = sorted({r.result.get("node_type") for r in records if r.result.get("node_type")})
    if len(kinds) < 2:
        return ""
    parts = []
    for kind in kinds:
        on_it = [r for r in records if r.result.get("node_type") == kind]
        best = best_record(on_it, metric, mode)
        figures = (f"best {best.metric(metric):.4g} {metric} at ${best.metric('usd_per_1m_samples'):.4g} per 1M "
                   f"samples (trial {best.number})" if best else "none measured")
        parts.append(f"  {kind}: {len(on_it)} trial{'s' * (len(on_it) != 1)}, {figures}")
    return "\n".join(["by node type:", *parts])

"""How fairly several sweeps shared one cluster: each sweep's wall time against its fair share.

Several drivers run the main job on one cluster at once, each recording to its own sqlite
store; this reads the stores afterwards. For each sweep: its trials, the time they held a
slot (a trial's ``wall_s`` less its ``wait_s``: from its process's start to its end), and
the wall time a fair share would give it, ``slot time / (slots / sweeps)`` ("trials x mean
trial time / its share of the slots"), against its parent run's wall time.
A ratio above 1 is a sweep that got less than its share; the time before its first trial
(Ray's connection, planning) and after its last (the report) are shown apart.

On a hosts cluster (docs/cluster-hosts.md), four drivers in the head's namespace, with the
environment `accelsweep hosts up` prints (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH) as $CLUSTER_ENV:

    for i in 1 2 3 4; do ip netns exec asw-head env $CLUSTER_ENV .venv/bin/python sweeps/neuron_vit.py \\
        --address 10.77.0.1:6379 --platform cpu --num-samples 4 --confirm-rounds 0 \\
        --tracking-uri sqlite:///$OUT/mlflow$i.db --storage-path $OUT/ray$i > $OUT/d$i.log 2>&1 & done; wait
    .venv/bin/python benchmarks/shared_cluster.py --slots 2 $OUT/mlflow{1,2,3,4}.db
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from accelsweep.sweeps.driver.define.cli import main_guard  # noqa: E402


def sweep_share(store: str, share: float) -> dict:
    """One sweep's figures from its MLflow store (a sqlite file)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{os.path.abspath(store)}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    # A repeated proposal answered from a result ran nothing: not a trial here.
    trials = [r for r in runs if "trial_number" in r.data.tags and r.data.tags.get("status") != "reused"]
    held = [r.data.metrics["wall_s"] - r.data.metrics.get("wait_s", 0.0) for r in trials]
    wall = (parent.info.end_time - parent.info.start_time) / 1000
    fair = sum(held) / share
    return {"store": store, "trials": len(trials), "statuses": sorted(r.data.tags.get("status", "") for r in trials),
            "slot_s": sum(held), "mean_trial_s": statistics.mean(held) if held else float("nan"),
            "fair_wall_s": fair, "wall_s": wall, "ratio": wall / fair if fair else float("nan"),
            "before_first_trial_s": (min(r.info.start_time for r in trials) - parent.info.start_time) / 1000,
            "after_last_trial_s": (parent.info.end_time - max(r.info.end_time for r in trials)) / 1000,
            "waited_for_place_s": parent.data.metrics.get("waited_for_place_s", 0.0)}


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="each sweep's MLflow sqlite file")
    parser.add_argument("--slots", type=float, required=True, help="trials the cluster holds at once")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    share = args.slots / len(args.stores)
    rows = [sweep_share(store, share) for store in args.stores]
    print(f"{len(rows)} sweeps, {args.slots:g} slots: a fair share is {share:g} slot each")
    print("store                     trials  slot s  mean s  fair wall s  wall s  ratio  before  after  waited")
    for row in rows:
        print(f"{os.path.basename(row['store']):<25} {row['trials']:>6} {row['slot_s']:>7.0f} {row['mean_trial_s']:>7.1f} "
              f"{row['fair_wall_s']:>12.0f} {row['wall_s']:>7.0f} {row['ratio']:>6.2f} {row['before_first_trial_s']:>7.0f} "
              f"{row['after_last_trial_s']:>6.0f} {row['waited_for_place_s']:>7.0f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"slots": args.slots, "share": share, "rows": rows}, out, indent=1)
    return rows


if __name__ == "__main__":
    main_guard(lambda: main(sys.argv[1:]))

"""Which configs the confirmation would take, replayed over recorded peer searches: the
search trials of each accelsweep run in a recorded `vs_plain_tune.py` log (its console
lines), ranked by today's rules (`confirm.ranked_candidates`, the run's own near-best
margin as it printed it), against the judge's shares of the best config pooled over the
records that judged it. Why: the confirmation can only call a config it measures, and on a
plateau of near-equal configs one trial per config ranks them by the host's moment; this
counts how often a config within --within of the judge's best is among the first N
candidates, for N = 1, 2, 3.

    .venv/bin/python benchmarks/candidate_replay.py --revs 798a244 451924c 6e39bc3 2923e34 ca24e87 d132c3e

Each revision's `benchmarks/results/vs_plain_tune.log` is read from git (the records'
logs are kept in history, not beside their JSON). Figures are the search's raw ones: a log
has no speed probes, so `at_typical_speed` ranks as it does without them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from accelsweep.sweeps.driver.record.trial_record import TrialRecord  # noqa: E402
from accelsweep.sweeps.driver.run.confirm import config_key, ranked_candidates  # noqa: E402

TRIAL_LINE = re.compile(r"accelsweep \| \[trial (\d+)/\d+([^\]]*)\] (.*?) -> ([\d.]+) \S+.*\[([a-z ]+)\]\s*$")
MARGIN_LINE = re.compile(r"accelsweep \| near the search's best: within ([\d.]+)%")
RUN_START = "accelsweep | neuron_vit: up to"


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def searches(log: str) -> list[dict]:
    """Each accelsweep run's search trials (number, label, config, figure, status) and its
    near-best margin, from a peer benchmark's console."""
    runs: list[dict] = []
    for line in log.splitlines():
        if RUN_START in line:
            runs.append({"trials": [], "margin": None})
        elif runs and (found := TRIAL_LINE.search(line)) and "confirm" not in line:
            config = {k: _value(v) for k, v in (kv.split("=", 1) for kv in found.group(3).split())}
            runs[-1]["trials"].append({"number": int(found.group(1)), "label": found.group(2).strip(),
                                       "config": config, "figure": float(found.group(4)),
                                       "status": found.group(5).strip()})
        elif runs and (found := MARGIN_LINE.search(line)):
            runs[-1]["margin"] = float(found.group(1)) / 100
    return [run for run in runs if run["trials"]]


def records_of(run: dict) -> list[TrialRecord]:
    return [TrialRecord(number=t["number"], trial_id=f"t{t['number']}", searched=t["config"], config=t["config"],
                        resources={}, is_baseline=t["number"] == 1, created_at=float(t["number"]), status=t["status"],
                        measured_by="throughput_samples_per_s",
                        result={"throughput_samples_per_s": t["figure"], "local_step": t["label"]}, wall_s=0.0)
            for t in run["trials"]]


def judged_shares(paths: list[str]) -> dict[str, float]:
    """Config key -> its judged figure over the record's best, averaged over the records
    whose judge measured the most often judged best config."""
    records = [json.load(open(path)) for path in paths]
    bests = [config_key(r["best_config"]) for r in records]
    usual = max(set(bests), key=bests.count)
    shares: dict[str, list[float]] = defaultdict(list)
    for record in records:
        judged = {config_key(one["config"]): one["judged"] for one in record["judged"].values()}
        if usual not in judged:
            continue
        best = max(judged.values())
        for key, value in judged.items():
            shares[key].append(value / best)
    return {key: statistics.fmean(values) for key, values in shares.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revs", nargs="+", required=True, help="git revisions holding a peer record's log")
    parser.add_argument("--records", nargs="*",
                        default=sorted(glob.glob(os.path.join(HERE, "results", "vs_plain_tune*.json"))))
    parser.add_argument("--within", type=float, default=0.02, help="of the judge's best (default 2%%)")
    args = parser.parse_args(argv)
    shares = judged_shares(args.records)
    included = {count: 0 for count in (1, 2, 3)}
    runs = 0
    for rev in args.revs:
        log = subprocess.run(["git", "show", f"{rev}:benchmarks/results/vs_plain_tune.log"], cwd=HERE,
                             capture_output=True, text=True, check=True).stdout
        for run in searches(log):
            runs += 1
            records = records_of(run)
            picked, _ = ranked_candidates(records, "throughput_samples_per_s", "max", count=3, margin=run["margin"])
            named = [(r.number, shares.get(config_key(r.searched))) for r in picked]
            for count in included:
                included[count] += any(share is not None and share >= 1 - args.within for _, share in named[:count])
            print(f"{rev} run {runs}: margin {run['margin']}, candidates "
                  + ", ".join(f"trial {n} ({'not judged' if s is None else f'{s:.1%}'})" for n, s in named))
    print(f"\n{runs} searches; a config within {args.within:.0%} of the judge's best among the first N candidates: "
          + "; ".join(f"N={count}: {hits}" for count, hits in included.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

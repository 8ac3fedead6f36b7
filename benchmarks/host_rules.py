"""The search's and the confirmation's rules against the records of the host kinds they
were measured on: whether each constant still holds there, from the records alone.

    .venv/bin/python benchmarks/host_rules.py > benchmarks/results/host_rules.md

Per rule, per record (its CPU named): the near-best margin each main job derived from its
own noise (sweeps/driver/reporting/noise.py) against the 10% it replaced; the time budget
and the confirmation's share, by the peer benchmark's checks on that host
(benchmarks/vs_plain_tune.py); CONTENDED_CPUS between what a quiet machine's meter reads
and the competitor that slows a training step by a quarter (benchmarks/contention.py);
REJECT_RATIO above the smallest ratio that never rejects a config within 5% of the best and
below the slowest config's ratio (benchmarks/search_efficiency.py's recorded grids).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.recorded_grid import Table  # noqa: E402
from benchmarks.search_efficiency import rejection_evidence  # noqa: E402

from accelsweep.sweeps.driver.reporting.noise import PRIOR_MARGIN  # noqa: E402
from accelsweep.sweeps.driver.run.confirm import CONFIRM_BUDGET_SHARE  # noqa: E402
from accelsweep.sweeps.neuron_vit import CPU_TIME_BUDGET_S  # noqa: E402
from accelsweep.trainables.contention import CONTENDED_CPUS  # noqa: E402
from accelsweep.trainables.loop.rejection import REJECT_RATIO  # noqa: E402

RESULTS, DATA = os.path.join(HERE, "results"), os.path.join(HERE, "data")
SLOWED_BY = 0.25  # a competitor that slows a step by this much must read as contended


def near_best_and_budget(path: str) -> list[str]:
    record = _load(path)
    lines = [f"### `{os.path.relpath(path, HERE)}`: {record['machine']}, {record['date']}", "",
             "| seed | near-best margin (derived) | wall / plain's | winner of the judge's best | claim inside |",
             "|---|---|---|---|---|"]
    for pair in record["pairs"]:
        accel, plain = pair["accelsweep"], pair["plain"]
        margin = accel.get("near_best_margin", math.nan)
        lines.append(f"| {pair['seed']} | {'not recorded' if not math.isfinite(margin) else f'{margin:.1%}'} | "
                     f"{accel['wall_s'] / plain['wall_s']:.2f} | {accel['of_best']:.1%} | "
                     f"{pair['checks']['claim_inside_confirmed_interval']} |")
    held = all(all(pair["checks"].values()) for pair in record["pairs"])
    lines += ["", f"Budget {CPU_TIME_BUDGET_S} s and confirmation share {CONFIRM_BUDGET_SHARE:.0%}: "
                  f"{'every check held' if held else 'a check failed'} (wall <= 0.75x, winner within 3%, claims "
                  f"inside); the judge's best config: {record['best_config']}; configs past the space's edges "
                  f"judged: {len(record.get('beyond_edges', []))}.", ""]
    return lines


def contention(path: str) -> list[str]:
    record = _load(path)
    rows = sorted(record["rows"], key=lambda row: row["competitor_cpus"])
    quiet = rows[0]["other_cpus_median"]
    slowing = next((row for row in rows if row["slowdown_median"] >= SLOWED_BY), None)
    lines = [f"### `{os.path.relpath(path, HERE)}`: {record['machine']}, {record['date']}", "",
             "| competitor (cores) | meter reads (median) | slowdown (median) |", "|---|---|---|"]
    lines += [f"| {row['competitor_cpus']:g} | {row['other_cpus_median']:.3f} | {row['slowdown_median']:.1%} |"
              for row in rows]
    if slowing is None:
        verdict = f"no competitor slowed the step by {SLOWED_BY:.0%}"
    else:
        holds = quiet < CONTENDED_CPUS <= slowing["other_cpus_median"]
        verdict = (f"quiet reads {quiet:.3f}; the first competitor slowing the step by {SLOWED_BY:.0%} or more "
                   f"reads {slowing['other_cpus_median']:.3f}: CONTENDED_CPUS = {CONTENDED_CPUS} "
                   f"{'lies between' if holds else 'does NOT lie between'}")
    return lines + ["", verdict + ".", ""]


def rejection(path: str) -> list[str]:
    table = Table.load(path)
    evidence = rejection_evidence(table)
    slowest = max(table.best / row.throughput for row in table.rows.values() if row.throughput)
    machine = table.machine
    flags = " ".join(flag for flag in machine.get("cpu_flags", []) if flag.startswith(("avx", "amx")))
    holds = evidence["smallest_safe_ratio"] < REJECT_RATIO
    return [f"### `{os.path.relpath(path, HERE)}`: {machine.get('cpu_model', '?')} ({flags}), "
            f"{machine.get('date_utc', '?')} UTC", "",
            f"{table.size} configs; projection over the full run {evidence['projection_over_final_min']:.2f}-"
            f"{evidence['projection_over_final_max']:.2f}; the smallest ratio that never rejects a config within 5% "
            f"of the best: {evidence['smallest_safe_ratio']:.2f}; the slowest config {slowest:.1f}x below the best; "
            f"configs >= 3x below: {evidence['slower_3x']}, >= 5x: {evidence['slower_5x']}. REJECT_RATIO = "
            f"{REJECT_RATIO:g} {'is above the safe ratio' if holds else 'is NOT above the safe ratio'}.", ""]


def _load(path: str) -> dict:
    with open(path) as record:
        return json.load(record)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", nargs="*", default=sorted(glob.glob(os.path.join(RESULTS, "vs_plain_tune*.json"))))
    parser.add_argument("--contention", nargs="*",
                        default=sorted(glob.glob(os.path.join(RESULTS, "contention_*.json")))
                        + sorted(glob.glob(os.path.join(DATA, "contention_*.json"))))
    parser.add_argument("--grids", nargs="*", default=sorted(glob.glob(os.path.join(DATA, "cpu_vit_tiny_*.json"))))
    args = parser.parse_args(argv)
    lines = ["# The rules against each host kind's records", "",
             "Written by `benchmarks/host_rules.py` from the records below; each names its CPU.", "",
             f"## Near-best margin (derived per run; {PRIOR_MARGIN:.0%} before), time budget, confirmation share",
             ""]
    for path in args.peer:
        lines += near_best_and_budget(path)
    lines += ["## CONTENDED_CPUS", ""]
    for path in args.contention:
        lines += contention(path)
    lines += ["## REJECT_RATIO", ""]
    for path in args.grids:
        lines += rejection(path)
    print("\n".join(lines).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What ending a sweep's process costs once its work is done: the interpreter's usual
teardown against ``end_process`` (trainables/process_end.py), which runs the exit
handlers, flushes the output and exits without it.

Each round starts two fresh processes that import what a sweep's driver has imported by
its summary (torch, Ray Tune, MLflow, Optuna, scikit-learn, matplotlib, timm), say
"done", and exit, one each way, the order alternated; it times "done" to the exit status
and reads the child's CPU time (user + system) from ``wait4``.

    python benchmarks/process_end_cost.py --rounds 5 --out benchmarks/results/process_end_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CHILD = """
import sys
import matplotlib.pyplot, mlflow, optuna, optuna.importance, ray.tune, timm, torch
from accelsweep.trainables.process_end import end_process
print("done", flush=True)
if sys.argv[1] == "end_process":
    end_process(0)
"""
WAYS = ("teardown", "end_process")


def one_exit(way: str) -> dict:
    """(seconds from "done" to the exit status, the child's CPU seconds in all)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, way], stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    done = time.monotonic()
    _, status, usage = os.wait4(child.pid, 0)
    exit_s = time.monotonic() - done
    child.returncode = os.waitstatus_to_exitcode(status)
    if line.strip() != "done" or child.returncode != 0:
        raise SystemExit(f"the {way} child failed (exit {child.returncode})")
    return {"exit_s": exit_s, "cpu_s": usage.ru_utime + usage.ru_stime}


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                    platform.machine())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    figures = {way: [] for way in WAYS}
    for number in range(args.rounds):
        for way in (WAYS if number % 2 == 0 else WAYS[::-1]):
            figures[way].append(one_exit(way))
            print(f"round {number + 1} {way}: {figures[way][-1]['exit_s']:.2f} s to exit, "
                  f"{figures[way][-1]['cpu_s']:.2f} CPU-s in all", flush=True)
    summary = {way: {"exit_s_median": statistics.median(r["exit_s"] for r in runs),
                     "cpu_s_median": statistics.median(r["cpu_s"] for r in runs)} for way, runs in figures.items()}
    for way, medians in summary.items():
        print(f"{way}: median {medians['exit_s_median']:.2f} s from 'done' to the exit status, "
              f"{medians['cpu_s_median']:.2f} CPU-s per process")
    if args.out:
        record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": cpu_model(), "cpus": os.cpu_count(),
                  "python": platform.python_version(), "rounds": args.rounds, "summary": summary, "runs": figures}
        with open(args.out, "w") as out:
            json.dump(record, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

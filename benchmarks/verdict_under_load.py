"""Does the main job's verdict hold when the machine is shared? Three runs of it, one
quiet and two with a busy neighbour started at different moments, and the verdict each
gives (issue 27).

    .venv/bin/python benchmarks/verdict_under_load.py                 # ~30 minutes on 2 cores
    .venv/bin/python benchmarks/verdict_under_load.py --smoke          # the smoke model: ~5 minutes
    .venv/bin/python benchmarks/verdict_under_load.py --out benchmarks/data/verdict_under_load_<machine>.json

Each run is ``accelsweep run neuron_vit`` with its default flags (its confirmation phase
on) in a fresh folder. The neighbour is a process burning one core (``while True: pass``)
for --busy-s seconds, started --during-search-s seconds into run 2 (while the search
runs) and as run 3's confirmation phase begins (read from its console). Per run: the
confirmed verdict, the search's, the trials tagged contended, the confirmation's rounds
and seconds, and the whole run's wall time. The runs agree when each gives the same
confirmed call (the same config better, or no config better) or "not decided".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

from accelsweep.sweeps.driver.record.tracking import mlflow_client

BUSY = "while True: pass"


def run_main_job(folder: str, smoke: bool, busy_at: object, busy_s: float) -> dict:
    """One run of the main job in ``folder``; ``busy_at``: None (quiet), seconds after
    the start, or "confirmation" (when the run says it is confirming)."""
    command = [os.path.join(os.path.dirname(sys.executable), "accelsweep"), "run", "neuron_vit",
               "--storage-path", os.path.join(folder, "ray")] + (["--smoke"] if smoke else [])
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    busy: dict = {}

    def start_busy() -> None:
        busy["process"] = subprocess.Popen([sys.executable, "-c", BUSY])
        busy["at_s"] = time.monotonic() - started
        timer = threading.Timer(busy_s, stop_busy)
        timer.daemon = True
        timer.start()

    def stop_busy() -> None:
        if "process" in busy and busy["process"].poll() is None:
            busy["process"].kill()
            busy["process"].wait()
            busy["until_s"] = time.monotonic() - started

    if isinstance(busy_at, (int, float)):
        timer = threading.Timer(busy_at, start_busy)
        timer.daemon = True
        timer.start()
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        print(f"  | {line}", end="", flush=True)
        if busy_at == "confirmation" and line.startswith("confirming:") and "process" not in busy:
            start_busy()
    process.wait()
    stop_busy()
    wall_s = time.monotonic() - started
    return {"busy": busy_at, "busy_from_s": busy.get("at_s"), "busy_until_s": busy.get("until_s"),
            "exit_status": process.returncode, "wall_s": wall_s, **read_verdict(folder), "console": lines}


def read_verdict(folder: str) -> dict:
    client = mlflow_client(f"sqlite:///{folder}/mlflow.db")
    experiment = client.get_experiment_by_name("neuron_vit")
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.kind = 'sweep'")[0]
    trials = client.search_runs([experiment.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=1000)
    contended = [t.data.tags.get("trial_number") for t in trials if "contended" in t.data.tags]
    figures = parent.data.metrics
    return {"verdict": parent.data.tags.get("verdict"), "confirmation_note": parent.data.tags.get("confirmation_note"),
            "verdict_change_pct": figures.get("verdict_change_pct"), "decided": figures.get("verdict_decided"),
            "beats_baseline": figures.get("beats_baseline"), "confirmed": figures.get("verdict_confirmed"),
            "confirmation_s": figures.get("confirmation_s"), "confirmation_rounds": figures.get("confirmation_rounds"),
            "trials": len(trials), "contended_trials": contended}


def call(run: dict) -> str:
    """What a run concluded: a config beats the baseline, none does, or not decided. Runs
    search differently (their seeds' proposals meet a machine whose speed moves), so two
    runs may confirm different configs better than the baseline without contradicting
    each other; a contradiction is one run confirming a gain where another confirms none.
    A verdict the confirmation phase did not give is not a confirmed call."""
    if not run.get("confirmed"):
        return "unconfirmed"
    if not run.get("decided"):
        return "not decided"
    return "a config beats the baseline" if run.get("beats_baseline") else "no config beats the baseline"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the smoke model (a check of this script)")
    parser.add_argument("--during-search-s", type=float, default=90.0,
                        help="run 2's neighbour starts this long after the run (default: 90)")
    parser.add_argument("--busy-s", type=float, default=90.0, help="how long each neighbour burns (default: 90)")
    parser.add_argument("--out", default=None, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    runs = []
    for busy_at in (None, args.during_search_s if not args.smoke else 5.0, "confirmation"):
        with tempfile.TemporaryDirectory(prefix="accelsweep-verdict-") as folder:
            print(f"run {len(runs) + 1}: neighbour {busy_at if busy_at is not None else 'none'}", flush=True)
            runs.append(run_main_job(folder, args.smoke, busy_at, args.busy_s))
    print("\nrun  neighbour            wall    confirmation   contended trials  verdict")
    for index, run in enumerate(runs, 1):
        neighbour = ("none" if run["busy"] is None else
                     f"{run['busy_from_s']:.0f}-{run['busy_until_s']:.0f} s" if run["busy_from_s"] is not None
                     else "never started")
        confirmation = (f"{run['confirmation_rounds']:.0f} rounds, {run['confirmation_s']:.0f} s"
                        if run["confirmation_s"] else (run["confirmation_note"] or "-"))
        print(f"{index:<4} {neighbour:<20} {run['wall_s']:>5.0f} s  {confirmation:<14} "
              f"{len(run['contended_trials']):>16}  {run['verdict']}")
    calls = {call(run) for run in runs}
    decided = calls - {"not decided"}
    agree = len(decided) <= 1 and "unconfirmed" not in calls
    print(f"\ncalls: {sorted(calls)} -> {'the runs agree' if agree else 'THE RUNS DISAGREE'} "
          "(each the same confirmed call, or not decided)")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"machine": f"{platform.node()} {platform.processor() or platform.machine()}",
                       "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "smoke": args.smoke,
                       "agree": agree, "runs": runs}, out, indent=1)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

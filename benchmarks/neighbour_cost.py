"""What one busy neighbour costs a local CPU trial, with and without the trial fitting its
threading to the cores left free (trainables/platforms/cpu_threads.py), side by side.

    .venv/bin/python benchmarks/neighbour_cost.py                # ~4 minutes on 2 cores
    .venv/bin/python benchmarks/neighbour_cost.py --out benchmarks/data/neighbour_cost_<machine>.json

Each run is the main job's baseline trial (sweeps/neuron_vit.py: vit-tiny, batch 16, fp32,
a thread per core), or its smoke baseline (--smoke), through the training loop in a fresh
process started at niceness 15, as Ray starts its workers: ``before``, the trial as it was
(its threads as asked, Ray's niceness kept); ``after``, the trial fitting its threads and
niceness. ``quiet``: nothing else running; ``busy``: one nice-0 process spinning a core
(``while True: pass``, as a user's stray script does). The four run in rotated order per
round (the machine's drift falls on all of them); the table gives each one's median and
the busy/quiet ratio of each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from accelsweep.sweeps.neuron_vit import base_config  # noqa: E402
from accelsweep.trainables.platforms.cpu import cpu_model_name  # noqa: E402
from benchmarks.contention import start_competitor, stop  # noqa: E402

ARMS = ("before", "after")
STATES = ("quiet", "busy")
RAY_WORKER_NICENESS = 15  # what Ray starts a worker at (its worker_niceness)

_TRIAL = """
import json, os, sys
os.nice(int(sys.argv[2]))
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.platforms.cpu import CpuPlatform
if sys.argv[1] == "before":
    CpuPlatform.thread_fit = lambda self, config: None
result = run_training(TrialConfig.from_dict(json.loads(sys.argv[3])))
keys = ("throughput_samples_per_s", "intra_op_threads", "threads_asked", "other_cpus_at_start", "niceness",
        "contended_windows", "other_cpus", "device")
print(json.dumps({k: result.get(k) for k in keys}))
"""


def baseline(smoke: bool) -> dict:
    return base_config("cpu", smoke, os.cpu_count() or 1, None, 0).to_dict()


def run_trial(arm: str, config: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _TRIAL, arm, str(RAY_WORKER_NICENESS), json.dumps(config)],
                         capture_output=True, text=True, check=True, cwd=os.path.dirname(HERE))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    # A kill (SIGTERM) ends the run through its finally blocks: no spinning neighbour is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="the smoke baseline (vit-micro) instead")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    config = baseline(args.smoke)
    combos = [(state, arm) for state in STATES for arm in ARMS]
    runs: dict[str, list[dict]] = {f"{s} {a}": [] for s, a in combos}
    for index in range(args.rounds):
        order = combos[index % len(combos):] + combos[:index % len(combos)]
        for state, arm in (order if index % 2 == 0 else order[::-1]):
            pids = start_competitor(1.0) if state == "busy" else []
            try:
                time.sleep(0.5 if pids else 0)
                figures = run_trial(arm, config)
            finally:
                stop(pids)
            runs[f"{state} {arm}"].append(figures)
            print(f"round {index + 1} {state:5} {arm:6}: {figures['throughput_samples_per_s']:.1f} samples/s, "
                  f"{figures.get('intra_op_threads')} of {figures.get('threads_asked')} threads, niceness "
                  f"{figures.get('niceness')}, contended windows {figures.get('contended_windows')}", flush=True)
    median = {key: statistics.median(r["throughput_samples_per_s"] for r in values) for key, values in runs.items()}
    lines = [f"{'':14}{'before':>10}{'after':>10}"]
    for state in STATES:
        lines.append(f"{state:14}{median[state + ' before']:>10.1f}{median[state + ' after']:>10.1f}")
    slow = {arm: median[f"quiet {arm}"] / median[f"busy {arm}"] for arm in ARMS}
    lines.append(f"{'quiet / busy':14}{slow['before']:>9.1f}x{slow['after']:>9.1f}x")
    lines.append(f"quiet after / before: {median['quiet after'] / median['quiet before']:.3f}")
    print("\n".join(lines))
    if args.out:
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
                  "cpu": cpu_model_name(), "cpus": os.cpu_count(), "config": config, "rounds": args.rounds,
                  "runs": runs, "median_samples_per_s": median, "slowdown": slow, "table": lines}
        with open(args.out, "w") as out:
            json.dump(record, out, indent=1)


if __name__ == "__main__":
    main()

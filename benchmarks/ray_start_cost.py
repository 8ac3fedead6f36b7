"""What a sweep's private local Ray instance costs to start and stop, and what each of its
processes adds: the instance as a sweep starts it (sweeps/driver/run/local_ray.py) against
one without the processes a private single-node instance may not need.

    .venv/bin/python benchmarks/ray_start_cost.py                  # 6 rounds, both kinds: ~2 min on 2 cores
    .venv/bin/python benchmarks/ray_start_cost.py --rounds 2       # a quick look

Each round starts each kind once, in turn (A B, then B A), in a fresh Python process that
has imported Ray already (a driver has): ``ray.init`` as local_ray.start calls it, one
trivial task (a worker started and answering), then ``ray.shutdown``. Measured for each:
wall time of the start, of the first task and of the shutdown; the CPU time the whole
machine spent from the start to the end (from /proc/stat: Ray's processes are not the
driver's children), so run it on a quiet machine; the instance's processes (by name).

The kinds:
- ``default``: every process Ray starts for ``ray.init(include_dashboard=False)``: GCS,
  raylet, the dashboard's minimal API server, the dashboard agent, the runtime-env agent,
  the autoscaler monitor, the log monitor, and one prestarted worker per CPU.
- ``lean``: the same without the autoscaler monitor (a private instance has no node to
  add) and without the log monitor (it only copies workers' output to a driver that asked
  for it: --verbose).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone

KINDS = ("default", "lean")

# One measurement, in its own process (the kind's name as argv[1]); prints one JSON line.
ONE_START = r'''
import contextlib, json, os, sys, time
import ray

from accelsweep.sweeps.driver.run.local_ray import instance_processes
from accelsweep.trainables.contention import read_cpu
from accelsweep.trainables.processes import command_line
from accelsweep.trainables.ray_adapter import without_idle_processes

def name_of(pid):
    args = command_line(pid) or ["?"]
    script = next((os.path.basename(a) for a in args[1:] if a.endswith(".py")), None)
    return script or os.path.basename(args[0])

kind = without_idle_processes(log_monitor=False) if sys.argv[1] == "lean" else contextlib.nullcontext()
cpu0, t0 = read_cpu(), time.perf_counter()
with kind:
    context = ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                       _node_ip_address="127.0.0.1")
t1 = time.perf_counter()
ray.get(ray.remote(lambda: os.getpid()).remote())
t2 = time.perf_counter()
names = sorted(name_of(pid) for pid in instance_processes(context.address_info["session_dir"]))
ray.shutdown()
t3 = time.perf_counter()
time.sleep(1.0)  # what the instance's processes spend stopping
busy_ticks = read_cpu().busy_ticks - cpu0.busy_ticks
print(json.dumps({"start_s": t1 - t0, "first_task_s": t2 - t1, "shutdown_s": t3 - t2,
                  "machine_cpu_s": busy_ticks / os.sysconf("SC_CLK_TCK"), "processes": names}))
'''


def one(kind: str) -> dict:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run([sys.executable, "-c", ONE_START, kind], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{kind}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                    platform.processor())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", default=None, help="JSON record (default: print only)")
    args = parser.parse_args(argv)
    figures = {kind: [] for kind in KINDS}
    for number in range(args.rounds):
        order = KINDS if number % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            figures[kind].append(one(kind))
            print(f"round {number + 1} {kind}: {json.dumps(figures[kind][-1])}", flush=True)
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs, {args.rounds} rounds, medians:")
    print("| kind | start (s) | first task (s) | shutdown (s) | machine CPU (s) | processes |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for kind in KINDS:
        rows = figures[kind]
        summary[kind] = {key: statistics.median(r[key] for r in rows)
                         for key in ("start_s", "first_task_s", "shutdown_s", "machine_cpu_s")}
        summary[kind]["processes"] = rows[-1]["processes"]
        s = summary[kind]
        print(f"| {kind} | {s['start_s']:.2f} | {s['first_task_s']:.2f} | {s['shutdown_s']:.2f} | "
              f"{s['machine_cpu_s']:.2f} | {len(s['processes'])}: {', '.join(s['processes'])} |")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"cpu": cpu_name(), "cpus": os.cpu_count(), "rounds": args.rounds,
                       "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "figures": figures, "medians": summary}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

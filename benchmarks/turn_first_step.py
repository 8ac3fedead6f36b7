"""What the first step of a turn costs over the others, in a confirmation in turns.

A trial in turns waits at the baton while the others measure (trainables/turns.py); when its
turn comes, its threads wake and its caches hold the other processes' data. Whether the
first step after the wait is slower than the rest decides whether a turn needs an untimed
step before its window (``turns.drain_steps``). This measures it: the judge's plain loop
(benchmarks/plain_vit.py) for the main job's baseline (b16 fp32) and two bf16 batches (64,
512), each in a process of its own, taking turns in rotated rounds as the confirmation
does; each turn times its steps one by one, and the first is compared with the median of
the rest.

    .venv/bin/python benchmarks/turn_first_step.py --rounds 12 > benchmarks/results/turn_first_step.json

Its record and what it changed: benchmarks/results/turn_first_step.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Each config's steps per turn: about 1.3-7 s of steps, the first of them compared with the rest.
CONFIGS = {"b16 fp32 (baseline)": ({"batch_size": 16}, 12),
           "b64 bf16 channels_last": ({"batch_size": 64, "precision": "bf16", "channels_last": True}, 6),
           "b512 bf16 channels_last": ({"batch_size": 512, "precision": "bf16", "channels_last": True}, 3)}


def serve(config: dict) -> None:
    """Build the config's step, warm it up, then per line on stdin (a count of steps) time
    that many steps one by one and print their seconds."""
    import plain_vit

    step = plain_vit.trainer(config)
    for _ in range(5):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        print(json.dumps(times), flush=True)


def cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                    platform.processor())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    names = list(CONFIGS)
    processes = {name: subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(CONFIGS[name][0])],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in names}
    for process in processes.values():
        if process.stdout.readline().strip() != "ready":
            raise SystemExit("a config's process did not start")
    turns: dict[str, list[list[float]]] = {name: [] for name in names}
    for index in range(args.rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            process = processes[name]
            process.stdin.write(f"{CONFIGS[name][1]}\n")
            process.stdin.flush()
            turns[name].append(json.loads(process.stdout.readline()))
    for process in processes.values():
        process.stdin.close()
        process.wait()
    summary = {}
    for name, measured in turns.items():
        step_s = statistics.median(statistics.median(times[1:]) for times in measured)
        excess = [times[0] - statistics.median(times[1:]) for times in measured]
        summary[name] = {"step_p50_s": step_s, "first_step_excess_s": statistics.median(excess),
                         "first_step_excess_of_step": statistics.median(excess) / step_s,
                         "excess_each_s": excess}
    print(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "rounds": args.rounds, "configs": summary,
                      "turns": turns, "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(json.loads(sys.argv[2]))
    else:
        main()

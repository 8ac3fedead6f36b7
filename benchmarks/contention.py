"""Where "contended" starts: a 2-thread training step's slowdown against the CPU another
process takes, measured side by side, and what the contention meter reads meanwhile.

    .venv/bin/python benchmarks/contention.py                 # ~2 minutes on 2 cores
    .venv/bin/python benchmarks/contention.py --out benchmarks/results/contention_<cpu>.json   # CPU named inside

A competitor process burns a set share of one core (busy for that fraction of every 10 ms,
asleep the rest: 0, 0.05, 0.1, 0.25, 0.5, 1 and 2 cores) while a small MLP trains with as
many intra-op threads as the machine has cores, in windows of --window-s. The shares run
interleaved over --rounds rounds (a drift of the machine's speed falls on all of them).
Per share: the median window throughput against the quiet median (the slowdown), and the
meter's ``other_cpus`` (trainables/contention.py). CONTENDED_CPUS is chosen from this
table: above what a quiet machine's own neighbours read, below the share that moves a
figure beyond a window's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from accelsweep.trainables.contention import CONTENDED_CPUS, ContentionMeter, machine_cpus
from accelsweep.trainables.platforms.cpu import CpuPlatform

SHARES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
# Busy for ``share`` of every period, asleep the rest; several such processes for more than a core.
_BURNER = """
import sys, time
share, period = float(sys.argv[1]), 0.01
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * period:
        pass
    time.sleep(max(0.0, period * (1 - share)))
"""


def start_competitor(share: float) -> list[int]:
    """Pids of processes burning ``share`` cores in all, started through a shell that
    exits at once: they are not below this process, which the meter counts as the trial."""
    pids, left = [], share
    while left > 1e-9:
        part = min(1.0, left)
        launched = subprocess.run(["sh", "-c", f'"$0" -c "$1" {part} >/dev/null 2>&1 & echo $!', sys.executable,
                                   _BURNER], check=True, capture_output=True, text=True)
        pids.append(int(launched.stdout.strip()))
        left -= part
    return pids


def stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def training_step():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(64, 512)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        optimizer.step()

    return step


def window_throughput(step, seconds: float) -> float:
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    return steps / (time.perf_counter() - start)


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=2.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(machine_cpus())
    step = training_step()
    window_throughput(step, 1.0)  # warm-up
    meter = ContentionMeter(held_cpus=machine_cpus())
    measured = {share: {"throughput": [], "other_cpus": []} for share in SHARES}
    for round_index in range(args.rounds):
        order = SHARES[round_index % len(SHARES):] + SHARES[:round_index % len(SHARES)]
        for share in order:
            competitor = start_competitor(share)
            time.sleep(0.3)  # the competitor is running before the window opens
            meter.start()
            throughput = window_throughput(step, args.window_s)
            contention = meter.stop()
            stop(competitor)
            measured[share]["throughput"].append(throughput)
            measured[share]["other_cpus"].append(contention.other_cpus if contention else float("nan"))
    quiet = statistics.median(measured[0.0]["throughput"])
    rows = []
    print(f"{CpuPlatform().capabilities(None).hardware}: {machine_cpus()} CPUs, torch {torch.__version__}, "
          f"{machine_cpus()} threads; "
          f"windows of {args.window_s:g} s, {args.rounds} rounds; CONTENDED_CPUS = {CONTENDED_CPUS}")
    print(f"{'competitor cores':>16} {'meter other_cpus':>17} {'slowdown (median)':>18} {'slowdown range':>16}")
    for share in SHARES:
        values = measured[share]
        slowdowns = [1 - t / quiet for t in values["throughput"]]
        row = {"competitor_cpus": share, "other_cpus_median": statistics.median(values["other_cpus"]),
               "slowdown_median": 1 - statistics.median(values["throughput"]) / quiet,
               "slowdown_min": min(slowdowns), "slowdown_max": max(slowdowns), **values}
        rows.append(row)
        print(f"{share:>16.2f} {row['other_cpus_median']:>17.3f} {row['slowdown_median']:>18.1%} "
              f"{row['slowdown_min']:>7.1%}..{row['slowdown_max']:.1%}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"machine": CpuPlatform().capabilities(None).hardware,
                       "cpus": machine_cpus(), "date": time.strftime("%Y-%m-%d %H:%M"), "window_s": args.window_s,
                       "rounds": args.rounds, "contended_cpus": CONTENDED_CPUS, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

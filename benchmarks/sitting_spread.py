"""How far one process's level is from another's of the same config, and whether huge
pages for PyTorch's CPU allocations change it.

A claim measured in turns is one sitting: one process per config, and a sitting has a level
its rounds cannot average away (verdict.SITTING_NOISE, derived from the judges' blocks,
where host drift between blocks minutes apart is in it too). This measures the process's
own part directly: in each block, two processes of the same config take turns in the same
rounds beside each other, so the host's drift falls on both; their paired log ratio's mean
spreads over blocks beyond what its rounds explain by sqrt(2) x one process's level sd.
Each block holds both configs (the main job's baseline and a bf16 batch on the judged best
plateau) in two arms: PyTorch's default CPU allocator, and THP_MEM_ALLOC_ENABLE=1
(allocations of 2 MiB and more aligned and madvised for transparent huge pages: this VM's
THP mode is madvise, so without it a tensor never sits in a huge page). The arms' paired
ratio per round is what the setting is worth in throughput.

    .venv/bin/python benchmarks/sitting_spread.py --blocks 6 --rounds 5 > benchmarks/results/sitting_spread.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from turn_first_step import cpu_name  # noqa: E402

CONFIGS = {"b16 fp32 (baseline)": {"batch_size": 16},
           "b128 bf16 channels_last": {"batch_size": 128, "precision": "bf16", "channels_last": True}}
ARMS = {"default allocator": {}, "THP_MEM_ALLOC_ENABLE=1": {"THP_MEM_ALLOC_ENABLE": "1"}}
COPIES = 2  # processes of one config in one arm per block: their ratio is the process's level


def serve(config: dict, env: dict, window_s: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "plain_vit.py"), "--serve",
                                json.dumps({**config, "window_s": window_s})],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **env})
    said = process.stdout.readline()
    if not said.startswith('{"ready"'):
        process.kill()
        raise SystemExit(f"the process for {config} {env} did not start (it said {said!r})")
    return process


def block(rounds: int, window_s: float) -> dict[str, list[list[float]]]:
    """One block: every (arm, config, copy) process started anew, then ``rounds`` rotated
    rounds of one window each; per process key its throughputs by round."""
    keys = [f"{arm} | {config} | {copy}" for arm in ARMS for config in CONFIGS for copy in range(COPIES)]
    processes = {}
    for key in keys:  # one at a time: builds apart
        arm, config, _ = key.split(" | ")
        processes[key] = serve(CONFIGS[config], ARMS[arm], window_s)
    figures: dict[str, list[float]] = {key: [] for key in keys}
    try:
        for round_ in range(rounds):
            for key in keys[round_ % len(keys):] + keys[:round_ % len(keys)]:
                processes[key].stdin.write("window\n")
                processes[key].stdin.flush()
                figures[key].append(json.loads(processes[key].stdout.readline())["throughput"])
    finally:
        for process in processes.values():
            process.stdin.close()
            process.wait(timeout=60)
    return figures


def analyse(blocks: list[dict[str, list[float]]]) -> dict:
    """Per arm and config: one process's level sd (from the copies' paired ratios over
    blocks, less their rounds' share); per config: the arm's throughput ratio by round."""
    out: dict = {"process_level_sd": {}, "thp_gain": {}}
    for arm in ARMS:
        for config in CONFIGS:
            means, round_vars = [], []
            for figures in blocks:
                one, two = (figures[f"{arm} | {config} | {copy}"] for copy in range(COPIES))
                ratios = [math.log(a / b) for a, b in zip(one, two)]
                means.append(statistics.fmean(ratios))
                round_vars.append(statistics.variance(ratios) / len(ratios))
            between = statistics.variance(means)
            excess = max(0.0, between - statistics.fmean(round_vars))
            out["process_level_sd"][f"{arm} | {config}"] = {
                "pair_mean_sd": math.sqrt(between), "rounds_explain": math.sqrt(statistics.fmean(round_vars)),
                "one_process_sd": math.sqrt(excess / 2), "blocks": len(blocks)}
    arm_off, arm_on = list(ARMS)
    for config in CONFIGS:
        ratios = []
        for figures in blocks:
            off, on = (_copies_log_mean(figures, arm, config) for arm in (arm_off, arm_on))
            ratios += [b - a for a, b in zip(off, on)]
        mean, sd = statistics.fmean(ratios), statistics.stdev(ratios)
        half = 1.96 * sd / math.sqrt(len(ratios))
        out["thp_gain"][config] = {"gain": math.expm1(mean), "low": math.expm1(mean - half),
                                   "high": math.expm1(mean + half), "rounds": len(ratios)}
    return out


def _copies_log_mean(figures: dict[str, list[float]], arm: str, config: str) -> list[float]:
    """By round: the mean log throughput of the copies of ``config`` in ``arm``."""
    return [statistics.fmean(math.log(v) for v in values)
            for values in zip(*(figures[f"{arm} | {config} | {copy}"] for copy in range(COPIES)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=2.0)
    args = parser.parse_args()
    started = time.time()
    blocks = []
    for number in range(args.blocks):
        blocks.append(block(args.rounds, args.window_s))
        print(f"block {number + 1}/{args.blocks} done at {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as thp:
        thp_mode = thp.read().strip()
    print(json.dumps({"cpu": cpu_name(), "cpus": os.cpu_count(), "thp_mode": thp_mode,
                      "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
                      "seconds": round(time.time() - started), "args": vars(args),
                      "analysis": analyse(blocks), "blocks": blocks}, indent=1))


if __name__ == "__main__":
    main()

"""What NaN capture costs: training throughput with the capture off and on, the same
config, alternating, on this machine's CPU.

    python -m accelsweep.trainables.loop.nan_overhead                  # vit-tiny, 4 off/on pairs
    python -m accelsweep.trainables.loop.nan_overhead --model vit-micro --rounds 2

Prints each pair, the medians, the relative cost and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Optional

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.platforms import get_platform


def overhead_config(model: str = "vit-tiny", windows: int = 3, window_min_s: float = 2.0) -> TrialConfig:
    """The CPU sweep's baseline (sweeps/neuron_vit.py): batch 16, fp32, every core."""
    cpus = os.cpu_count() or 1
    return TrialConfig.make(platform="cpu", model=model, batch_size=16, cpus_per_worker=cpus, threads=cpus,
                            warmup_steps=3, window_min_steps=5, window_min_s=window_min_s, windows=windows)


def measure_overhead(config: TrialConfig, rounds: int, out=sys.stdout) -> dict[str, Any]:
    """Throughput with the capture off and on, the same config, alternating the order
    each round so that drift in the machine's speed falls on both alike."""
    throughputs: dict[bool, list[float]] = {False: [], True: []}
    threads = get_platform(config.platform).threads(config)  # a CPU measurement
    print(f"NaN capture overhead: {config.workload_knobs.model}, batch {config.batch_size}, {config.precision}, "
          f"{config.platform} ({threads} threads), {config.windows} windows of >= "
          f"{config.window_min_steps} steps and >= {config.window_min_s} s per run, {rounds} rounds", file=out)
    with tempfile.TemporaryDirectory() as capture_dir:
        for round_number in range(rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for capture_on in order:
                result = run_training(config.replace(nan_capture=capture_on), capture_dir=capture_dir)
                throughputs[capture_on].append(result["throughput_samples_per_s"])
            off, on = throughputs[False][-1], throughputs[True][-1]
            print(f"round {round_number + 1}: off {off:.2f}, on {on:.2f} samples/s (on/off {on / off:.3f})", file=out)
    # Paired ratios: each pair ran back to back, so a slow spell of the machine (other
    # work on it) falls on both runs of a pair; the median ignores a pair it split.
    ratios = [on / off for off, on in zip(throughputs[False], throughputs[True])]
    summary = {"model": config.workload_knobs.model, "rounds": rounds,
               "off_samples_per_s": statistics.median(throughputs[False]),
               "on_samples_per_s": statistics.median(throughputs[True]),
               "relative_cost": 1 - statistics.median(ratios),
               "on_off_ratio_min": min(ratios), "on_off_ratio_max": max(ratios)}
    print(f"capture off: {summary['off_samples_per_s']:.2f} samples/s (median of {rounds} runs)", file=out)
    print(f"capture on:  {summary['on_samples_per_s']:.2f} samples/s (median of {rounds} runs)", file=out)
    print(f"relative cost: {summary['relative_cost']:.1%} (1 - the median of the per-round on/off ratios, which "
          f"range from {min(ratios):.3f} to {max(ratios):.3f}; the seed measured 1.5% on an L40S GPU)", file=out)
    print(json.dumps(summary), file=out)
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelsweep.trainables.loop.nan_overhead",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit-tiny", help="the model (default: vit-tiny)")
    parser.add_argument("--rounds", type=int, default=4, help="off/on pairs (default: 4)")
    parser.add_argument("--windows", type=int, default=3, help="windows per run (default: 3)")
    parser.add_argument("--window-min-s", type=float, default=2.0, help="seconds per window at least (default: 2.0)")
    args = parser.parse_args(argv)
    measure_overhead(overhead_config(args.model, args.windows, args.window_min_s), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

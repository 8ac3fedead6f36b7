"""What waiting trials cost the one measuring, in a confirmation in turns.

While one config measures its window, the others wait at the baton (trainables/turns.py).
Up to 2026-11-27 they asked it every 0.2 s; since, each waits in one call that returns
when its turn comes. On a 2-core host a wake-up of a waiting process could preempt one
of the measuring process's two torch threads, and a parallel region waits for its
slowest thread. This measures it: the baseline's training step (the judge's plain loop,
benchmarks/plain_vit.py) timed in windows while three Ray actors wait at a real baton,
asking it every 0.2 s (``poll``), blocked in one call (``block``), or not at all
(``none``), the three in rotated rounds.

    .venv/bin/python benchmarks/turn_waiting.py --rounds 12 > benchmarks/data/turn_waiting_$(date +%H%M).json

On the project's 2-core EPYC VM (2026-11-27 12:47, turn_waiting_1247.json), 2 s windows of
the baseline: polling -0.4% [-3.0, +2.3] against no waiters, one blocked call +3.7%
[+0.3, +7.2] (the windows' own spread is +-5%): no cost of polling this resolves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plain_vit  # noqa: E402

from accelsweep.trainables.turns import TurnBaton  # noqa: E402

MODES = ("none", "poll", "block")
POLL_S = 0.2  # the interval waiting trials asked at before


class Waiter:
    """A waiting trial's side, as a Ray actor: for ``seconds``, wait at the baton for a
    turn that does not come, in the way ``mode`` says."""

    def __init__(self, baton_name: str, key: str):
        import ray

        self.baton, self.key = ray.get_actor(baton_name), key

    def wait(self, mode: str, seconds: float) -> int:
        import ray

        calls, deadline = 0, time.monotonic() + seconds
        while mode != "none" and time.monotonic() < deadline:
            if mode == "poll":
                ray.get(self.baton.turn.remote(self.key))
                time.sleep(POLL_S)
            else:
                ray.get(self.baton.wait_turn.remote(self.key, max(0.0, deadline - time.monotonic())))
            calls += 1
        return calls


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--waiters", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    keys = [f"waiter-{i}" for i in range(args.waiters)]
    baton = TurnBaton.start("turn-waiting", ["measuring", *keys])  # nobody's turn comes but the first
    ray.get(baton.ready.remote("measuring"))
    waiters = [ray.remote(num_cpus=0)(Waiter).remote("turn-waiting", key) for key in keys]
    step = plain_vit.trainer(dict(plain_vit.BASELINE))
    for _ in range(10):
        step()
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    calls: dict[str, int] = {mode: 0 for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]:
            pending = [w.wait.remote(mode, args.window_s + 1.0) for w in waiters]
            time.sleep(0.3)  # the waiters are waiting
            for _ in range(2):
                step()
            figures[mode].append(plain_vit.window(step, 5, args.window_s))
            calls[mode] += sum(ray.get(pending))
    ray.shutdown()
    base = figures["none"]
    result = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "rounds": args.rounds, "waiters": args.waiters,
              "window_s": args.window_s, "date": time.strftime("%Y-%m-%d %H:%M"), "figures": figures,
              "calls_per_window": {m: calls[m] / args.rounds / args.waiters for m in MODES}}
    for mode in ("poll", "block"):  # paired by round: the host's drift falls on both
        ratios = [math.log(v / b) for v, b in zip(figures[mode], base)]
        mean, spread = statistics.fmean(ratios), statistics.stdev(ratios) / math.sqrt(len(ratios))
        result[f"{mode}_vs_none"] = {"change": math.expm1(mean), "low": math.expm1(mean - 2 * spread),
                                     "high": math.expm1(mean + 2 * spread)}
    print(json.dumps(result))
    for mode in ("poll", "block"):
        change = result[f"{mode}_vs_none"]
        print(f"{mode}: {change['change']:+.1%} [{change['low']:+.1%}, {change['high']:+.1%}] against no waiters "
              f"({result['calls_per_window'][mode]:.1f} calls per waiter per window)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

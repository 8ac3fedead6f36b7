"""How steady is this machine for a kernel: measure it N times in a row and say how much
its figure moves, within each measurement and between them.

    python -m accelsweep.trainables.harness.stability --op giou --impl torch-compile batch=64 boxes=256
    python -m accelsweep.trainables.harness.stability --op matmul --impl torch-matmul --repeat 10 m=256 k=256 n=256

Each measurement is one ``run_microbench``, exactly what a sweep's trial does. Printed
per measurement: p50 and ``latency_cv`` (window-to-window); then the spread of the p50s
across measurements. Exits 1 when any latency_cv or the spread exceeds --limit (default
5%): on such a machine, differences between implementations smaller than a few times
that are noise. When the machine's own probe (``host_cv``: trainables/harness/microbench.py)
moved more than the limit, the verdict says so: the machine changed speed.
"""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any, Sequence

from accelsweep.trainables.timing.windows import coefficient_of_variation
from accelsweep.trainables.harness.microbench import NOISY_CV, KernelConfig, run_microbench


def measure_repeatedly(config: KernelConfig, repeat: int) -> list[dict]:
    return [run_microbench(config) for _ in range(repeat)]


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelsweep.trainables.harness.stability", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True)
    parser.add_argument("--impl", required=True)
    parser.add_argument("--repeat", type=int, default=5, help="measurements in a row (default: 5)")
    parser.add_argument("--limit", type=float, default=NOISY_CV, help="largest acceptable cv (default: 0.05)")
    parser.add_argument("settings", nargs="*", metavar="KEY=VALUE",
                        help="shape, options, dtype, platform, window settings (as a kernel sweep's config)")
    args = parser.parse_args(list(argv) or None)
    settings = dict(setting.split("=", 1) for setting in args.settings)
    config = KernelConfig.make(op=args.op, impl=args.impl, **{k: _value(v) for k, v in settings.items()})
    results = measure_repeatedly(config, args.repeat)
    for index, result in enumerate(results, 1):
        print(f"measurement {index}: p50 {result['latency_p50_s'] * 1e3:.4f} ms, latency_cv {result['latency_cv']:.1%}, "
              f"{result['calls']} calls on {result['device']}; host loop cv {result['host_cv']:.1%}")
    p50_spread = coefficient_of_variation([r["latency_p50_s"] for r in results])
    worst_cv = max(r["latency_cv"] for r in results)
    steady = p50_spread <= args.limit and worst_cv <= args.limit
    print(f"p50 spread across the {args.repeat} measurements: {p50_spread:.1%}; largest latency_cv: {worst_cv:.1%} "
          f"-> {'steady' if steady else 'NOT steady'} at a {args.limit:.0%} limit")
    host_spread = coefficient_of_variation([r["host_probe_s"] for r in results])
    host_worst_cv = max(r["host_cv"] for r in results)
    print(f"the machine itself (a fixed pure-Python loop between the windows): spread {host_spread:.1%}, "
          f"largest cv {host_worst_cv:.1%}")
    if not steady and max(host_spread, host_worst_cv) > args.limit:
        print(f"the machine's own speed moved more than {args.limit:.0%} during the measurements: "
              "no timing on it repeats to that limit; measure on a quieter machine")
    return 0 if steady else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

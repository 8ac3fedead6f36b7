"""A fast sweep for the reliability tests: a script like the studies in sweeps/ (every
common flag: --tracking-uri, --storage-path, --resume, --seed, ...) whose trainable
imports no torch and sleeps through its windows, so a test can start it, kill it,
hang it or cut its tracking server at a chosen moment and check what it left.

    python -m tests.fault_sweep --tracking-uri sqlite:///m.db --storage-path ray \\
        --num-samples 8 --scheduler none --max-concurrent-trials 1 [--window-s 0.5] [--windows 2]

Fault knobs, set in the environment of the driver (the trials of its private instance
inherit them; on a cluster it joins with --address, they travel in the job's runtime
environment, which this script sets):

- FAULT_SWEEP_HANG=<x>: the trial with knob ``x`` stops reporting after its first window
  and waits forever, after starting a child process that would outlive it
  (``sleep 100000``; its pid is written to $FAULT_SWEEP_MARKERS/child-<x>.pid).
  With FAULT_SWEEP_HANG_DETACHED=1 it is a grandchild in a session of its own (``setsid``
  under ``sh``), the pid written is the grandchild's.
- FAULT_SWEEP_MARKERS=<dir>: each trial writes ``start-<x>-<ns>`` when it starts and
  ``end-<x>-<ns>`` after its last window: a test can act "just after a trial starts" or
  "just after one ends" without reading MLflow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from accelsweep import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, main_guard, sweep_options
from accelsweep.trainables.config import DictConfig
from accelsweep.trainables.metrics import TRAINING_METRICS

KNOB_VALUES = tuple(range(32))
FAULT_VARIABLES = ("FAULT_SWEEP_HANG", "FAULT_SWEEP_MARKERS", "FAULT_SWEEP_HANG_DETACHED")


@dataclass(frozen=True)
class FaultSweepConfig(DictConfig):
    platform: str = "cpu"
    x: int = 0
    cpus_per_worker: int = 1
    workers: int = 1
    instance_type: Optional[str] = None
    windows: int = 2
    window_s: float = 0.5

    def trial_env(self) -> dict[str, str]:
        return fault_knobs()


def fault_knobs() -> dict[str, str]:
    return {name: os.environ[name] for name in FAULT_VARIABLES if name in os.environ}


def carry_fault_knobs(address: Optional[str]) -> None:
    """A trial on a cluster this driver joins runs in a worker started with the head's
    environment, not this driver's: the knobs go in the job's runtime environment, where
    ray.init reads a submitted job's (RAY_JOB_CONFIG_JSON_ENV_VAR, as `ray job submit`
    sets it). Its env_vars name no variable read at import, so the test session's worker
    zygote still forks those workers. A private instance's workers inherit the knobs."""
    import json

    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    if not address or address == "local" or not fault_knobs():
        return
    job = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}")  # a submitted job's own, kept
    runtime_env = job.setdefault("runtime_env", {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **fault_knobs()}
    os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps(job)


def _mark(kind: str, x: int) -> None:
    markers = os.environ.get("FAULT_SWEEP_MARKERS")
    if markers:
        open(os.path.join(markers, f"{kind}-{x}-{time.time_ns()}"), "w").close()


def sleepy_trainable(searched, base, cost=None):
    """``windows`` windows of ``window_s`` each; throughput grows with x (a known best)."""
    from ray import tune

    config = FaultSweepConfig.from_dict({**base, **searched})
    _mark("start", config.x)
    started = time.monotonic()
    for window in range(1, config.windows + 1):
        time.sleep(config.window_s)
        tune.report({"throughput_samples_per_s": 100.0 + config.x, "windows_done": window,
                     "loop_s": time.monotonic() - started})
        if os.environ.get("FAULT_SWEEP_HANG") == str(config.x):
            if os.environ.get("FAULT_SWEEP_HANG_DETACHED") == "1":
                # A grandchild in a session of its own (as a compiler's daemonised server): out of
                # reach of a kill of the trial's process group, and of Ray's cleanup of a dead
                # worker's children and group.
                shell = subprocess.Popen(["sh", "-c", "setsid sleep 100000 & echo $!; wait"],
                                         stdout=subprocess.PIPE, text=True)
                child_pid = int(shell.stdout.readline())
            else:
                child_pid = subprocess.Popen(["sleep", "100000"]).pid
            markers = os.environ.get("FAULT_SWEEP_MARKERS")
            if markers:
                with open(os.path.join(markers, f"child-{config.x}.pid"), "w") as pid_file:
                    pid_file.write(str(child_pid))
            while True:  # a deadlock: no report, no exit
                time.sleep(3600)
    _mark("end", config.x)


sleepy_trainable.metrics = TRAINING_METRICS


def main() -> None:
    parser = common_parser(__doc__.split("\n\n")[0], default_samples=8)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=0.5)
    parser.add_argument("--no-report", action="store_true", help="no report (tables, plots) at the end: faster")
    args = parser.parse_args()
    base = FaultSweepConfig(windows=args.windows, window_s=args.window_s)
    sweep = Sweep(name="fault_sweep", trainable=sleepy_trainable, base=base,
                  space=lambda trial: {"x": trial.suggest_categorical("x", list(KNOB_VALUES))},
                  objectives=[Objective("throughput_samples_per_s", "max")],
                  report=not args.no_report, **sweep_options(args, default_samples=8))
    if args.dry_run:
        print(plan_sweep(sweep).describe())
    else:
        carry_fault_knobs(args.address)
        run_sweep(sweep)


if __name__ == "__main__":
    main_guard(main)

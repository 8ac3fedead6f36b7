"""Trials in a fresh process each, started with the trial's environment.

Some knobs act only when a process starts: the dynamic loader reads ``LD_PRELOAD`` (the
CPU platform's ``allocator``: jemalloc, tcmalloc) at exec, so setting it in a reused Ray
worker changes nothing. ``fresh_process_trainable`` is ``train_trainable`` with each
trial in a new child process started with the platform's ``trial_env``; the child's
reports pass through to Tune, its errors come back under their own class name (so the
sweep counts their cause), and a trial Tune stops ends its child.

    Sweep(..., trainable=fresh_process_trainable, base=TrialConfig.make(allocator="jemalloc", ...))
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import traceback
from typing import Any, Iterator, Mapping

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.process_end import end_process
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.trainable import metrics_of, train_trainable

__all__ = ["fresh_process_trainable", "run_in_fresh_process"]


def fresh_process_trainable(searched: Mapping[str, Any], base: Mapping[str, Any], cost=None) -> None:
    """``train_trainable``, each trial in a new process started with the trial's environment
    (the allocator's LD_PRELOAD is read only when a process starts); its reports pass
    through to Tune. Several workers run as Ray Train's (train_trainable)."""
    from ray import tune

    config = TrialConfig.from_dict({**base, **searched})
    if config.workers > 1:
        return train_trainable(searched, base=base, cost=cost)
    usd_per_hour = get_platform(config.platform).usd_per_hour(cost, config)
    with contextlib.closing(run_in_fresh_process(config, usd_per_hour)) as results:  # closed: the child is ended
        for result in results:
            tune.report(result)  # raises SystemExit when Tune stops the trial


def run_in_fresh_process(config: TrialConfig, usd_per_hour: float = math.nan) -> Iterator[dict]:
    """Run ``config`` in a child process started with its platform's ``trial_env``;
    yield each window's result. The child's error is raised here under its own class name
    (so the sweep counts its cause: oom, compile, ...); the child dies with this thread."""
    read_end, write_end = os.pipe()
    code = "from accelsweep.trainables.fresh_process import trial_process; trial_process()"
    env = {**os.environ, **get_platform(config.platform).trial_env(config)}
    # The child imports what this process can: a workload beside the driver script too.
    inherited = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path_of_this_process() + inherited))
    child = subprocess.Popen([sys.executable, "-c", code, str(write_end), str(os.getpid())], stdin=subprocess.PIPE,
                             env=env, pass_fds=(write_end,))
    os.close(write_end)
    try:
        child.stdin.write(json.dumps({"config": config.to_dict(), "usd_per_hour": usd_per_hour}).encode())
        child.stdin.close()
        with os.fdopen(read_end) as results:
            for line in results:
                message = json.loads(line)
                if "error" in message:
                    name, text = message["error"]
                    raise type(name, (RuntimeError,), {})(f"{text}\n(in the trial's process)\n{message['trace']}")
                yield message["result"]
        if child.wait() < 0:  # killed by a signal: the kernel's OOM killer, a crash
            name = signal.Signals(-child.returncode).name
            hint = " (the OOM killer sends it when memory runs out)" if name == "SIGKILL" else ""
            # The class name the sweep counts as a lost process (failures.py: cause "killed").
            raise type("WorkerCrashedError", (RuntimeError,), {})(f"the trial's process was killed by {name}{hint}")
        if child.returncode != 0:
            raise RuntimeError(f"the trial's process ended with exit status {child.returncode}")
    finally:
        if child.poll() is None:  # stopped early (ASHA, the time budget): so is the trial's process
            child.kill()
            child.wait()


def path_of_this_process() -> list[str]:
    """The folders on this process's import path that a new interpreter would not have:
    on a Ray worker, the driver script's folder (where a sweep script's own workload
    lives), which Ray puts there; not the interpreter's own library and site folders."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return [path for path in sys.path if path and os.path.isdir(path)
            and not any(os.path.realpath(path).startswith(prefix + os.sep) or os.path.realpath(path) == prefix
                        for prefix in own)]


def trial_process() -> None:
    """The child's side: argv is (the result pipe's fd, the parent's pid); stdin the request."""
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan keeps training
    if os.getppid() != parent:
        sys.exit(1)
    request = json.load(sys.stdin)
    with os.fdopen(fd, "w") as results:
        def send(message: dict) -> None:
            results.write(json.dumps(message) + "\n")
            results.flush()

        status = 0
        try:
            run_training(TrialConfig.from_dict(request["config"]), report=lambda result: send({"result": result}),
                         usd_per_hour=request["usd_per_hour"])
        except Exception as error:  # noqa: BLE001 - sent to the parent, which raises it as the trial's
            send({"error": [type(error).__name__, str(error)], "trace": traceback.format_exc(limit=-8)})
            status = 1
    end_process(status)  # the parent waits for the status: not for the interpreter's teardown too


# The driver reads what it reports here: train_trainable's metrics.
fresh_process_trainable.metrics = metrics_of

"""``accelsweep run --detach STUDY [flags]``: the sweep's driver as a process of its own,
so that closing the terminal (a laptop's SSH session to a cluster's head) does not end it.

On a cluster the driver belongs on the head, beside the autoscaler and the MLflow store:

    ray exec cluster.yaml 'cd ~/accelsweep && accelsweep run --detach neuron_vit --address auto ...'

returns at once and the sweep goes on. The driver runs in a session of its own (no
terminal, so no SIGHUP when the SSH session goes; the terminal's Ctrl-C does not reach
it), stdin from /dev/null, its output in a log file. It is stopped like any sweep: SIGTERM
ends it cleanly (and ``--resume`` continues it); if it is killed outright (the head
rebooted, the OOM killer), the same command with ``--resume`` continues it.
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from typing import Sequence


def detach(study_args: Sequence[str], say=print) -> int:
    """Start ``accelsweep run STUDY_ARGS`` detached; say its pid, its log and how to follow,
    stop and resume it. Returns its pid."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = os.path.splitext(os.path.basename(study_args[0]))[0]
    log_path = os.path.abspath(f"accelsweep-{name}-{stamp}.log")
    command = [sys.executable, "-m", "accelsweep.sweeps.driver.console", "run", *study_args]
    with open(log_path, "ab") as log, open(os.devnull, "rb") as nothing:
        process = subprocess.Popen(command, stdin=nothing, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, close_fds=True)
    shown = shlex.join(["accelsweep", "run", *study_args])
    say(f"detached: {shown}\n"
        f"  pid {process.pid}; output in {log_path}\n"
        f"  follow it: tail -f {shlex.quote(log_path)}\n"
        f"  stop it cleanly: kill {process.pid}  (then, to continue: the same command with --resume)\n"
        f"  if it was killed outright: accelsweep run --detach {shlex.join(study_args)} --resume")
    return process.pid

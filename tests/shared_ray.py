"""The test session's one Ray instance, for the tests that do not test a sweep's own.

A sweep given no address starts a private local instance and stops it at its end
(sweeps/driver/run/local_ray.py): seconds of wall time and several CPU-seconds each time,
paid by every test that ran a whole sweep. Tests that check that instance (its start, its
reaper, its session folder, signals, token auth) keep it; the others join this one, as a
user joins a cluster: in-process through the ``ray_session`` fixture, a command with
``--address`` (``SharedRay.flags``).

It is a head started the way an operator starts one (``ray start --head``), on loopback,
with what one node of fixed size needs and nothing more: no dashboard, no autoscaler
monitor (nothing to scale), no log monitor (a sweep's driver gets its trials' output
through its own actor, trainables/trial_progress.py). Its temp directory is its own, so it
is never the cluster that ``--address auto`` or a bare ``ray.init()`` of another test finds.
Its workers are forked from a process that has a trial's imports done (tests/worker_zygote.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

from accelsweep.sweeps.driver.run.local_ray import instance_processes, stop_processes
from tests import worker_zygote
from tests.mlflow_server import free_port

START_TIMEOUT_S = 120
# Ray rewrites 127.0.0.1 into the machine's interface address unless its switch for
# machines that run no clusters is set (trainables/ray_adapter.keep_loopback).
HEAD_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class SharedRay:
    address: str  # 127.0.0.1:port
    session_dir: str
    temp_dir: str
    workers: Optional[worker_zygote.WorkerZygote] = None  # the test process's; None: plain worker processes

    @property
    def flags(self) -> list[str]:
        """What a sweep's command line adds to run on this instance."""
        return ["--address", self.address]


def start(num_cpus: int = 2) -> SharedRay:
    # A short folder: Ray's socket paths under it must fit the 107 bytes of a Unix socket name.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port = free_port()
    environment = head_environment()
    # Its workers forked from one process that has a trial's imports done (tests/worker_zygote.py):
    # `ray start` is told that the launcher is its Python.
    workers = worker_zygote.session_workers(environment)
    command = [os.path.join(os.path.dirname(sys.executable), "ray")]
    if workers is not None:
        environment[worker_zygote.SOCKET_VARIABLE] = workers.socket_path
        command = [sys.executable, "-c", "import sys; sys.executable = sys.argv.pop(1); sys.argv[0] = 'ray'; "
                   "from ray.scripts.scripts import main; main()", workers.launcher]
    command += ["start", "--head",
                "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
                # Ray's agent listens on a fixed port otherwise (52365): two test workers each
                # start one of these.
                f"--dashboard-agent-listen-port={free_port()}",
                f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats", "--no-monitor",
                "--include-log-monitor=false"]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    session_dir = os.path.realpath(os.path.join(temp_dir, "session_latest"))
    shared = SharedRay(f"127.0.0.1:{port}", session_dir, temp_dir, workers)
    if done.returncode != 0:
        stop(shared)
        raise RuntimeError(f"`{' '.join(command)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return shared


def head_environment() -> dict[str, str]:
    """This process's environment without what one test sets for its own sweep: every
    Ray process of the session inherits it, and a password in it would be in all of them."""
    own = ("MLFLOW_TRACKING_", "PGPASS", "FAULT_SWEEP_", "NODE_LOSS_", "RAY_ADDRESS", "AWS_", "HF_TOKEN")
    return {**{name: value for name, value in os.environ.items() if not name.startswith(own)}, **HEAD_ENV}


def connect(shared: SharedRay) -> None:
    """This process joins it, as a sweep's driver given its address does (lifecycle.connect_ray)."""
    import logging

    import ray

    from accelsweep.trainables import ray_adapter

    ray_adapter.keep_loopback(shared.address)
    ray.init(address=shared.address, logging_level=logging.WARNING, log_to_driver=False)


def stop(shared: SharedRay) -> None:
    """Its processes, and nothing else of the machine's (never ``ray stop``); the worker
    zygote is the test process's, stopped at the session's end."""
    if os.path.isdir(shared.session_dir):
        stop_processes(instance_processes(shared.session_dir))
    shutil.rmtree(shared.temp_dir, ignore_errors=True)

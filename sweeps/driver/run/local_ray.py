"""The local Ray instance a sweep starts, and nothing of it left after its driver.

``connect_ray`` with no address (or "local") starts a private instance here (``start``) and
``run_sweep`` stops it before it returns (``shutdown``). A driver killed outright (SIGKILL, the
OOM killer) runs neither, and Ray's processes can stay (the raylet's agents have no parent-death
signal but the one ``raylet_child.py`` gives them; a trial's ``setsid`` child has none). So a
reaper (``_reap``) stops the instance when its driver ends, however it ends, and a record in the
session directory (``RECORD``) lets the next ``start`` stop an instance whose driver and reaper
were both killed. Only the instance's own processes are touched (``instance_processes``).

A sweep with no address starts its own instance (a bare ``ray.init()`` would join $RAY_ADDRESS or
the last ``ray start`` cluster, even one that is gone); ``--address auto`` joins that cluster
(cli.py reads $RAY_ADDRESS into --address). Linux only (/proc; elsewhere Ray's own shutdown
only). Importing this module imports no Ray: the reaper starts in a blink.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from accelsweep.sweeps.driver.record.secrets import redact_command_line
from accelsweep.sweeps.driver.run import raylet_child
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.processes import command_line, descendants, open_paths, process_table, stat_of

__all__ = ["RECORD", "instance_processes", "shutdown", "start", "stop_stale_instances"]

RECORD = "accelsweep-driver.json"  # in the session directory: the driver's and the reaper's pids and start times
LOOPBACK = "127.0.0.1"  # the local instance's address: every one of its listeners binds it
# Between SIGTERM and SIGKILL. Ray's processes that still have their raylet exit in well
# under it; orphaned agents (their raylet died with the driver) may never answer SIGTERM.
GRACE_S = 3.0
POLL_S = 2.0  # how often the reaper checks the driver's pid besides its pipe
REAPER_WAIT_S = 30.0  # how long shutdown waits for the reaper (it stops what ray.shutdown left)


@dataclass
class _Instance:
    session_dir: str
    reaper: subprocess.Popen
    pipe: int  # the driver's end of the reaper's stdin


_current: Optional[_Instance] = None


def start(log_to_driver: bool = False) -> str:
    """Start a private local Ray instance with its reaper, after stopping any instance a
    killed driver left; says what it did (one line each). ``log_to_driver``: Ray copies
    its processes' output to this one's (--verbose); a trial's own output reaches the
    driver either way, through the sweep's TrialProgress actor (trainables/trial_progress.py)."""
    global _current
    import ray

    # No dashboard, no autoscaler monitor, no log monitor unless --verbose asks for the
    # workers' output (ray_adapter.without_idle_processes; benchmarks/ray_start_cost.py
    # measures what they cost), and every listener on 127.0.0.1 (a sweep on one machine
    # needs nothing beyond loopback; ray_adapter.local_instance_confined). Token auth
    # stays on too (other users of the machine reach loopback): with RAY_AUTH_MODE unset, ray.init turns it on
    # for a new local instance (and reloads Ray's cached config, which setting the variable
    # here would not). RAY_AUTH_MODE=disabled opts out. The job table gets the command line
    # without its secrets. address="local": a new instance even where a bare ray.init()
    # would join one.
    with ray_adapter.sigterm_handler_kept(), ray_adapter.entrypoint_shown_as(redact_command_line), \
            ray_adapter.local_instance_confined(os.path.abspath(raylet_child.__file__)), \
            ray_adapter.without_idle_processes(log_monitor=log_to_driver):
        context = ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING,
                           log_to_driver=log_to_driver, _node_ip_address=LOOPBACK)
    if context.address_info.get("node_ip_address") != LOOPBACK:  # Ray changed how it picks the address
        ray.shutdown()
        raise RuntimeError(f"the local Ray instance took {context.address_info.get('node_ip_address')!r} as its "
                           f"address, not {LOOPBACK}: its processes would listen beyond this machine")
    session_dir = context.address_info["session_dir"]
    cpus = ray.cluster_resources().get("CPU", 0)
    if not os.path.isdir("/proc"):  # not Linux: Ray's own shutdown only
        return f"started a local Ray instance ({cpus:g} CPUs; session {session_dir})"
    lines = stop_stale_instances(os.path.dirname(session_dir), keep=session_dir)
    read_end, write_end = os.pipe()  # not inherited by what this process starts later (PEP 446)
    log_path = os.path.join(session_dir, "logs", "accelsweep-reaper.log")
    with open(log_path, "ab") as log:
        reaper = subprocess.Popen([sys.executable, "-m", __name__, "--driver-pid", str(os.getpid()),
                                   "--session-dir", session_dir],
                                  stdin=read_end, stdout=log, stderr=log, start_new_session=True)
    os.close(read_end)
    _current = _Instance(session_dir, reaper, write_end)
    _write_json(os.path.join(session_dir, RECORD),
                {"driver_pid": os.getpid(), "driver_started": _started_at(os.getpid()),
                 "reaper_pid": reaper.pid, "reaper_started": _started_at(reaper.pid)})
    lines.append(f"started a local Ray instance ({cpus:g} CPUs; session {session_dir}; {auth_mode()}; "
                 "it stops with this driver)")
    return "\n".join(lines)


def auth_mode() -> str:
    """Ray's token authentication as ray.init left it, in words: Ray's own warning about
    it is kept off the console (lifecycle.QUIET_LOGGER_LEVELS), so the tool says it."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return "token auth on (RAY_AUTH_MODE=disabled opts out)"
    return f"token auth {os.environ.get('RAY_AUTH_MODE') or 'off'}"


def shutdown() -> None:
    """``ray.shutdown()``; for the instance ``start`` started, also its reaper (which stops
    whatever of the instance ray.shutdown left) and its record."""
    global _current
    import ray

    ray.shutdown()
    instance, _current = _current, None
    if instance is None:
        return
    os.close(instance.pipe)
    try:
        instance.reaper.wait(timeout=REAPER_WAIT_S)
    except subprocess.TimeoutExpired:
        _remove(os.path.join(instance.session_dir, RECORD))
        return  # it goes on alone (its processes are not all gone): the folder stays until they are
    # The instance is gone: its session folder (logs, sockets, the runtime's files; 10-100 MB
    # a sweep) goes with it, and Ray's "session_latest" link if it names it.
    latest = os.path.join(os.path.dirname(instance.session_dir), "session_latest")
    if os.path.islink(latest) and os.path.realpath(latest) == os.path.realpath(instance.session_dir):
        _remove(latest)
    shutil.rmtree(instance.session_dir, ignore_errors=True)


def stop_stale_instances(temp_dir: str, keep: str = "") -> list[str]:
    """Stop every instance under ``temp_dir`` (Ray's temp directory) that a sweep driver
    started, whose driver and reaper are both gone and whose processes are still
    there; one line for each. ``keep``: a session directory left alone."""
    lines = []
    for record_path in sorted(glob.glob(os.path.join(temp_dir, "session_*", RECORD))):
        session_dir = os.path.dirname(record_path)
        if session_dir == keep:
            continue
        try:
            with open(record_path) as record_file:
                record = json.load(record_file)
        except (OSError, ValueError):
            continue  # being written, or not ours to judge
        if _alive(record.get("driver_pid"), record.get("driver_started")) or \
                _alive(record.get("reaper_pid"), record.get("reaper_started")):
            continue  # a sweep still running, or a reaper stopping it now
        pids = instance_processes(session_dir)
        if pids:
            stop_processes(pids)
            lines.append(f"stopped a Ray instance left running by a sweep driver that is gone (pid "
                         f"{record.get('driver_pid')}; session {session_dir}): {len(pids)} processes")
        _remove(record_path)
    return lines


def instance_processes(session_dir: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """The live processes of the Ray instance whose session directory is ``session_dir``:
    those whose command line names it or that hold a file open under it (every Ray
    process writes its logs there: the agents and workers, whose command lines Ray
    rewrites to "ray::...", and what a trial started with its output), and every
    process below them. ``exclude``: pids that are not (the driver itself logs there).
    Nothing else: not a Ray instance some other process started (a ``ray start``
    cluster, a notebook's ``ray.init()``)."""
    session_dir = session_dir.rstrip("/")
    named = re.compile(re.escape(session_dir) + r"(?=/|$)")
    table = process_table(include_zombies=False)  # a zombie is gone but for its exit status
    roots = [pid for pid in table
             if any(named.search(arg) for arg in command_line(pid) or ())
             or any(path.startswith(session_dir + "/") for path in open_paths(pid))]
    found = descendants(table, roots, exclude=(*exclude, os.getpid()))
    return sorted(found)


def stop_processes(pids: list[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM each, then SIGKILL what is still there after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        left = [pid for pid in pids if _running(pid)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while any(_running(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.1)


# ---- the reaper -------------------------------------------------------------------------

def _reap(driver_pid: int, session_dir: str) -> None:
    """Wait for the driver to end (its pipe on stdin closes, or its pid goes), then stop
    its instance. A stop that starts more of the instance's processes (a raylet starting
    a worker as it goes) is followed by another round.

    The kernel stops most of an instance with its driver (Ray gives the GCS, raylet and
    dashboard a parent-death signal; workers exit with their raylet); the reaper does not
    depend on any of it. It runs as ``python -m accelsweep.sweeps.driver.run.local_ray``
    in a session of its own (a signal to the driver's process group does not reach it).
    Only the driver holds the pipe's other end, and the kernel closes it however the
    driver ends, SIGKILL included; the pid is watched too, as a forked child may hold
    the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    driver_started = _started_at(driver_pid)
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            break  # the driver's end closed: it shut its instance down, or it died
        if not _alive(driver_pid, driver_started):
            break
    for _ in range(3):
        pids = instance_processes(session_dir, exclude=(driver_pid,))
        if not pids:
            break
        print(f"{time.strftime('%H:%M:%S')} driver {driver_pid} gone: stopping {len(pids)} processes {pids}",
              flush=True)
        stop_processes(pids)
    _remove(os.path.join(session_dir, RECORD))


def _started_at(pid: int) -> Optional[int]:
    stat = stat_of(pid)
    return stat.started if stat else None


def _running(pid: int) -> bool:
    stat = stat_of(pid)
    return stat is not None and stat.state != "Z"


def _alive(pid: Optional[int], started: Optional[int]) -> bool:
    return isinstance(pid, int) and _running(pid) and _started_at(pid) == started


def _write_json(path: str, values: dict) -> None:
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as out:
        json.dump(values, out)
    os.replace(partial, path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Stop a local Ray instance when the driver that started it ends.")
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("--session-dir", required=True)
    args = parser.parse_args(argv)
    _reap(args.driver_pid, args.session_dir)


if __name__ == "__main__":
    main()

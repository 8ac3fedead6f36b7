"""Faults only a cluster has, on the namespace hosts (sweeps/driver/ops/cluster_hosts.py):
two small sweeps, each with its driver in the head's namespace, trials on the worker hosts.

    sudo .venv/bin/python benchmarks/cluster_faults.py            # ~4-6 minutes on 2 cores
    sudo .venv/bin/python benchmarks/cluster_faults.py --down-s 40

1. A worker's link down and back: while a trial runs on asw-w1, its veth (the end in the
   bridge, ``asw-w1-r``) goes down for --down-s seconds, then up: a cable pulled and
   plugged back. What Ray did (the GCS's health checks, the node marked dead or not, the
   node back or not) is read from the head's GCS log and its node list.
2. The tracking store unreachable from the worker hosts: an ``mlflow server`` bound to the
   head namespace's own 127.0.0.1 (a worker's 127.0.0.1 is its own loopback), the driver
   pointed at it (also by MLFLOW_TRACKING_URI). Trap listeners sit where a trial that
   tried the store would knock: 127.0.0.1:<port> in each worker namespace and the head's
   10.77.0.1:<port>. Any connection to a trap is a finding, printed with its first bytes.

Each sweep is ``sweeps/neuron_vit.py --smoke --platform cpu``; the head declares 0 CPUs,
so its trials can only run on the workers. Each ends with the invariants of the resume
and fault tests: one MLflow run per trial, none RUNNING, no config measured twice, every
run with its status ended, and the Optuna study complete (one COMPLETE trial per run).

Prints a line per check and a PASS/FAIL summary; exits 1 on any failure, 2 when the
machine cannot make the hosts (not root, no ``ip netns``). The cluster is always torn
down (``hosts_cluster``), and the script checks that nothing of it is left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from accelsweep.sweeps.driver.ops import cluster_hosts
from accelsweep.sweeps.driver.ops.cluster_hosts import HostsCluster, hosts_cluster
from accelsweep.sweeps.driver.record.tracking import mlflow_client
from accelsweep.trainables.processes import command_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIAL_PROCESS = "ray::ImplicitFunc"  # the proctitle of a Tune function trial's actor
STORE_PORT = 5077  # the MLflow server's, on the head's 127.0.0.1; the traps' too
DRIVER_S = 300  # one small sweep, on 2 cores shared with others
ENDED = ("finished", "stopped early", "rejected", "failed", "cut by time budget")
# GCS log lines about a node's liveness (Ray 2.60's gcs_health_check_manager / gcs_node_manager).
LIVENESS = re.compile(r"health check|marked dead|mark.* dead|is dead|node.*(removed|dead|unregister)|"
                      r"register.*node|Node .* (failed|died)", re.IGNORECASE)

# A listener that accepts and records who connected and what they sent first.
TRAP = r"""
import socket, sys, threading, time
log = open(sys.argv[1], "a", buffering=1)
def serve(address, port):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(16)
    while True:
        conn, peer = server.accept()
        conn.settimeout(2.0)
        try:
            first = conn.recv(160)
        except OSError:
            first = b""
        log.write(f"{time.time():.1f} {address}:{port} <- {peer[0]}:{peer[1]} {first[:160]!r}\n")
        conn.close()
for address in sys.argv[3:]:
    threading.Thread(target=serve, args=(address, int(sys.argv[2])), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

CONNECT = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "answers")
    except OSError as error:
        print(target, type(error).__name__, error.strerror or error)
"""

HEALTH = r"""
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] + "/health", timeout=3).status)
except Exception as error:
    print(type(error).__name__)
"""


class Checks:
    """Each check a line (ok / FAIL), each observation a line (--); the summary at the end."""

    def __init__(self):
        self.results: list[tuple[str, bool]] = []
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, bool(ok)))
        self.say(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return bool(ok)

    def note(self, text: str) -> None:
        self.say(f"--   {text}")


def driver_env(cluster: HostsCluster, extra: Optional[dict] = None) -> dict:
    return {**cluster_hosts._clean_env(), **cluster.driver_env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def sweep_argv(tracking_uri: str, experiment: str, storage: str, samples: int, retries: int) -> list[str]:
    return [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--platform", "cpu", "--num-samples", str(samples),
            "--scheduler", "none", "--confirm-rounds", "0", "--local-search", "0", "--no-reject",
            "--retries", str(retries), "--windows", "3", "--window-s", "2", "--tracking-uri", tracking_uri,
            "--experiment", experiment, "--storage-path", storage]


def start_driver(cluster: HostsCluster, argv: list[str], log_path: str, extra_env: Optional[dict] = None):
    log = open(log_path, "w")
    return subprocess.Popen(cluster.command(cluster.head.name, [*argv, "--address", cluster.head_address]),
                            cwd=REPO, env=driver_env(cluster, extra_env), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(process: Optional[subprocess.Popen]) -> None:
    """End a process this script started (its session: it and what it started)."""
    if process is None or process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_driver(process: subprocess.Popen, timeout: float) -> Optional[int]:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        return None


def tail(path: str, lines: int = 25) -> str:
    with open(path, errors="replace") as file:
        return "".join(file.readlines()[-lines:])


def trial_pids(namespace: str) -> list[int]:
    return [pid for pid in cluster_hosts._namespace_pids(namespace)
            if (command_line(pid) or [""])[0].startswith(TRIAL_PROCESS)]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def in_namespace(cluster: HostsCluster, host: str, code: str, *args: str) -> str:
    done = cluster.run(host, [sys.executable, "-c", code, *args], timeout=60)
    return (done.stdout + done.stderr).strip()


# ---- the invariants ------------------------------------------------------------------

def check_store(checks: Checks, tracking_uri: str, experiment: str, samples: int, workers: set[str]) -> list:
    """One FINISHED parent; ``samples`` trial runs, none RUNNING, each ended, no config twice,
    on worker hosts only; the Optuna study one COMPLETE trial per run. The trial runs."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    client = mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if not checks.check(f"{experiment}: experiment in the store", found is not None):
        return []
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.data.tags.get("status") != "reused"]
    checks.check(f"{experiment}: one parent run, FINISHED", [p.info.status for p in parents] == ["FINISHED"],
                 str([p.info.status for p in parents]))
    numbers = [r.data.tags.get("trial_number") for r in trials]
    checks.check(f"{experiment}: one MLflow run per trial", len(trials) == samples and len(set(numbers)) == len(numbers),
                 f"{len(trials)} trial runs for {samples} trials, trial numbers {sorted(numbers, key=str)}")
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    checks.check(f"{experiment}: no run left RUNNING", not running, ", ".join(running) or "none")
    statuses = sorted(f"{r.info.status}/{r.data.tags.get('status')}" for r in trials)
    checks.check(f"{experiment}: every trial ended with its result",
                 all(r.info.status == "FINISHED" and r.data.tags.get("status") in ENDED for r in trials), str(statuses))
    measured = [r.data.tags.get("searched") for r in trials if r.data.tags.get("error_class") != "Lost"]
    checks.check(f"{experiment}: no config measured twice", len(measured) == len(set(measured)),
                 f"{len(set(measured))} distinct configs in {len(measured)} measured runs")
    nodes = sorted({r.data.tags.get("node_address", "?") for r in trials})
    checks.check(f"{experiment}: trials ran on worker hosts only", set(nodes) <= workers, ", ".join(nodes))
    if parents:
        tags = parents[0].data.tags
        study = optuna.load_study(study_name=tags["optuna_study"], storage=tags["optuna_storage"])
        states = sorted(str(t.state).split(".")[-1] for t in study.trials)
        linked = sorted(t.user_attrs.get("mlflow_run_id", "?") for t in study.trials)
        checks.check(f"{experiment}: Optuna study {tags['optuna_study']!r} complete, one trial per run",
                     states == ["COMPLETE"] * len(trials) and linked == sorted(r.info.run_id for r in trials),
                     f"{len(study.trials)} study trials, states {states}")
    return trials


# ---- scenario 1: a worker's link down and back ----------------------------------------

def gcs_liveness_lines(cluster: HostsCluster, since: float) -> list[str]:
    """The head's GCS log lines about nodes' liveness, logged after ``since`` (epoch s)."""
    found = []
    for path in sorted({os.path.realpath(path) for path in _session_logs(cluster, cluster.head.name, "gcs_server*.out")}):
        with open(path, errors="replace") as log:
            for line in log:
                stamp = _log_time(line)
                if stamp is not None and stamp >= since and LIVENESS.search(line):
                    found.append(line.strip())
    return found


def _session_logs(cluster: HostsCluster, host: str, pattern: str) -> list[str]:
    import glob

    # session_latest is a link to the session's own folder: each file once.
    return sorted({os.path.realpath(path) for path in
                   glob.glob(os.path.join(cluster.state_dir, host, "session_*", "logs", pattern))})


def _log_time(line: str) -> Optional[float]:
    """A Ray C++ log line's time: ``[2026-11-26 10:15:01,234 I 123 456] ...`` (local time)."""
    match = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if not match:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000


def link_down(checks: Checks, cluster: HostsCluster, work: str, down_s: float, samples: int) -> None:
    checks.say(f"== scenario 1: asw-w1's link down for {down_s:g} s while a trial runs there ==")
    folder = os.path.join(work, "link_down")
    os.makedirs(folder)
    uri = f"sqlite:///{folder}/mlflow.db"
    victim = cluster.host(f"{cluster_hosts.PREFIX}w1")
    started = time.monotonic()
    driver = start_driver(cluster, sweep_argv(uri, "link_down", os.path.join(folder, "ray"), samples, retries=2),
                          os.path.join(folder, "driver.log"))
    outage: dict = {}
    try:
        while driver.poll() is None and time.monotonic() - started < DRIVER_S:
            pids = trial_pids(victim.name)
            if pids:
                time.sleep(2.0)  # mid-trial: past its start
                outage["pids"] = trial_pids(victim.name) or pids
                outage["down_at"] = time.time()
                ip("link", "set", victim.root_link, "down")
                checks.note(f"trial process {outage['pids']} runs on {victim.name}: {victim.root_link} set down "
                            f"{time.monotonic() - started:.1f} s after the driver started")
                time.sleep(down_s)
                ip("link", "set", victim.root_link, "up")
                outage["up_at"] = time.time()
                alive = [pid for pid in outage["pids"] if os.path.exists(f"/proc/{pid}")]
                checks.note(f"{victim.root_link} up again after {outage['up_at'] - outage['down_at']:.1f} s; "
                            f"the trial's process on {victim.name} {'still alive' if alive else 'gone'}")
                break
            time.sleep(0.2)
        code = wait_driver(driver, max(10.0, DRIVER_S - (time.monotonic() - started)))
    finally:
        stop(driver)
        subprocess.run(["ip", "link", "set", victim.root_link, "up"], capture_output=True)  # however it ended
    elapsed = time.monotonic() - started
    checks.check("link_down: the link went down while a trial ran on asw-w1", "down_at" in outage)
    checks.check("link_down: the sweep ended by itself, exit 0", code == 0,
                 f"exit {code} after {elapsed:.0f} s" + ("" if code == 0 else "\n" + tail(f"{folder}/driver.log")))
    for line in open(os.path.join(folder, "driver.log"), errors="replace"):
        if line.startswith("[trial") or line.startswith("=="):
            checks.note("driver: " + line.strip()[:230])
    trials = check_store(checks, uri, "link_down", samples, {host.address for host in cluster.workers})
    retried = [r for r in trials if r.data.tags.get("retries")]
    for run in trials:
        checks.note(f"{run.info.run_name}: node {run.data.tags.get('node_address')}, status "
                    f"{run.data.tags.get('status')}, retries {run.data.tags.get('retries', '0')}")
    if "down_at" not in outage:
        return
    # What Ray did: the head's GCS log, and its node list now.
    lines = gcs_liveness_lines(cluster, outage["down_at"] - 1)
    for line in lines[:12]:
        checks.note("gcs: " + line[:260])
    if len(lines) > 12:
        checks.note(f"gcs: ... {len(lines) - 12} more liveness line(s)")
    failed = [line for line in lines if "Health check failed" in line]
    if failed:
        checks.note(f"Ray: {len(failed)} failed health check(s) of a node; the first logged "
                    f"{_log_time(failed[0]) - outage['down_at']:.1f} s after the link went down")
    else:
        checks.note("Ray: no failed health check in the GCS log during or after the outage")
    died = [line for line in lines if "Node is dead because" in line or "has been marked dead" in line]
    if died:
        checks.note(f"Ray: the GCS marked {victim.name}'s node dead {_log_time(died[0]) - outage['down_at']:.1f} s "
                    "after the link went down")
    # Nothing restarts a raylet here: a node the GCS marked dead is gone from its list for good.
    nodes = {node["address"] for node in cluster_hosts.alive_nodes(cluster)}
    dead = victim.address not in nodes
    checks.note(f"Ray lists alive now: {', '.join(sorted(nodes))}: {victim.name} "
                + ("was marked dead and did not rejoin (its raylet, told it is dead, exited)" if dead else
                   "was never marked dead: the same node went on once its link was back"))
    raylet = [line.strip() for path in _session_logs(cluster, victim.name, "raylet.out")
              for line in open(path, errors="replace")
              if re.search(r"marked.*dead|exiting|shutting down|killing", line, re.IGNORECASE)]
    for line in raylet[:3]:
        checks.note(f"{victim.name} raylet: {line[:240]}")
    if dead:
        checks.check("link_down: the trial cut off on asw-w1 was retried on the other worker",
                     bool(retried) and all(r.data.tags.get("node_address") != victim.address for r in retried),
                     ", ".join(f"{r.info.run_name} -> {r.data.tags.get('node_address')}" for r in retried) or "none")
    else:
        cut = [r for r in trials if r.data.tags.get("node_address") == victim.address]
        checks.note("no retry needed: the trial on asw-w1 went on and reported once the link was back "
                    f"({', '.join(r.info.run_name for r in cut) or 'none'} finished there)"
                    if not retried else f"retried: {[r.info.run_name for r in retried]}")
    checks.note(f"scenario 1 took {elapsed:.0f} s")


# ---- scenario 2: the tracking store unreachable from the worker hosts -----------------

def store_unreachable(checks: Checks, cluster: HostsCluster, work: str, samples: int) -> None:
    checks.say("== scenario 2: the MLflow server on the head's 127.0.0.1 only; workers cannot reach it ==")
    folder = os.path.join(work, "store")
    os.makedirs(folder)
    backend = f"sqlite:///{folder}/mlflow.db"
    uri = f"http://127.0.0.1:{STORE_PORT}"
    started = time.monotonic()
    server = driver = None
    traps: list[subprocess.Popen] = []
    trap_log = os.path.join(folder, "traps.log")
    open(trap_log, "w").close()
    try:
        server_log = open(os.path.join(folder, "server.log"), "w")
        server = subprocess.Popen(
            cluster.command(cluster.head.name, [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
                                                "--host", "127.0.0.1", "--port", str(STORE_PORT), "--workers", "1"]),
            cwd=folder, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**cluster_hosts._clean_env(), "MLFLOW_DISABLE_TELEMETRY": "true",
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + 180
        while in_namespace(cluster, cluster.head.name, HEALTH, uri) != "200":
            if server.poll() is not None or time.monotonic() > deadline:
                checks.check("store: the MLflow server serves on the head", False, tail(f"{folder}/server.log"))
                return
            time.sleep(1.0)
        checks.check("store: the MLflow server serves on asw-head's 127.0.0.1", True,
                     f"{uri}/health 200 from asw-head after {time.monotonic() - started:.1f} s")
        for host in cluster.workers:
            seen = in_namespace(cluster, host.name, CONNECT, f"127.0.0.1:{STORE_PORT}",
                                f"{cluster.head.address}:{STORE_PORT}")
            checks.check(f"store: unreachable from {host.name}", "answers" not in seen, seen.replace("\n", "; "))
        # Traps where a trial trying the store would knock (after the probe above, which they would catch).
        for host, addresses in [(host.name, ["127.0.0.1"]) for host in cluster.workers] + \
                [(cluster.head.name, [cluster.head.address])]:
            trap = subprocess.Popen(cluster.command(host, [sys.executable, "-c", TRAP, trap_log, str(STORE_PORT),
                                                           *addresses]),
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
            traps.append(trap)
            if trap.stdout.readline().strip() != "ready":
                checks.check(f"store: a trap listens in {host}", False)
                return
        checks.note(f"traps listen on 127.0.0.1:{STORE_PORT} in each worker and {cluster.head.address}:{STORE_PORT} "
                    "in asw-head")
        sweep_started = time.monotonic()
        driver = start_driver(cluster, sweep_argv(uri, "store_unreachable", os.path.join(folder, "ray"), samples,
                                                  retries=1),
                              os.path.join(folder, "driver.log"), {"MLFLOW_TRACKING_URI": uri})
        code = wait_driver(driver, DRIVER_S)
        checks.check("store: the sweep ended by itself, exit 0", code == 0,
                     f"exit {code} after {time.monotonic() - sweep_started:.0f} s"
                     + ("" if code == 0 else "\n" + tail(f"{folder}/driver.log")))
        for line in open(os.path.join(folder, "driver.log"), errors="replace"):
            if line.startswith("[trial") or line.startswith("==") or "tracking" in line.lower():
                checks.note("driver: " + line.strip()[:230])
    finally:
        for process in [driver, *traps]:
            stop(process)
        stop(server)
    knocks = open(trap_log).read().strip()
    checks.check("store: no trial tried to reach the tracking store", not knocks,
                 "no connection to any trap" if not knocks else "FINDING, connections:\n" + knocks)
    # The server is stopped: read its backend store directly (the same records it served).
    check_store(checks, backend, "store_unreachable", samples, {host.address for host in cluster.workers})
    checks.note(f"scenario 2 took {time.monotonic() - started:.0f} s")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--down-s", type=float, default=20.0, help="how long asw-w1's link stays down")
    parser.add_argument("--samples", type=int, default=4, help="trials in the link-down sweep")
    parser.add_argument("--store-samples", type=int, default=3, help="trials in the tracking-store sweep")
    parser.add_argument("--only", choices=["link", "store"], help="run one scenario")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, stores)")
    args = parser.parse_args(argv)
    reason = cluster_hosts.unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    checks = Checks()
    work = tempfile.mkdtemp(prefix="cluster-faults-")
    checks.note(f"working folder {work}")
    try:
        scenarios: list[Callable[[HostsCluster], None]] = []
        if args.only in (None, "link"):
            scenarios.append(lambda c: link_down(checks, c, work, args.down_s, args.samples))
        if args.only in (None, "store"):
            scenarios.append(lambda c: store_unreachable(checks, c, work, args.store_samples))
        with hosts_cluster(workers=2, worker_cpus=2, print_line=checks.note) as cluster:
            for scenario in scenarios:
                try:
                    scenario(cluster)
                except Exception as error:  # one scenario's crash is its failure; the next still runs
                    checks.check(f"scenario ran without an error", False, f"{type(error).__name__}: {error}")
    except Exception as error:
        checks.check("the cluster came up and went down", False, f"{type(error).__name__}: {error}")
    left = cluster_hosts.existing_namespaces() + cluster_hosts.existing_links() + cluster_hosts.state_dirs()
    checks.check("nothing of the cluster left", not left, ", ".join(left) or "no asw- namespace, link or state dir")
    if args.keep:
        checks.note(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    failed = [name for name, ok in checks.results if not ok]
    print(f"\n{'PASS' if not failed else 'FAIL'}: {len(checks.results) - len(failed)} of {len(checks.results)} checks "
          f"passed in {time.monotonic() - checks.started:.0f} s" + "".join(f"\n  failed: {name}" for name in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

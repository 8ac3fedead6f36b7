"""Several hosts on one machine: a Ray cluster whose head and worker nodes each live in a
network namespace of their own, with their own address, joined by a bridge.

    accelsweep hosts up     # head + 2 workers
    accelsweep hosts status
    accelsweep hosts down   # also after a crashed up

    with hosts_cluster() as cluster:      # always torn down, however the block ends
        cluster.run("asw-head", [sys.executable, "my_driver.py", cluster.head_address],
                    env=cluster.driver_env)

Why: a sweep across hosts runs code one address never does (nodes joining a head, token auth,
Ray Train's rendezvous at rank 0's address, gloo's sockets); each namespace has its own
interfaces, routes, ports and loopback. Needs root and iproute2's ``ip netns``; Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

from accelsweep.trainables.processes import command_line, descendants, process_table, stat_of

__all__ = ["BRIDGE", "GCS_PORT", "HEAD", "PREFIX", "Host", "HostsCluster", "HostsUnavailable", "down", "hosts_cluster",
           "hosts_network", "plan_hosts", "status", "unavailable_reason", "up"]

# The layout. PREFIX names everything, so ``down`` finds it all by name, even after an ``up``
# that crashed halfway:
#
#   root namespace: bridge asw-br0 at 10.77.0.254/24 (no forwarding, no other route)
#     asw-head  10.77.0.1   ray start --head  (0 CPUs: like cluster.yaml's head, it runs the
#                                              driver, never a trial's workers)
#     asw-w1    10.77.0.11  ray start --address=10.77.0.1:6379, resource host:asw-w1
#     asw-w2    10.77.0.12  ray start --address=10.77.0.1:6379, resource host:asw-w2
#
# Each namespace has its loopback and one veth end (``<host>-n``) in the bridge; its only
# route is the subnet's own, so traffic goes to those addresses and loopback only, nothing
# can quietly use 127.0.0.1 across hosts, and no port clashes with a Ray instance already
# running here.
PREFIX = "asw-"  # every namespace, link and state directory this module makes starts with it
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.77.0.0/24"  # private (RFC 1918); refused if any route here already covers it
PREFIX_LENGTH = 24
BRIDGE_ADDRESS = "10.77.0.254"
HEAD = f"{PREFIX}head"
HEAD_ADDRESS = "10.77.0.1"
GCS_PORT = 6379  # cluster.yaml's --port
OBJECT_MANAGER_PORT = 8076  # cluster.yaml's; each namespace has its own ports, so fixed ports cannot clash
STATE_FILE = "asw-cluster.json"  # marks a state directory as this module's (down removes only those)
# Ray sizes each node's object store at 30% of the machine's memory; three nodes on one
# machine would each claim that much of /dev/shm. The trials here move kilobytes.
OBJECT_STORE_BYTES = 200 * 1024 * 1024
RAY_START_TIMEOUT_S = 120.0
NODES_TIMEOUT_S = 60.0
GRACE_S = 5.0  # between SIGTERM and SIGKILL: Ray's processes exit well within it when asked
KILL_WAIT_S = 10.0


class HostsUnavailable(RuntimeError):
    """This machine cannot make the namespaces (not root, no ``ip netns``), or a cluster of
    this module is up already; the message says which and what to do."""


@dataclass(frozen=True)
class Host:
    """One "host": a network namespace, its address, and the Ray node in it."""

    name: str  # the namespace's name; also its Ray resource "host:<name>"
    address: str
    role: str  # "head" or "worker"
    cpus: int  # the CPUs its Ray node declares

    @property
    def resource(self) -> str:
        """The custom resource naming this host (1 of it on its node): place work with it."""
        return f"host:{self.name}"

    @property
    def root_link(self) -> str:
        """The veth end in the root namespace, in the bridge."""
        return f"{self.name}-r"

    @property
    def link(self) -> str:
        """The veth end inside the namespace, holding the host's address."""
        return f"{self.name}-n"


def plan_hosts(workers: int = 2, worker_cpus: int = 2) -> list[Host]:
    """The head and ``workers`` worker hosts. Interface names are at most 15 characters
    (IFNAMSIZ), which caps the worker count well above what one machine runs."""
    if not 1 <= workers <= 9:
        raise ValueError(f"workers must be from 1 to 9; got {workers!r}")
    return [Host(HEAD, HEAD_ADDRESS, "head", 0)] + [
        Host(f"{PREFIX}w{index}", f"10.77.0.{10 + index}", "worker", worker_cpus) for index in range(1, workers + 1)]


@dataclass
class HostsCluster:
    """A running cluster: its hosts, where its state lives, and how to drive it."""

    hosts: list[Host]
    state_dir: str
    # The sockets each host listened on once it was up ("address:port"), for checks that
    # nothing listens there after ``down``.
    listening: dict[str, list[str]] = field(default_factory=dict)

    @property
    def head(self) -> Host:
        return next(host for host in self.hosts if host.role == "head")

    @property
    def workers(self) -> list[Host]:
        return [host for host in self.hosts if host.role == "worker"]

    @property
    def head_address(self) -> str:
        """What ``ray.init(address=...)`` and ``ray start --address`` take."""
        return f"{self.head.address}:{GCS_PORT}"

    @property
    def token_path(self) -> str:
        return os.path.join(self.state_dir, "auth_token")

    @property
    def driver_env(self) -> dict[str, str]:
        """The variables a driver needs beside its own environment: token auth on, the
        cluster's token (by path, so the token itself is in no process's environment)."""
        return {**self.auth_env, "RAY_ADDRESS": self.head_address}

    @property
    def auth_env(self) -> dict[str, str]:
        """Token auth on, with this cluster's token: every node's and every driver's."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in this cluster; its hosts: {', '.join(h.name for h in self.hosts)}")

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.host(host).name, *argv]

    def run(self, host: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
            timeout: float = 300.0, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host``'s namespace with this environment plus ``env``; its
        output captured as text unless ``kwargs`` say otherwise. Raises
        subprocess.TimeoutExpired past ``timeout`` (the child is killed). A driver runs in
        the head's namespace (``run(HEAD, ...)`` with ``driver_env``), as on a real
        cluster's head: Ray attaches a driver to a raylet on its own host, so a process in
        the root namespace (no raylet there) cannot be one."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(host, argv), env={**_clean_env(), **(env or {})}, timeout=timeout,
                              **kwargs)

    def processes(self) -> dict[str, list[int]]:
        """Host name -> the pids inside its namespace now."""
        return {host.name: _namespace_pids(host.name) for host in self.hosts}

    def to_json(self) -> dict:
        return {"hosts": [vars(host) for host in self.hosts], "state_dir": self.state_dir, "listening": self.listening}

    @classmethod
    def from_json(cls, data: Mapping) -> "HostsCluster":
        return cls([Host(**host) for host in data["hosts"]], data["state_dir"], dict(data.get("listening", {})))


# ---- preconditions -------------------------------------------------------------------

def unavailable_reason() -> Optional[str]:
    """Why this machine cannot make the hosts (None: it can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only; this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root (ip netns add); run as root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns list` failed: {probe.stderr.strip()}"
    return None


def _refuse_if_taken() -> None:
    """A cluster of this module already up (or left by a crash), or another owner of the
    subnet: either would be torn down or shadowed by a second ``up``."""
    left = existing_namespaces() + existing_links()
    if left:
        raise HostsUnavailable(f"{', '.join(left)} exist already (a cluster is up, or a crashed up left them): "
                               f"run `python -m {__spec__.name if __spec__ else __name__} down` first")
    routes = _ip("-o", "-4", "route", "show", "to", "match", HEAD_ADDRESS).stdout
    other = [line for line in routes.splitlines() if not line.startswith("default")]
    if other:
        raise HostsUnavailable(f"{SUBNET} is routed here already ({other[0].strip()}); this module uses that subnet "
                               "only when no interface of the machine does")


# ---- up ------------------------------------------------------------------------------

def up(workers: int = 2, worker_cpus: int = 2, print_line=print) -> HostsCluster:
    """Make the namespaces and the bridge, start Ray in each (head first), wait until every
    node is alive. On any failure everything made so far is torn down before the error
    propagates. The nodes start the way cluster.yaml's head_start_ray_commands /
    worker_start_ray_commands start them, with Ray's token auth on: a token generated for
    this cluster in a private state directory (``/tmp/asw-cluster-*``, mode 0700), handed
    to every node and to the driver by ``RAY_AUTH_TOKEN_PATH`` (read by Ray's C++ token
    loader), never written to ``~/.ray``."""
    reason = unavailable_reason()
    if reason:
        raise HostsUnavailable(reason)
    _refuse_if_taken()
    state_dir = tempfile.mkdtemp(prefix=f"{PREFIX}cluster-")  # mode 0700: the token's home
    cluster = HostsCluster(plan_hosts(workers, worker_cpus), state_dir)
    _write_state(cluster)  # first: a crashed up leaves a directory down can recognise
    try:
        _write_token(cluster.token_path)
        _make_network(cluster.hosts)
        print_line(f"network: bridge {BRIDGE} {BRIDGE_ADDRESS}/{PREFIX_LENGTH}; "
                   + ", ".join(f"{host.name} {host.address}" for host in cluster.hosts))
        for host in cluster.hosts:
            started = time.monotonic()
            _start_ray(cluster, host)
            print_line(f"ray {host.role} on {host.name} ({host.address}, {host.cpus} CPUs, {host.resource}) "
                       f"started in {time.monotonic() - started:.1f} s")
        _wait_for_nodes(cluster)
        cluster.listening = {host.name: listening_sockets(host.name) for host in cluster.hosts}
        _write_state(cluster)
    except BaseException:
        for line in down():
            print_line(line)
        raise
    return cluster


def _write_state(cluster: HostsCluster) -> None:
    with open(os.path.join(cluster.state_dir, STATE_FILE), "w") as state:
        json.dump(cluster.to_json(), state, indent=1)


def _write_token(path: str) -> None:
    """A fresh token for this cluster only, readable by its owner only; the same 256 bits
    of entropy as ``ray get-auth-token --generate``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as token:
        token.write(secrets.token_hex(32))


def _make_network(hosts: Sequence[Host]) -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for host in hosts:
        _ip("netns", "add", host.name)
        _ip("link", "add", host.root_link, "type", "veth", "peer", "name", host.link)
        _ip("link", "set", host.link, "netns", host.name)
        _ip("link", "set", host.root_link, "master", BRIDGE)
        _ip("link", "set", host.root_link, "up")
        _ip("-n", host.name, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", host.link)
        _ip("-n", host.name, "link", "set", host.link, "up")
        # Ray's processes talk to their own node's agents over loopback too.
        _ip("-n", host.name, "link", "set", "lo", "up")


def _ray_executable() -> str:
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.access(ray, os.X_OK):
        raise HostsUnavailable(f"no `ray` command beside {sys.executable}: install ray[default] in this environment")
    return ray


def node_env(cluster: HostsCluster, host: Host) -> dict[str, str]:
    """The environment of ``ray start`` on ``host``; the raylet passes it on to every
    worker process there."""
    return {**_clean_env(), **cluster.auth_env, "RAY_USAGE_STATS_ENABLED": "0",
            # torch's gloo binds the address this machine's hostname resolves to, and falls
            # back to loopback when that is not an address of the namespace. Here the
            # hostname resolves to 127.0.0.1 (/etc/hosts) on every host, so each rank would
            # announce a loopback address the others cannot reach: name the interface that
            # carries the host's address instead. (Ray Train's MASTER_ADDR is already right:
            # rank 0's node address, ray.util.get_node_ip_address.)
            "GLOO_SOCKET_IFNAME": host.link}


def _start_ray(cluster: HostsCluster, host: Host) -> None:
    # No `ray stop` first, unlike cluster.yaml: on this machine it would stop every Ray
    # instance, other users' included. `up` refuses to start beside anything of its own instead.
    common = [f"--node-ip-address={host.address}", f"--object-manager-port={OBJECT_MANAGER_PORT}",
              f"--num-cpus={host.cpus}", f"--resources={json.dumps({host.resource: 1})}",
              f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
              # Its own temp dir: its logs and session are attributable to it (and to this cluster).
              f"--temp-dir={os.path.join(cluster.state_dir, host.name)}"]
    if host.role == "head":
        # The dashboard (and the state API it serves) on the head's loopback only, as in cluster.yaml.
        role = ["--head", f"--port={GCS_PORT}", "--dashboard-host=127.0.0.1"]
    else:
        role = [f"--address={cluster.head_address}"]
    done = cluster.run(host.name, [_ray_executable(), "start", *role, *common], env=node_env(cluster, host),
                       timeout=RAY_START_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ray start on {host.name} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")


# The driver that checks the nodes: run in the head's namespace (Ray drivers attach to
# the raylet of their own host).
_NODES_PROBE = """
import json, ray
ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)
print(json.dumps([{{"address": n["NodeManagerAddress"], "resources": n["Resources"]}}
                  for n in ray.nodes() if n["Alive"]]))
"""


def alive_nodes(cluster: HostsCluster, timeout: float = NODES_TIMEOUT_S) -> list[dict]:
    """The cluster's alive nodes as its GCS lists them (address, resources), asked by a
    driver in the head's namespace."""
    done = cluster.run(cluster.head.name, [sys.executable, "-c", _NODES_PROBE.format(address=cluster.head_address)],
                       env=cluster.driver_env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the node probe on {cluster.head.name} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _wait_for_nodes(cluster: HostsCluster, timeout: float = NODES_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    wanted = {host.address for host in cluster.hosts}
    while True:
        seen = {node["address"] for node in alive_nodes(cluster, timeout=max(5.0, deadline - time.monotonic()))}
        if wanted <= seen:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout:g} s the head lists nodes {sorted(seen)}, not {sorted(wanted)}")
        time.sleep(1.0)


# ---- down ----------------------------------------------------------------------------

def existing_namespaces() -> list[str]:
    """Namespaces with this module's prefix (``ip netns list`` prints "name (id: n)")."""
    listed = _ip("netns", "list", check=False).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.startswith(PREFIX))


def existing_links() -> list[str]:
    """Links of the root namespace with this module's prefix (a veth shows as "name@peer")."""
    listed = _ip("-o", "link", "show", check=False).stdout
    names = (line.split(":", 2)[1].strip().split("@")[0] for line in listed.splitlines() if ":" in line)
    return sorted(name for name in names if name.startswith(PREFIX))


def state_dirs() -> list[str]:
    """This module's state directories (those holding its state file)."""
    pattern = os.path.join(tempfile.gettempdir(), f"{PREFIX}cluster-*", STATE_FILE)
    return sorted(os.path.dirname(path) for path in glob.glob(pattern))


def cluster_processes() -> set[int]:
    """Every live process the cluster started: those inside its namespaces, those whose
    command line names one of its state directories (none should have left its namespace;
    this catches one that did), and every process below them."""
    table = process_table(include_zombies=False)
    roots = {pid for name in existing_namespaces() for pid in _namespace_pids(name)}
    dirs = state_dirs()
    for pid in table:
        argv = command_line(pid) or []
        if any(directory in arg for directory in dirs for arg in argv):
            roots.add(pid)
    roots.discard(os.getpid())  # a caller inside a namespace (a test's driver) stops itself otherwise
    return descendants(table, roots, exclude=(os.getpid(),))


def down(print_line=None) -> list[str]:
    """Stop every process of the cluster, delete its namespaces, links and state
    directories. Idempotent, and finds everything by name, so it also cleans up after an
    ``up`` that crashed (or a process that was killed before it could). Returns what it
    did, one line each; raises if anything is left. It kills exactly what the cluster
    started (``cluster_processes``), collected before any is signalled (SIGTERM, then
    SIGKILL)."""
    lines: list[str] = []
    pids = cluster_processes()
    if pids:
        left = _stop_processes(pids)
        lines.append(f"stopped {len(pids) - len(left)} process(es) of the cluster")
        if left:
            raise RuntimeError(f"processes {sorted(left)} of the cluster outlived SIGKILL for {KILL_WAIT_S:g} s")
    namespaces = existing_namespaces()
    for name in namespaces:
        _ip("netns", "delete", name, check=False)  # takes the veth ends inside it, and so their peers
    links = existing_links()
    for link in links:
        _ip("link", "delete", link, check=False)
    if namespaces or links:
        lines.append(f"deleted namespaces {', '.join(namespaces) or 'none'}; links {', '.join(links) or 'none'}")
    dirs = state_dirs()
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)
    if dirs:
        lines.append(f"removed {', '.join(dirs)}")
    remaining = existing_namespaces() + existing_links() + state_dirs()
    if remaining:
        raise RuntimeError(f"down left {', '.join(remaining)}")
    lines = lines or ["nothing of a hosts cluster was here"]
    for line in lines:
        (print_line or (lambda _: None))(line)
    return lines


def _stop_processes(pids: set[int]) -> set[int]:
    """SIGTERM, then SIGKILL after ``GRACE_S``; the pids still alive after that. A pid is
    followed by its start time, so a pid reused meanwhile is never signalled."""
    started = {pid: stat.started for pid in pids if (stat := stat_of(pid)) is not None}

    def alive() -> set[int]:
        return {pid for pid, when in started.items()
                if (stat := stat_of(pid)) is not None and stat.started == when and stat.state != "Z"}

    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        for pid in alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive():
            return set()
    return alive()


# ---- status --------------------------------------------------------------------------

def listening_sockets(namespace: str) -> list[str]:
    """The TCP sockets listening inside ``namespace`` ("address:port")."""
    done = _ip("netns", "exec", namespace, "ss", "-H", "-l", "-t", "-n", check=False)
    return sorted(line.split()[3] for line in done.stdout.splitlines() if len(line.split()) >= 4)


def head_reachable(timeout: float = 2.0) -> bool:
    """Whether the head's GCS port answers from the root namespace, over the bridge. The
    socket is bound to the bridge's address first: without the bridge that fails, and no
    packet takes the machine's default route to whatever answers there for 10.77.0.1."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        probe.bind((BRIDGE_ADDRESS, 0))
        probe.connect((HEAD_ADDRESS, GCS_PORT))
        return True
    return False


def status(print_line=print) -> list[str]:
    """What of a hosts cluster is here: per host its namespace, address, processes and
    listening sockets, and the nodes Ray lists as alive."""
    lines = []
    dirs = state_dirs()
    namespaces = existing_namespaces()
    if not dirs and not namespaces and not existing_links():
        lines.append("no hosts cluster here")
    for directory in dirs:
        with open(os.path.join(directory, STATE_FILE)) as state:
            cluster = HostsCluster.from_json(json.load(state))
        lines.append(f"cluster in {directory}: head {cluster.head_address}; driver env "
                     + " ".join(f"{k}={v}" for k, v in cluster.driver_env.items()))
        for host in cluster.hosts:
            if host.name not in namespaces:
                lines.append(f"  {host.name:9} {host.address:12} namespace missing")
                continue
            lines.append(f"  {host.name:9} {host.address:12} {host.role:6} {len(_namespace_pids(host.name))} "
                         f"processes; listening {' '.join(listening_sockets(host.name)) or 'nothing'}")
        lines.append(f"  GCS {cluster.head_address} from the root namespace: "
                     f"{'reachable' if head_reachable() else 'NOT reachable'}")
        if cluster.head.name in namespaces:
            try:
                nodes = alive_nodes(cluster, timeout=60.0)
                lines.append(f"  Ray lists {len(nodes)} alive node(s): "
                             + ", ".join(f"{n['address']} ({_custom(n['resources'])})" for n in nodes))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                lines.append(f"  Ray's node list: not available ({str(error).splitlines()[0]})")
    stray = sorted(set(namespaces + existing_links()) - {name for d in dirs for name in _names_of(d)})
    if stray:
        lines.append(f"without a state directory (a crashed up; `down` removes them): {', '.join(stray)}")
    for line in lines:
        print_line(line)
    return lines


def _custom(resources: Mapping[str, float]) -> str:
    cpus = resources.get("CPU", 0)
    hosts = [name for name in resources if name.startswith("host:")]
    return f"{cpus:g} CPU, {', '.join(hosts)}"


def _names_of(state_dir: str) -> list[str]:
    with open(os.path.join(state_dir, STATE_FILE)) as state:
        cluster = HostsCluster.from_json(json.load(state))
    return [BRIDGE] + [name for host in cluster.hosts for name in (host.name, host.root_link)]


# ---- the context manager -------------------------------------------------------------

@contextlib.contextmanager
def hosts_cluster(workers: int = 2, worker_cpus: int = 2, print_line=None) -> Iterator[HostsCluster]:
    """``up``, yield the cluster, and ``down`` however the block ends."""
    quiet = print_line or (lambda _: None)
    try:
        yield up(workers, worker_cpus, print_line=quiet)
    finally:
        down(print_line=quiet)


@contextlib.contextmanager
def hosts_network(workers: int = 2) -> Iterator[list[Host]]:
    """The hosts' namespaces, addresses and bridge without Ray: for processes that bring
    their own (a sweep driver with a private local Ray on each host). ``down`` after,
    which stops whatever still runs inside them."""
    reason = unavailable_reason()
    if reason:
        raise HostsUnavailable(reason)
    _refuse_if_taken()
    hosts = plan_hosts(workers)
    try:
        _make_network(hosts)
        yield hosts
    finally:
        down()


# ---- helpers -------------------------------------------------------------------------

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def _namespace_pids(name: str) -> list[int]:
    done = _ip("netns", "pids", name, check=False)
    return [int(pid) for pid in done.stdout.split() if pid.isdigit()]


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point Ray elsewhere: another cluster's
    address, a token of another cluster, an opt-out of token auth, Ray's switch that
    refuses multi-node clusters (set by a driver of a loopback cluster, local_cluster.py)."""
    dropped = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    return {key: value for key, value in os.environ.items() if key not in dropped}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accelsweep hosts",
        description="A Ray cluster across network namespaces on this machine: a head and worker 'hosts', "
                    f"each with its own address in {SUBNET}, token auth on. Needs root.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="make the hosts and start Ray in each (left running; `down` stops it)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    start.add_argument("--workers", type=int, default=2, help="worker hosts")
    start.add_argument("--worker-cpus", type=int, default=2, help="CPUs each worker node declares")
    commands.add_parser("down", help="stop everything a hosts cluster started and remove its namespaces, links "
                                     "and state (also after a crashed up)")
    commands.add_parser("status", help="what of a hosts cluster is here, and the nodes Ray lists")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = up(args.workers, args.worker_cpus)
            print(f"up: head {cluster.head_address}. Run a driver on the head:\n"
                  f"  ip netns exec {cluster.head.name} env "
                  + " ".join(f"{k}={v}" for k, v in cluster.driver_env.items())
                  + f" {sys.executable} <script> --address {cluster.head_address}")
        elif args.command == "down":
            down(print_line=print)
        else:
            status()
    except HostsUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

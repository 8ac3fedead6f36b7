"""Checks that need the machine or the network, made before Ray starts any trial.

``plan_sweep`` checks what a sweep says; this module checks it against where it will
run. Two mistakes otherwise cost minutes or hang:

- an unreachable ``--address``: ``ray.init`` keeps retrying the GCS for minutes, even
  for a closed port on 127.0.0.1;
- a trial that needs more CPUs, GPUs or NeuronCores than a local Ray instance has: with
  no autoscaler to add a node, Tune waits for them forever.

``plan.preflight`` runs them (``run_sweep`` runs that first):
the checks take the plan; this module imports nothing of the driver.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Mapping, Optional
from urllib.parse import urlsplit

from accelsweep.trainables import ray_adapter
from accelsweep.trainables.errors import ConfigError

if TYPE_CHECKING:
    from accelsweep.sweeps.driver.define.plan import Plan

ADDRESS_ALLOWED = "a reachable Ray cluster address (host:port, ray://host:port or auto)"
# A TCP handshake is one round trip; RFC 6298's initial retransmission timeout is 1 s,
# so 3 s lets a lost SYN be sent again and answered. A closed port answers at once.
CONNECT_TIMEOUT_S = 3.0
# The resources a local Ray instance finds on this machine and a trial can ask for.
LOCAL_DEVICE_RESOURCES = ("CPU", "GPU", "neuron_cores", "TPU")
LOCAL_FIT_SAMPLES = 64  # configs of the space checked, as plan_sweep does

__all__ = ["check_fits_locally", "check_ray_address", "check_running_ray", "local_resources"]


def _host_port(address: str) -> tuple[str, int]:
    """host and port of ``host:port``, ``[v6]:port`` or ``ray://host:port``."""
    parsed = urlsplit(address if "://" in address else f"//{address}")
    if parsed.scheme not in ("", "ray") or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(address)
    port = parsed.port  # raises ValueError for a port that is not a number in 0-65535
    if not port:
        raise ValueError(address)
    return parsed.hostname, port


def check_ray_address(address: Optional[str], timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse an address that no Ray cluster answers at. None and "local" start a local
    instance: nothing to reach. "auto" is resolved the way ray.init resolves it."""
    if address is None or address == "local":
        return
    given = address
    # A loopback cluster (accelsweep cluster up) is checked where it is: Ray's own
    # resolution would turn 127.0.0.1 into this machine's interface address.
    address = ray_adapter.loopback_address(address) or address
    if address == "auto":
        try:
            # $RAY_ADDRESS, else the cluster the last `ray start` on this machine recorded.
            address = ray_adapter.resolve_auto_address()
        except ConnectionError as error:
            raise ConfigError("address", ADDRESS_ALLOWED, given,
                              f"{error} Start one (`ray start --head`, `ray up cluster.yaml`), or leave --address "
                              "out to run on a private local instance.") from None
    try:
        host, port = _host_port(address)
    except ValueError:
        raise ConfigError("address", ADDRESS_ALLOWED, given, "It is not of that form.") from None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as error:
        where = f" ({address})" if address != given else ""
        raise ConfigError("address", ADDRESS_ALLOWED, given,
                          f"Nothing answers at {host}:{port}{where} within {timeout_s:g} s: {error}. "
                          "Is the cluster up (`ray status` on its head) and its port open to this machine?") from None


def check_running_ray(address: Optional[str], running: str) -> None:
    """A sweep that names an address while this process is connected to Ray already
    (``running``: that instance's GCS address) must name that instance: ray.init is not
    called again, so the sweep would run there whatever the address said. None, "local"
    and "auto" take the instance that is there. A ``ray://`` address is the client port of
    a cluster's head, not its GCS port: its host alone must match."""
    if address is None or address in ("local", "auto"):
        return
    try:
        host, port = _host_port(address)
    except ValueError:
        raise ConfigError("address", ADDRESS_ALLOWED, address, "It is not of that form.") from None
    running_host, running_port = _host_port(running)
    same_port = address.startswith("ray://") or port == running_port
    if not (same_port and _same_host(host, running_host)):
        raise ConfigError("address", f"the address of the Ray instance this process is connected to ({running}), "
                                     "or auto", address,
                          f"Ray is initialised already in this process, at {running}, and a sweep does not connect "
                          f"again: it would run there, not at {address}. Call ray.shutdown() first to use another "
                          "cluster, or leave the address out to use this one.")


def _same_host(a: str, b: str) -> bool:
    """Two host names or addresses of one machine (this one's loopback and own
    addresses count as one: a local GCS reports the node's address, not 127.0.0.1)."""
    a_ip, b_ip = _ip_of(a), _ip_of(b)
    if a_ip == b_ip:
        return True
    here = _addresses_of_this_machine()
    return all(ip in here or ip.startswith("127.") for ip in (a_ip, b_ip))


def _ip_of(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _addresses_of_this_machine() -> set[str]:
    addresses = {"::1"}
    try:
        addresses.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    import ray.util

    addresses.add(ray.util.get_node_ip_address())  # what a local Ray node reports as its own
    return addresses


def local_resources() -> dict[str, float]:
    """What a local Ray instance started here will have, by Ray's own detection (so the
    check agrees with ray.init: CPU counts respect container CPU limits)."""
    found = {"CPU": float(ray_adapter.local_cpus())}
    for resource in ("GPU", "neuron_cores", "TPU"):
        found[resource] = float(ray_adapter.local_accelerators(resource))
    return found


def check_fits_locally(plan: "Plan", local: Optional[Mapping[str, float]] = None) -> None:
    """Refuse a local sweep whose trials need more CPUs, GPUs or NeuronCores than this
    machine has. Local runs only: a cluster's nodes, not this machine, are its limit."""
    local = local_resources() if local is None else local
    points = [plan.baseline_point] + plan.space.sample(LOCAL_FIT_SAMPLES, seed=plan.sweep.seed)
    for point in points:
        config = plan.config_for(point)
        needs = plan.resources_of(point)
        for resource in LOCAL_DEVICE_RESOURCES:
            needed, present = needs.get(resource, 0), local.get(resource, 0)
            if needed <= present:
                continue
            workers = getattr(config, "workers", 1)
            unit = {"CPU": "CPUs", "GPU": "GPUs", "neuron_cores": "NeuronCores", "TPU": "TPU chips"}[resource]
            if present == 0 and resource != "CPU":
                raise ConfigError("platform", f"a platform whose devices this machine has (it has no {unit}; a local "
                                              "run)", config.platform,
                                  "Tune would wait forever for them: pass --address to run on a cluster that has "
                                  "them, or --dry-run to plan the sweep here.")
            if resource == "CPU":
                field, given = "cpus_per_worker x workers", f"{needed / workers:g} x {workers}"
                lower = "cpus_per_worker (--cpus-per-worker) or workers"
            else:  # one GPU, NeuronCore or TPU chip per worker
                field, given, lower = "workers", workers, "workers"
            hint = (f"A local run has this machine only, and Tune would wait forever for the rest: lower {lower}, "
                    "or pass --address to run on a cluster.")
            if point is not plan.baseline_point:
                hint = f"The search space proposes {point}. {hint}"
            raise ConfigError(field, f"at most {present:g} (the {unit} of this machine; a local run)", given, hint)


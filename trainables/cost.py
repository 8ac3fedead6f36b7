"""What a trial costs, and on what basis.

A trial costs the instance's hourly price times its share of the instance (the units
of the priced resource it holds / the units the instance has) times its wall time,
compile included. The basis (instance type, price, its source and date, the share) is
recorded with every trial. With no basis there is no cost: metrics are NaN and the
output says how to supply one. Nothing is guessed.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Mapping, Optional

from accelsweep.trainables.errors import ConfigError, positive_float

__all__ = ["NO_BASIS_CLI_HINT", "NO_BASIS_HINT", "PRICE_TABLE", "CostBasis", "price_advice", "resolve_cost_basis"]

PRICE_TABLE_DATE = "2026-11-01"
PRICE_TABLE_BASIS = f"price table {PRICE_TABLE_DATE}"  # a CostBasis's source when the table priced it
PRICE_TABLE_SOURCE = ("AWS EC2 On-Demand Linux prices, us-east-1 (aws.amazon.com/ec2/pricing/on-demand/), "
                      "as quoted in the seed posts and checked on the date given; spot and other regions differ")


@dataclass(frozen=True)
class InstancePrice:
    usd_per_hour: float
    vcpus: int
    accelerators: Mapping[str, int] = field(default_factory=dict)  # Ray resource -> count
    # The GPU's model as EC2 names it (DescribeInstanceTypes' GpuInfo): Ray's AWS node provider
    # turns it into the node's "accelerator_type:<model>" resource (local_cluster.py mirrors that).
    gpu_model: Optional[str] = None

    def units(self) -> dict[str, float]:
        return {"CPU": float(self.vcpus), **{k: float(v) for k, v in self.accelerators.items()}}


PRICE_TABLE: dict[str, InstancePrice] = {
    "trn1.2xlarge": InstancePrice(1.34, 8, {"neuron_cores": 2}),
    "trn1.32xlarge": InstancePrice(21.50, 128, {"neuron_cores": 32}),
    "trn1n.32xlarge": InstancePrice(24.78, 128, {"neuron_cores": 32}),
    "inf2.xlarge": InstancePrice(0.758, 4, {"neuron_cores": 2}),
    "g5.xlarge": InstancePrice(1.006, 4, {"GPU": 1}, gpu_model="A10G"),
    "g5.2xlarge": InstancePrice(1.212, 8, {"GPU": 1}, gpu_model="A10G"),
    "c7i.xlarge": InstancePrice(0.1785, 4),
    "c7i.2xlarge": InstancePrice(0.357, 8),
    "m7i.2xlarge": InstancePrice(0.4032, 8),  # cluster.yaml's head
}

# EC2 instance metadata (IMDSv2). Queried only on a machine whose firmware says it is
# an EC2 instance, so nothing is sent anywhere on other machines.
IMDS_URL = "http://169.254.169.254"
_EC2_DMI_FILES = ("/sys/devices/virtual/dmi/id/sys_vendor", "/sys/devices/virtual/dmi/id/board_vendor")


def looks_like_ec2() -> bool:
    for path in _EC2_DMI_FILES:
        try:
            with open(path) as vendor:
                if "amazon" in vendor.read().lower():
                    return True
        except OSError:
            continue
    return False


def instance_type_from_imds(base_url: str = IMDS_URL, timeout_s: float = 0.5) -> Optional[str]:
    """The instance type from EC2 instance metadata (IMDSv2), or None if it cannot be read
    within the timeout."""
    try:
        token_request = urllib.request.Request(
            f"{base_url}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(token_request, timeout=timeout_s) as response:
            token = response.read().decode()
        type_request = urllib.request.Request(
            f"{base_url}/latest/meta-data/instance-type", headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(type_request, timeout=timeout_s) as response:
            return response.read().decode().strip() or None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def detect_instance_type() -> Optional[str]:
    return instance_type_from_imds() if looks_like_ec2() else None


@dataclass(frozen=True)
class CostBasis:
    usd_per_hour: float  # the whole instance
    units: Mapping[str, float]  # what the instance has, per Ray resource
    source: str
    instance_type: Optional[str] = None

    def priced_unit(self, resources: Mapping[str, float]) -> str:
        """The resource a trial's share is counted in: the accelerator it holds, if the
        instance has that accelerator, else CPUs."""
        for unit in ("neuron_cores", "GPU", "TPU"):
            if resources.get(unit) and unit in self.units:
                return unit
        return "CPU"

    def share(self, resources: Mapping[str, float]) -> float:
        unit = self.priced_unit(resources)
        return min(1.0, float(resources.get(unit, 0)) / self.units[unit])

    def hourly_rate(self, resources: Mapping[str, float]) -> float:
        return self.usd_per_hour * self.share(resources)

    def on(self, instance_type: Optional[str]) -> Optional["CostBasis"]:
        """The basis for a trial that ran on a node of ``instance_type`` (None: not known,
        this one). The price table prices every type it lists; a price given by hand prices
        its own machine only, so a trial elsewhere gets None (unpriced), never another
        machine's rate."""
        if instance_type is None or instance_type == self.instance_type:
            return self
        if self.source == PRICE_TABLE_BASIS and instance_type in PRICE_TABLE:
            price = PRICE_TABLE[instance_type]
            return CostBasis(price.usd_per_hour, price.units(), self.source, instance_type)
        return None

    def describe(self, resources: Mapping[str, float]) -> str:
        unit = self.priced_unit(resources)
        held = resources.get(unit, 0)
        what = self.instance_type or "this machine"
        return (f"{what} at ${self.usd_per_hour:g}/h ({self.source}) x {held:g}/{self.units[unit]:g} {unit} "
                f"= ${self.hourly_rate(resources):.4g}/h")


NO_BASIS = "no price basis: cost metrics are NaN."
# How to give a basis, in the terms of what the user runs: a script that calls run_sweep
# from Python has no --instance-type (Sweep's default note says this one); a study's
# command line has (cli.cost_basis).
NO_BASIS_HINT = (f"{NO_BASIS} Give the Sweep one: cost, cost_note = resolve_cost_basis(instance_type=...) (one of "
                 + ", ".join(PRICE_TABLE) + ") or resolve_cost_basis(price_per_hour=USD), from "
                 "accelsweep.trainables.cost; then Sweep(..., cost=cost, cost_note=cost_note).")
NO_BASIS_CLI_HINT = (f"{NO_BASIS} Pass --instance-type (one of " + ", ".join(PRICE_TABLE)
                     + ") or --price-per-hour USD.")


def price_advice(cost_note: str) -> str:
    """How to give a price basis, as a sweep's cost note (its ``cost_basis`` tag) says it
    for what the sweep was run from; a generic sentence for a note that does not."""
    for hint in (NO_BASIS_HINT, NO_BASIS_CLI_HINT):
        if cost_note == hint:
            return hint.removeprefix(NO_BASIS).strip()
    return "Give the sweep a price basis (an instance type or a price per hour)."


def resolve_cost_basis(instance_type: Optional[str] = None, price_per_hour: Optional[float] = None,
                       local_units: Optional[Mapping[str, float]] = None,
                       detect: bool = True, flags: bool = False) -> tuple[Optional[CostBasis], str]:
    """Pick the price basis: an explicit price, else the price table for the instance
    type given or read from EC2 metadata. Returns (basis or None, a sentence why): the
    Sweep's ``cost`` and ``cost_note``. ``flags``: the values came from a command line's
    --instance-type and --price-per-hour, and the sentences say so."""
    detected = False
    if instance_type is None and detect:
        instance_type = detect_instance_type()
        detected = instance_type is not None
    if price_per_hour is not None:
        positive_float("price_per_hour", price_per_hour)
        if instance_type in PRICE_TABLE:
            units = PRICE_TABLE[instance_type].units()
        else:
            units = dict(local_units or {"CPU": float(os.cpu_count() or 1)})
        basis = CostBasis(price_per_hour, units, "--price-per-hour" if flags else "price_per_hour", instance_type)
        return basis, f"price basis: ${price_per_hour:g}/h given" + (" on the command line" if flags else "")
    if instance_type is None:
        return None, NO_BASIS_CLI_HINT if flags else NO_BASIS_HINT
    if instance_type not in PRICE_TABLE:
        raise ConfigError("instance_type", f"one of {', '.join(PRICE_TABLE)} (or give "
                                           f"{'--price-per-hour' if flags else 'price_per_hour'})",
                          instance_type, "The price table has no entry for it.")
    price = PRICE_TABLE[instance_type]
    how = "read from EC2 instance metadata" if detected else "given"
    basis = CostBasis(price.usd_per_hour, price.units(), PRICE_TABLE_BASIS, instance_type)
    return basis, f"price basis: {instance_type} ({how}) at ${price.usd_per_hour:g}/h, price table {PRICE_TABLE_DATE}"


def trial_cost_usd(usd_per_hour: float, wall_s: float) -> float:
    return usd_per_hour * wall_s / 3600.0


def usd_per_1m_samples(usd_per_hour: float, samples_per_s: float) -> float:
    """Steady-state price of a million samples at this throughput (compile excluded)."""
    if not samples_per_s > 0:
        return float("nan")
    return usd_per_hour / 3600.0 / samples_per_s * 1e6

"""What the hardware under a platform does natively, and which knob values it only emulates.

A value the hardware only emulates costs a sweep its budget for nothing: on a CPU with
no bf16 instructions, bf16 steps take many times fp32's. Each platform's ``capabilities(config)`` reads the hardware (or, where there is
none to read, the vendor's table for the target the config names), and the sweep driver
removes the ``emulated`` values from the search space before any trial, saying why.

Driver-side: nothing here needs an accelerator. Where the hardware cannot be read the
source says "not known: ..." and nothing is removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from accelsweep.trainables.precision import PRECISIONS

__all__ = ["BF16_PRECISIONS", "Capabilities", "emulated_bf16", "not_known"]

Fact = Union[str, int, bool]

# The precisions that compute in bf16 (its weights, or torch.autocast's dtype): what a
# device without bf16 arithmetic only emulates.
BF16_PRECISIONS = tuple(p.name for p in PRECISIONS.values() if "bfloat16" in (p.parameters, p.autocast))


@dataclass(frozen=True)
class Capabilities:
    hardware: str  # one line: the hardware the trials run on
    source: str  # where this was read; "not known: <why>" when it could not be
    facts: Mapping[str, Fact] = field(default_factory=dict)  # flags present, cores, bf16_native, ...
    # knob -> {value: reason}: the values this hardware only emulates (or lacks), each with
    # a reason naming the missing feature.
    emulated: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)
    # Read from the machine this runs on (the driver's), not from a table for a named
    # target: on a cluster, the trials' nodes may have other hardware.
    read_here: bool = False

    @property
    def known(self) -> bool:
        return not self.source.startswith("not known")

    def describe(self) -> str:
        return f"{self.hardware} (read from {self.source})" if self.known else f"{self.hardware} ({self.source})"


def not_known(hardware: str, why: str) -> Capabilities:
    """Capabilities that could not be read: nothing is removed."""
    return Capabilities(hardware=hardware, source=f"not known: {why}")


def emulated_bf16(reason: str) -> dict[str, dict[str, str]]:
    """The ``precision`` values a device without bf16 arithmetic only emulates."""
    return {"precision": {name: reason for name in BF16_PRECISIONS}}

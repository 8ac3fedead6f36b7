"""Kernel implementations, registered by op and name, imported only when used.

Each op package (``kernels/<op>/``) declares an ``OpSpec``: how to make inputs, the
plain reference (numpy, float64: ground truth), tolerances, and its implementations.
An implementation names the module and function it lives in, the platforms it runs on
and what to install when its stack is missing. Nothing falls back: an implementation
that cannot load raises ``KernelUnavailable`` with the reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trainables.config import ConfigError

OPS = ("giou", "nms")


class KernelUnavailable(RuntimeError):
    """An implementation's stack is not installed here, or not for this platform."""


@dataclass(frozen=True)
class KernelImpl:
    name: str
    target: str  # "module:function"
    framework: str  # "numpy", "torch" or "jax": how inputs are passed and synced
    platforms: tuple[str, ...]
    install: str  # what to install when the import fails
    # Platforms where it only runs interpreted (Pallas on a CPU): a correctness check,
    # never a speed figure.
    interpreted_on: tuple[str, ...] = ()

    def load(self) -> Callable[..., Any]:
        module_name, function = self.target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise KernelUnavailable(f"{self.name} needs {self.install} ({error})") from None
        return getattr(module, function)


@dataclass(frozen=True)
class OpSpec:
    name: str
    make_inputs: Callable[..., tuple]  # (seed, **shape) -> numpy arrays
    reference: Callable[..., Any]  # numpy in, numpy out (float64)
    shape_params: tuple[str, ...]
    items: Callable[..., int]  # work items per call (boxes, pairs), for items/s
    implementations: tuple[KernelImpl, ...]
    # Outputs are compared after this (e.g. a keep mask and an index list -> the same set).
    canonical: Callable[[Any], Any] = lambda output: output
    tolerance: Mapping[str, float] = field(default_factory=lambda: {"float32": 1e-4})

    def impl(self, name: str) -> KernelImpl:
        for implementation in self.implementations:
            if implementation.name == name:
                return implementation
        names = ", ".join(i.name for i in self.implementations)
        raise ConfigError("impl", f"one of {names} for op {self.name!r}", name)

    def impls_for(self, platform: str) -> list[KernelImpl]:
        return [i for i in self.implementations if platform in i.platforms]


def get_op(name: str) -> OpSpec:
    if name not in OPS:
        raise ConfigError("op", f"one of {', '.join(OPS)}", name)
    return importlib.import_module(f"kernels.{name}").SPEC

"""Kernel implementations, registered by op and name, imported only when used.

Each op package (``kernels/<op>/``) declares an ``OpSpec``: its shape parameters, the
options that change what it computes (a causal mask, a soft-cap), how to make inputs,
the plain reference (numpy, float64: ground truth), tolerances per dtype, and its
implementations. An implementation names the module and function it lives in, the
platforms and dtypes it runs, the semantic options it supports, its own tuning knobs
(block sizes) and what to install when its stack is missing. Nothing falls back: an
implementation that cannot load raises ``KernelUnavailable`` with the reason.

The kernel call is ``impl(*inputs, **options, **tuning)``: the op's options (all of
them, so an implementation cannot silently ignore one) and its own tuning knobs.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from accelsweep.trainables.errors import ConfigError


def _op_packages() -> tuple[str, ...]:
    import accelsweep.kernels

    return tuple(sorted(module.name for module in pkgutil.iter_modules(accelsweep.kernels.__path__)
                        if module.ispkg))


OPS = _op_packages()  # every kernels/<op>/ package is an op


class KernelUnavailable(RuntimeError):
    """An implementation's stack is not installed here, or not for this platform."""


@dataclass(frozen=True)
class KernelImpl:
    name: str
    target: str  # "module:function"
    framework: str  # "numpy", "torch" or "jax": how inputs are passed, synced and timed
    platforms: tuple[str, ...]
    install: str  # what to install when the import fails
    # Platforms where it only runs interpreted (Pallas on a CPU): a correctness check,
    # never a speed figure.
    interpreted_on: tuple[str, ...] = ()
    dtypes: Optional[tuple[str, ...]] = None  # None: every dtype the op has
    # Semantic options it implements; any other option must stay at the op's default.
    supports: Optional[tuple[str, ...]] = None  # None: all of the op's options
    # Its own knobs (e.g. block sizes), name -> default; passed to it and to nothing else.
    tuning: Mapping[str, Any] = field(default_factory=dict)
    # (shape, options, tuning, dtype, platform) -> None, raising ConfigError for a
    # combination it cannot run (a block that does not divide the problem). Runs in the
    # driver, before any trial starts: it must not import the implementation's stack.
    check: Optional[Callable[..., None]] = None

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
    make_inputs: Callable[..., tuple]  # (seed, **shape) -> numpy arrays (float64 or integer)
    reference: Callable[..., Any]  # (*arrays, **options) numpy in, numpy out (float64)
    shape: Mapping[str, int]  # shape parameter -> default
    items: Callable[..., int]  # work items per call (boxes, pairs), for items/s
    implementations: tuple[KernelImpl, ...]
    options: Mapping[str, Any] = field(default_factory=dict)  # semantic option -> default
    # Allowed values per option, for validation: a tuple of choices or a check function.
    option_values: Mapping[str, Any] = field(default_factory=dict)
    flops: Optional[Callable[..., float]] = None  # (**shape, **options) -> FLOPs per call
    # Outputs are compared after this (e.g. a keep mask and an index list -> the same set).
    canonical: Callable[[Any], Any] = lambda output: output
    tolerance: Mapping[str, float] = field(default_factory=lambda: {"float32": 1e-4})
    # (shape, options) -> None, raising ConfigError for a combination the op itself does
    # not define (a 2-D neighbourhood over a non-square sequence). Runs before any trial.
    check: Optional[Callable[..., None]] = None

    @property
    def shape_params(self) -> tuple[str, ...]:
        return tuple(self.shape)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self.tolerance)

    def impl(self, name: str) -> KernelImpl:
        for implementation in self.implementations:
            if implementation.name == name:
                return implementation
        names = ", ".join(i.name for i in self.implementations)
        raise ConfigError("impl", f"one of {names} for op {self.name!r}", name)

    def impls_for(self, platform: str, dtype: Optional[str] = None) -> list[KernelImpl]:
        return [i for i in self.implementations
                if platform in i.platforms and (dtype is None or i.dtypes is None or dtype in i.dtypes)]

    def tuning_knobs(self) -> dict[str, Any]:
        """Every implementation's tuning knobs with their defaults (names must agree)."""
        knobs: dict[str, Any] = {}
        for implementation in self.implementations:
            knobs.update(implementation.tuning)
        return knobs


def get_op(name: str) -> OpSpec:
    if name not in OPS:
        raise ConfigError("op", f"one of {', '.join(OPS)}", name)
    return importlib.import_module(f"accelsweep.kernels.{name}").SPEC

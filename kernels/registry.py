"""Kernel implementations, registered by op and name, imported only when used.

Each op package (``kernels/<op>/``) declares an ``OpSpec``: its shape parameters, the
options that change what it computes (a causal mask, a soft-cap), how to make inputs,
the plain reference (numpy, float64: ground truth), tolerances per dtype, and its
implementations. An implementation names the module and function it lives in, the
platforms and dtypes it runs, the semantic options it supports, its own tuning knobs
(block sizes) and what to install when its stack is missing. Nothing falls back: an
implementation that cannot load raises ``KernelUnavailable`` with the reason.

The kernel call is ``impl(*inputs, **options, **tuning)``: the op's options (all of
them, so an implementation cannot silently ignore one) and its own tuning knobs. An op
need not live here: ``get_op`` also takes an installed op or an import path.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from accelsweep.trainables.errors import ConfigError
import accelsweep.kernels
from accelsweep.trainables.importing import importable_module, load_path
from accelsweep.trainables.platforms import PLATFORM_NAMES

__all__ = ["OPS", "ENTRY_POINT_GROUP", "FRAMEWORKS", "KernelUnavailable", "KernelImpl", "OpSpec", "get_op",
           "installed_ops", "importable_module"]


def _op_packages() -> tuple[str, ...]:
    return tuple(sorted(module.name for module in pkgutil.iter_modules(accelsweep.kernels.__path__)
                        if module.ispkg))


OPS = _op_packages()  # every kernels/<op>/ package is a built-in op
ENTRY_POINT_GROUP = "accelsweep.ops"  # where other distributions register their ops
FRAMEWORKS = ("numpy", "torch", "jax")  # how the harness places inputs, syncs and times
BYTES_ITEMSIZE = "itemsize"  # bytes_moved's keyword for the trial dtype's bytes per element
IMPORT_PATH = "an import path 'package.module:ATTR' naming an OpSpec"


class KernelUnavailable(RuntimeError):
    """An implementation's stack is not installed here, or not for this platform."""


def _split_target(field_name: str, target: Any) -> tuple[str, str]:
    module, _, attribute = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not module or not attribute or ":" in attribute:
        raise ConfigError(field_name, "'package.module:function'", target)
    return module, attribute


def _names(field_name: str, values: Any, allowed: Optional[tuple] = None) -> None:
    """A tuple of strings (from ``allowed`` when given): platforms, dtypes, options."""
    if isinstance(values, str) or not isinstance(values, (tuple, list)) or not all(
            isinstance(v, str) and (allowed is None or v in allowed) for v in values):
        what = f"names from {', '.join(allowed) or '(none)'}" if allowed is not None else "names"
        raise ConfigError(field_name, f"a tuple of {what}", values)


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

    def __post_init__(self) -> None:
        # Checked when it is declared, without importing its stack: a user's op with a
        # misspelt platform fails at its definition, not as a trial that never starts.
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("implementation name", "a non-empty string", self.name)
        _split_target(f"target of implementation {self.name}", self.target)
        if self.framework not in FRAMEWORKS:
            raise ConfigError(f"framework of implementation {self.name}", f"one of {', '.join(FRAMEWORKS)}",
                              self.framework)
        _names(f"platforms of implementation {self.name}", self.platforms, PLATFORM_NAMES)
        if not self.platforms:
            raise ConfigError(f"platforms of implementation {self.name}", "at least one platform", self.platforms)
        _names(f"interpreted_on of implementation {self.name}", self.interpreted_on, tuple(self.platforms))
        for name in ("dtypes", "supports"):
            if getattr(self, name) is not None:
                _names(f"{name} of implementation {self.name}", getattr(self, name))
        if self.check is not None and not callable(self.check):
            raise ConfigError(f"check of implementation {self.name}", "a function, or None", self.check)

    def load(self) -> Callable[..., Any]:
        module_name, function = _split_target(f"target of implementation {self.name}", self.target)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise KernelUnavailable(f"{self.name} needs {self.install} ({error})") from None
        kernel = getattr(module, function, None)
        if not callable(kernel):
            raise ConfigError(f"target of implementation {self.name}", "'module:function' naming a function",
                              self.target, f"Module {module_name} has no function {function!r}.")
        return kernel


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
    # (**shape, **options, itemsize) -> the fewest bytes one call must move: each input read
    # once and each output written once, ``itemsize`` the trial dtype's bytes per element
    # (an op whose output has another dtype, int8 in and int32 out, says so itself). With
    # ``flops`` it places the op on its roofline (trainables/roofline.py).
    bytes_moved: Optional[Callable[..., float]] = None
    # Outputs are compared after this (e.g. a keep mask and an index list -> the same set).
    canonical: Callable[[Any], Any] = lambda output: output
    tolerance: Mapping[str, float] = field(default_factory=lambda: {"float32": 1e-4})
    # (shape, options) -> None, raising ConfigError for a combination the op itself does
    # not define (a 2-D neighbourhood over a non-square sequence). Runs before any trial.
    check: Optional[Callable[..., None]] = None

    def __post_init__(self) -> None:
        """What every trial of the op relies on, checked once where the op is declared
        (a user's op: when its module is imported, before any trial)."""
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("op name", "a non-empty string", self.name)
        where = f"of op {self.name!r}"
        for name in ("make_inputs", "reference", "items", "canonical"):
            if not callable(getattr(self, name)):
                raise ConfigError(f"{name} {where}", "a function", getattr(self, name))
        for name in ("flops", "bytes_moved", "check"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ConfigError(f"{name} {where}", "a function, or None", getattr(self, name))
        for name, value in dict(self.shape).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"default of shape parameter {name} {where}", "an integer >= 1", value)
        unknown = sorted(set(self.option_values) - set(self.options))
        if unknown:
            raise ConfigError(f"option_values {where}", f"keyed by its options ({', '.join(self.options) or 'none'})",
                              unknown[0])
        self._check_implementations(where)
        self._check_tolerance(where)
        self._check_counts(where)
        groups = {"shape": set(self.shape), "options": set(self.options), "tuning": set(self.tuning_knobs())}
        for first, second in (("shape", "options"), ("shape", "tuning"), ("options", "tuning")):
            shared = sorted(groups[first] & groups[second])
            if shared:  # a config is one flat dict: each name must say which group it is
                raise ConfigError(f"{first} and {second} names {where}", "distinct", shared)

    def _check_implementations(self, where: str) -> None:
        if not isinstance(self.implementations, tuple) or not self.implementations or not all(
                isinstance(i, KernelImpl) for i in self.implementations):
            raise ConfigError(f"implementations {where}", "a non-empty tuple of KernelImpl", self.implementations)
        names = [i.name for i in self.implementations]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"implementation names {where}", "unique", repeated)
        for implementation in self.implementations:
            if implementation.supports is not None:
                _names(f"supports of implementation {implementation.name} {where}", implementation.supports,
                       tuple(self.options))

    def _check_tolerance(self, where: str) -> None:
        if not isinstance(self.tolerance, Mapping) or not self.tolerance:
            raise ConfigError(f"tolerance {where}", "a mapping dtype -> max abs error, at least one dtype",
                              self.tolerance)
        for dtype, tolerance in self.tolerance.items():
            if not _is_dtype(dtype):
                raise ConfigError(f"tolerance {where}", "keyed by numpy dtype names (float32, bfloat16, int8, ...)",
                                  dtype)
            if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0 \
                    or math.isinf(tolerance):
                raise ConfigError(f"tolerance for {dtype} {where}", "a finite number >= 0", tolerance)
        for implementation in self.implementations:
            if implementation.dtypes is not None:
                # The harness compares each output against the tolerance of its dtype.
                _names(f"dtypes of implementation {implementation.name} {where}", implementation.dtypes,
                       tuple(self.tolerance))

    def _check_counts(self, where: str) -> None:
        """The FLOP and byte counts, called at the default shape and options: a count that
        takes other arguments, or gives no positive number, fails where the op is declared
        and not in every trial."""
        if self.bytes_moved is not None and BYTES_ITEMSIZE in {*self.shape, *self.options}:
            raise ConfigError(f"shape and option names {where}",
                              f"names other than {BYTES_ITEMSIZE!r} (bytes_moved takes the dtype's bytes per element "
                              "by that name)", BYTES_ITEMSIZE)
        for name, extra in (("flops", {}), ("bytes_moved", {BYTES_ITEMSIZE: 4})):
            count = getattr(self, name)
            if count is None:
                continue
            arguments = {**self.shape, **self.options, **extra}
            try:
                signature = inspect.signature(count)
            except (TypeError, ValueError):  # a builtin without one: its call below says
                signature = None
            if signature is not None:
                try:
                    signature.bind(**arguments)
                except TypeError as error:
                    raise ConfigError(f"{name} {where}", f"a function taking keywords {', '.join(arguments)}",
                                      f"{name}{signature}", f"It does not ({error}).") from None
            value = count(**arguments)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
                at = ", ".join(f"{k}={v}" for k, v in arguments.items())
                raise ConfigError(f"{name} {where}", f"a function giving a number > 0 per call (called with {at})",
                                  value)

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


def _is_dtype(name: Any) -> bool:
    import numpy as np

    if name == "bfloat16":  # ml_dtypes' (trainables/harness/microbench.py), not numpy's
        return True
    try:
        return isinstance(name, str) and np.dtype(name).name == name
    except TypeError:
        return False


@functools.lru_cache(maxsize=None)
def installed_ops() -> dict[str, str]:
    """Ops other distributions register under entry point group ``accelsweep.ops``:
    name -> ``"package.module:ATTR"``. Read once per process (a configuration is checked
    many times per sweep; scanning every installed distribution takes milliseconds).
    A name of a built-in op stays the built-in one."""
    from importlib.metadata import entry_points

    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP) if point.name not in OPS}


def _allowed_names() -> str:
    installed = ", ".join(sorted(installed_ops())) or "none installed"
    return (f"one of the built-in ops ({', '.join(OPS)}), an op installed under entry point group "
            f"{ENTRY_POINT_GROUP} ({installed}), or {IMPORT_PATH}")


def _load_spec(path: str, given: str, origin: str = "") -> OpSpec:
    """The OpSpec at ``path`` ("package.module:ATTR"); every way it can fail is a
    ConfigError on field ``op`` naming ``given`` (what the user wrote)."""
    if ":" not in path:
        raise ConfigError("op", _allowed_names(), given, origin)
    found = load_path(path, "op", "an OpSpec", given, origin)
    if not isinstance(found, OpSpec):
        raise ConfigError("op", IMPORT_PATH, given,
                          f"{origin}{path} is a {type(found).__name__}, not an accelsweep.kernels.registry.OpSpec.")
    return found


def get_op(name: str) -> OpSpec:
    """The op ``name`` (as ``KernelConfig.op`` gives it), one of three kinds of name:

    - a built-in op: a folder of this package (``OPS``: "giou", "nms", ...);
    - an op installed by another distribution, under entry point group ``accelsweep.ops``
      (``name = "package.module:ATTR"`` in its pyproject's ``[project.entry-points."accelsweep.ops"]``);
    - an import path, ``"package.module:ATTR"``, ATTR an ``OpSpec`` (a script's own op:
      ``f"{importable_module(__name__)}:SPEC"``).

    Anything else, or a path that does not lead to an OpSpec, is a ConfigError on field
    ``op``. The name travels in the trial's config, and each Ray worker loads the op from
    it: the module must be importable there too (installed on every node, or, on a local
    Ray instance, beside the script: Ray puts the driver script's folder on its workers'
    path)."""
    if not isinstance(name, str):
        raise ConfigError("op", _allowed_names(), name)
    if name in OPS:
        return importlib.import_module(f"accelsweep.kernels.{name}").SPEC
    if ":" in name:
        return _load_spec(name, name)
    if name in installed_ops():
        path = installed_ops()[name]
        return _load_spec(path, name, f"Entry point {name} = {path!r} (group {ENTRY_POINT_GROUP}): ")
    raise ConfigError("op", _allowed_names(), name)

"""The trial config: every knob a training trial can turn, validated before it runs.

A knob travels one road: search space -> ``TrialConfig`` (validated here, in the
driver, before any trial starts) -> the platform applies it -> the loop measures ->
one result dict. Nothing downstream re-derives a knob; it reads it from this config.

``TrialConfig`` holds the generic knobs, the platform's own (``knobs``, a frozen
dataclass the platform declares: ``CpuKnobs``, ``XlaKnobs``, ``NeuronKnobs``, ...) and
the workload's own (``workload_knobs``, trainables/workloads/base.py). As a flat dict
(Tune configs, search spaces, MLflow params) all sit side by side under their own names;
``TrialConfig.from_dict`` and ``TrialConfig.make(**flat)`` are the one way in:

    TrialConfig.make(platform="cpu", model="vit-micro", threads=2)
    TrialConfig.make(workload="my_package.lm:TinyLM", seq_len=128)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

from accelsweep.trainables.compile_cache import check_setting as check_compile_cache
from accelsweep.trainables.errors import (ConfigError, non_negative_float, one_of, positive_float, positive_int,
                                          random_seed)
from accelsweep.trainables.precision import PRECISION_NAMES
from accelsweep.trainables.platforms import PLATFORMS, get_platform
from accelsweep.trainables.workloads.base import load_workload

if TYPE_CHECKING:
    from accelsweep.trainables.platforms.base import PlatformKnobs
    from accelsweep.trainables.workloads.base import WorkloadKnobs

__all__ = ["DictConfig", "TrialConfig"]

# torch.compile: "max-autotune" is inductor with mode="max-autotune", "reduce-overhead"
# inductor with mode="reduce-overhead" (its kernels replayed as CUDA graphs) (Platform.compile).
COMPILE_MODES = ("none", "inductor", "max-autotune", "reduce-overhead", "openxla")
DEFAULT_WORKLOAD = "image-classification"
# Ray's placement-group strategies, which Ray Train applies to a trial's workers.
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
INSTANCE_TYPE_PATTERN = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")


class DictConfig:
    """A config dataclass that round-trips through a flat dict (Tune configs, MLflow
    params) and names the bad key when there is one."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError("config key", f"one of {', '.join(sorted(names))}", unknown[0])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TrialConfig:
    """One training trial. Batch size and CPUs are per worker; ``workload`` names what is
    trained (its knobs: ``workload_knobs``); ``knobs`` are the platform's own."""

    platform: str = "cpu"
    # A built-in workload's name, or a user's as "package.module:Name" (trainables/workloads/base.py).
    workload: str = DEFAULT_WORKLOAD
    batch_size: int = 32
    num_workers: int = 0  # DataLoader worker processes
    # 0: each step takes the loader's next batch, as training does. N: the loader's first N
    # batches, drawn before the warm-up, stay on the device in the model's input dtype and
    # layout, and the steps cycle through them: no loading, no copy, no cast in a step. What
    # the model itself reaches (its ceiling), apart from what the input pipeline costs.
    resident_batches: int = 0
    precision: str = "fp32"  # trainables/precision.py says what each one means
    torch_compile: str = "none"
    workers: int = 1  # data-parallel workers (processes); > 1 runs a Ray Train TorchTrainer
    cpus_per_worker: int = 1  # CPUs each worker holds (Ray resource and cost share)
    # Where Ray puts a trial's workers (workers > 1; one worker is placed alike by all):
    # PACK (Ray Train's default) fills a node before the next, STRICT_SPREAD puts each
    # worker on a node of its own (data-parallel across hosts), SPREAD does where it can.
    placement_strategy: str = "PACK"
    # The cluster node type trials must run on (Ray resource "instance_type:<type>", which
    # cluster.yaml gives each worker type): with several node types in one cluster, the
    # autoscaler starts the one the sweep is priced and compiled for. None: any node.
    instance_type: Optional[str] = None
    # Measurement: warm-up steps are never timed; each window runs at least
    # window_min_steps steps and window_min_s seconds (short windows are noisy).
    warmup_steps: int = 3
    window_min_steps: int = 5
    window_min_s: float = 2.0
    windows: int = 3
    learning_rate: float = 1e-3
    seed: int = 0
    # On a non-finite gradient, save the step's model and optimizer state, batch and RNG
    # state, and end the trial as nan (trainables/loop/nan_replay.py replays the capture).
    nan_capture: bool = False
    # Where compiled graphs are kept for every later trial and sweep
    # (trainables/compile_cache.py): an absolute directory (one every node sees, on a cluster), s3://...
    # on platform neuron, or "off" (the compilers' own defaults). None: $ACCELSWEEP_COMPILE_CACHE,
    # else ~/.cache/accelsweep/compile on each node.
    compile_cache: Optional[str] = None
    # The platform's own knobs; None: the defaults of the platform's Knobs.
    knobs: Optional["PlatformKnobs"] = None
    # The workload's own knobs; None: the defaults of its Knobs.
    workload_knobs: Optional["WorkloadKnobs"] = None

    def __post_init__(self) -> None:
        platform = get_platform(self.platform)
        if self.knobs is None:
            object.__setattr__(self, "knobs", platform.Knobs())
        elif type(self.knobs) is not platform.Knobs:
            raise ConfigError("knobs", f"a {platform.Knobs.__name__} (the knobs of platform {self.platform!r})",
                              self.knobs)
        workload = load_workload(self.workload)
        _check_knob_names(workload.Knobs, self.workload)
        if self.workload_knobs is None:
            object.__setattr__(self, "workload_knobs", workload.Knobs())
        elif type(self.workload_knobs) is not workload.Knobs:
            raise ConfigError("workload_knobs", f"a {workload.Knobs.__name__} (the knobs of workload "
                                                f"{self.workload!r})", self.workload_knobs)
        positive_int("batch_size", self.batch_size)
        positive_int("num_workers", self.num_workers, minimum=0)
        positive_int("resident_batches", self.resident_batches, minimum=0)
        if self.resident_batches and self.num_workers:
            raise ConfigError("num_workers", "0 when resident_batches is set", self.num_workers,
                              "Resident batches are drawn once, before the warm-up: loader processes "
                              "would have no batch to make while the trial is timed.")
        one_of("precision", self.precision, PRECISION_NAMES)
        one_of("torch_compile", self.torch_compile, COMPILE_MODES)
        positive_int("workers", self.workers)
        positive_int("cpus_per_worker", self.cpus_per_worker)
        one_of("placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES,
               "Ray's placement-group strategies: STRICT_SPREAD puts each worker on a different node.")
        if self.instance_type is not None and not (isinstance(self.instance_type, str)
                                                   and INSTANCE_TYPE_PATTERN.fullmatch(self.instance_type)):
            raise ConfigError("instance_type", "an EC2 instance type such as trn1.2xlarge, or None", self.instance_type)
        positive_int("warmup_steps", self.warmup_steps)
        positive_int("window_min_steps", self.window_min_steps)
        non_negative_float("window_min_s", self.window_min_s)
        positive_int("windows", self.windows)
        positive_float("learning_rate", self.learning_rate)
        random_seed("seed", self.seed)
        if not isinstance(self.nan_capture, bool):
            raise ConfigError("nan_capture", "True or False", self.nan_capture)
        check_compile_cache(self.compile_cache)
        if self.nan_capture and self.workers > 1:
            raise ConfigError("nan_capture", "False when workers > 1", self.nan_capture,
                              "A capture replays one process's step, but with several workers each gradient is "
                              "the all-reduce of every worker's batch. Run the failing config with workers=1 "
                              "to capture it.")
        if self.nan_capture and self.precision == "fp16-autocast":
            raise ConfigError("nan_capture", "False with precision fp16-autocast", self.nan_capture,
                              "Its GradScaler makes non-finite gradients on purpose (and skips those steps), so "
                              "a capture would stop at the first one; capture with bf16-autocast.")
        # The platform checks what only it knows: its precisions, compile modes, and its
        # knobs against the generic fields (its Knobs checked each value on its own); the
        # workload the same for its knobs.
        platform.validate(self)
        workload.validate(self)

    @classmethod
    def generic_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("knobs", "workload_knobs"))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrialConfig":
        """The config of a flat dict: generic fields, the knobs of its platform and of its
        workload side by side. An unknown key, or a knob of another platform, is refused
        by name."""
        platform = get_platform(values.get("platform", cls.platform))
        workload = load_workload(values.get("workload", cls.workload))
        generic, own, workload_own = cls.generic_fields(), platform.Knobs.names(), workload.Knobs.names()
        for key in values:
            if key in generic or key in own or key in workload_own:
                continue
            owners = [p for p in PLATFORMS.values() if key in p.Knobs.names()]
            if not owners:
                raise ConfigError("config key", f"one of {', '.join(sorted(generic + own + workload_own))}", key)
            # Another platform's knob at its default means "not used" and is dropped (a
            # dict written for several platforms, or by an older version); set, it is refused.
            default = _default_of(owners[0].Knobs, key)
            if values[key] != default:
                has = ", ".join(sorted(own)) or "none"
                raise ConfigError(key, f"{default!r} on platform {platform.name!r} (its knobs: {has})", values[key],
                                  f"{key} does not apply to {platform.name}: it is a knob of "
                                  f"{', '.join(p.name for p in owners)}.")
        knobs = platform.Knobs(**{key: values[key] for key in own if key in values})
        workload_knobs = workload.Knobs(**{key: values[key] for key in workload_own if key in values})
        return cls(**{key: values[key] for key in generic if key in values}, knobs=knobs,
                   workload_knobs=workload_knobs)

    @classmethod
    def make(cls, **values: Any) -> "TrialConfig":
        """``from_dict`` with keyword arguments: ``TrialConfig.make(platform="cpu", threads=2)``."""
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        """One flat dict: the generic fields, the platform's knobs, the workload's knobs."""
        return {**{name: getattr(self, name) for name in self.generic_fields()}, **dataclasses.asdict(self.knobs),
                **dataclasses.asdict(self.workload_knobs)}

    def replace(self, **changes: Any) -> "TrialConfig":
        return self.from_dict({**self.to_dict(), **changes})


def _check_knob_names(knobs: type, workload: str) -> None:
    """A workload's knob must not take a name the flat dict already uses."""
    taken = set(TrialConfig.generic_fields()) | {"knobs", "workload_knobs"}
    taken |= {name for platform in PLATFORMS.values() for name in platform.Knobs.names()}
    clash = sorted(set(knobs.names()) & taken)
    if clash:
        raise ConfigError(f"knob names of workload {workload}", "names no generic field or platform knob uses",
                          clash)


def _default_of(knobs: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(knobs) if f.name == name)

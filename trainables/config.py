"""The trial config: every knob a training trial can turn, validated before it runs.

A knob travels one road: search space -> ``TrialConfig`` (validated here, in the
driver, before any trial starts) -> the platform applies it -> the loop measures ->
one result dict. Nothing downstream re-derives a knob; it reads it from this config.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from accelsweep.trainables.errors import ConfigError, non_negative_float, one_of, positive_float, positive_int

PRECISIONS = ("fp32", "bf16-autocast", "bf16")
COMPILE_MODES = ("none", "inductor", "openxla")
PATCH_EMBEDS = ("conv", "linear")
INSTANCE_TYPE_PATTERN = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")

# Neuron compiler (neuronx-cc) choices, as documented for NEURON_CC_FLAGS.
NEURON_MODEL_TYPES = ("generic", "transformer", "unet-inference")
NEURON_OPTLEVELS = (1, 2, 3)
NEURON_AUTO_CAST = ("none", "matmult", "all")
NEURON_AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
NEURON_TARGETS = ("inf2", "trn1", "trn1n", "trn2")

# Knobs only some platforms have, with the value that means "not used". A platform
# lists the ones it honours; any other one set away from this value is refused.
PLATFORM_KNOB_DEFAULTS: dict[str, Any] = {
    "threads": None,
    "channels_last": False,
    "accelerator_type": None,
    "batches_per_execution": 1,
    "compile_cache": None,
    "neuron_model_type": None,
    "neuron_optlevel": None,
    "neuron_auto_cast": None,
    "neuron_auto_cast_type": None,
    "neuron_target": None,
}


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
class TrialConfig(DictConfig):
    """One training trial. Batch size and CPUs are per worker; the model preset fixes the
    architecture."""

    platform: str = "cpu"
    model: str = "vit-tiny"
    patch_embed: str = "conv"  # "linear": seed 001's conv-free patch embedding
    batch_size: int = 32
    num_workers: int = 0  # DataLoader worker processes
    precision: str = "fp32"
    torch_compile: str = "none"
    workers: int = 1  # data-parallel workers (processes); > 1 runs a Ray Train TorchTrainer
    cpus_per_worker: int = 1  # CPUs each worker holds (Ray resource and cost share)
    # The cluster node type trials must run on (Ray resource "instance_type:<type>", which
    # cluster.yaml gives each worker type): with several node types in one cluster, the
    # autoscaler starts the one the sweep is priced and compiled for. None: any node.
    instance_type: Optional[str] = None
    # Platform-specific knobs (see PLATFORM_KNOB_DEFAULTS).
    threads: Optional[int] = None  # CPU intra-op threads; None: cpus_per_worker
    channels_last: bool = False
    accelerator_type: Optional[str] = None  # Ray accelerator type, e.g. "H100" or "A10G"
    batches_per_execution: int = 1  # torch-xla MpDeviceLoader
    compile_cache: Optional[str] = None  # persistent compile cache: a directory or s3:// URL
    neuron_model_type: Optional[str] = None  # None: leave the compiler's default
    neuron_optlevel: Optional[int] = None
    neuron_auto_cast: Optional[str] = None
    neuron_auto_cast_type: Optional[str] = None
    neuron_target: Optional[str] = None  # None: from the instance type
    # Measurement: warm-up steps are never timed; each window runs at least
    # window_min_steps steps and window_min_s seconds (short windows are noisy).
    warmup_steps: int = 3
    window_min_steps: int = 5
    window_min_s: float = 2.0
    windows: int = 3
    learning_rate: float = 1e-3
    seed: int = 0
    # On a non-finite gradient, save the step's model and optimizer state, batch and RNG
    # state, and end the trial as nan (trainables/nan_capture.py replays the capture).
    nan_capture: bool = False

    def __post_init__(self) -> None:
        from accelsweep.trainables.models import MODEL_PRESETS
        from accelsweep.trainables.platforms import get_platform

        one_of("model", self.model, tuple(MODEL_PRESETS))
        one_of("patch_embed", self.patch_embed, PATCH_EMBEDS)
        if self.patch_embed == "linear" and not MODEL_PRESETS[self.model].is_vit:
            raise ConfigError("patch_embed", "'conv' for a non-ViT model", self.patch_embed,
                              f"model {self.model!r} has no patch embedding.")
        positive_int("batch_size", self.batch_size)
        positive_int("num_workers", self.num_workers, minimum=0)
        one_of("precision", self.precision, PRECISIONS)
        one_of("torch_compile", self.torch_compile, COMPILE_MODES)
        positive_int("workers", self.workers)
        positive_int("cpus_per_worker", self.cpus_per_worker)
        if self.instance_type is not None and not (isinstance(self.instance_type, str)
                                                   and INSTANCE_TYPE_PATTERN.fullmatch(self.instance_type)):
            raise ConfigError("instance_type", "an EC2 instance type such as trn1.2xlarge, or None", self.instance_type)
        if self.threads is not None:
            positive_int("threads", self.threads)
        positive_int("batches_per_execution", self.batches_per_execution)
        if self.neuron_model_type is not None:
            one_of("neuron_model_type", self.neuron_model_type, NEURON_MODEL_TYPES)
        if self.neuron_optlevel is not None:
            one_of("neuron_optlevel", self.neuron_optlevel, NEURON_OPTLEVELS)
        if self.neuron_auto_cast is not None:
            one_of("neuron_auto_cast", self.neuron_auto_cast, NEURON_AUTO_CAST)
        if self.neuron_auto_cast_type is not None:
            one_of("neuron_auto_cast_type", self.neuron_auto_cast_type, NEURON_AUTO_CAST_TYPES)
        if self.neuron_target is not None:
            one_of("neuron_target", self.neuron_target, NEURON_TARGETS)
        positive_int("warmup_steps", self.warmup_steps)
        positive_int("window_min_steps", self.window_min_steps)
        non_negative_float("window_min_s", self.window_min_s)
        positive_int("windows", self.windows)
        positive_float("learning_rate", self.learning_rate)
        positive_int("seed", self.seed, minimum=0)
        if not isinstance(self.nan_capture, bool):
            raise ConfigError("nan_capture", "True or False", self.nan_capture)
        if self.nan_capture and self.workers > 1:
            raise ConfigError("nan_capture", "False when workers > 1", self.nan_capture,
                              "A capture replays one process's step, but with several workers each gradient is "
                              "the all-reduce of every worker's batch. Run the failing config with workers=1 "
                              "to capture it.")
        # The platform checks what only it knows: its precisions, compile modes and knobs.
        get_platform(self.platform).validate(self)

    def replace(self, **changes: Any) -> "TrialConfig":
        return self.from_dict({**self.to_dict(), **changes})

    @property
    def effective_threads(self) -> int:
        return self.threads if self.threads is not None else self.cpus_per_worker

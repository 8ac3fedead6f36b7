"""AWS Trainium / Inferentia NeuronCores through torch-neuronx (an XLA device).

Everything here that needs no NeuronCore is tested on any machine: detection, the
NEURON_CC_FLAGS composed from knobs, the runtime environment and the Ray resources.
The training itself is the XLA code path, tested with torch-xla on the CPU.
"""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.compile_cache import cache_location
from accelsweep.trainables.errors import ConfigError, one_of
from accelsweep.trainables.platforms import neuron_errors
from accelsweep.trainables.platforms.base import Detection, TrainingStudy
from accelsweep.trainables.platforms.capabilities import Capabilities, not_known
from accelsweep.trainables.platforms.xla import XlaKnobs, XlaPlatform
from accelsweep.trainables.precision import get_precision

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig

# Neuron compiler (neuronx-cc) choices, as documented for NEURON_CC_FLAGS.
NEURON_MODEL_TYPES = ("generic", "transformer", "unet-inference")
NEURON_OPTLEVELS = (1, 2, 3)
NEURON_AUTO_CAST = ("none", "matmult", "all")
NEURON_AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
NEURON_TARGETS = ("inf2", "trn1", "trn1n", "trn2")

# Instance family -> neuronx-cc --target.
_TARGET_BY_FAMILY = {"inf2": "inf2", "trn1": "trn1", "trn1n": "trn1n", "trn2": "trn2"}

# Each target's NeuronCore and the data types its engines compute in, from the Neuron
# docs (aws-neuron/aws-neuron-sdk): NeuronCore-v2 (Trn1, Inf2) supports FP32, FP16, TF32,
# BF16 and cFP8 including FP8_e4m3 (about-neuron/arch/neuron-features/data-types.rst);
# NeuronCore-v3 (Trn2): "Tensor Engines support mixed-precision computations, including
# cFP8, FP16, BF16, TF32, and FP32" (neuron-hardware/neuron-core-v3). So on every target
# here each --auto-cast-type and each precision is native: nothing is removed.
NEURON_CORE_BY_TARGET = {"inf2": "NeuronCore-v2", "trn1": "NeuronCore-v2", "trn1n": "NeuronCore-v2",
                         "trn2": "NeuronCore-v3"}
NATIVE_TYPES = {"NeuronCore-v2": ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3"),
                "NeuronCore-v3": ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3")}


@dataclass(frozen=True)
class NeuronKnobs(XlaKnobs):
    """The XLA knobs plus neuronx-cc's, each one flag of NEURON_CC_FLAGS
    (``neuron_cc_flags``). None leaves the compiler's own default."""

    neuron_model_type: Optional[str] = None  # --model-type
    neuron_optlevel: Optional[int] = None  # --optlevel
    neuron_auto_cast: Optional[str] = None  # --auto-cast: what the compiler casts down (precision fp32 only)
    neuron_auto_cast_type: Optional[str] = None  # --auto-cast-type: to which type
    neuron_target: Optional[str] = None  # --target; None: from the instance type

    def __post_init__(self) -> None:
        super().__post_init__()
        for field, allowed in (("neuron_model_type", NEURON_MODEL_TYPES), ("neuron_optlevel", NEURON_OPTLEVELS),
                               ("neuron_auto_cast", NEURON_AUTO_CAST),
                               ("neuron_auto_cast_type", NEURON_AUTO_CAST_TYPES), ("neuron_target", NEURON_TARGETS)):
            value = getattr(self, field)
            if value is not None:
                one_of(field, value, allowed)


def neuron_target_for_instance(instance_type: Optional[str]) -> Optional[str]:
    """``trn1.32xlarge`` -> ``trn1``; None for anything that is not a Neuron instance."""
    if not instance_type:
        return None
    return _TARGET_BY_FAMILY.get(instance_type.split(".", 1)[0])


def neuron_worker_choices(instance_type: Optional[str]) -> list[int]:
    """Data-parallel workers (one NeuronCore each): powers of two up to the cores of the
    instance type (2 when it is unknown, the smallest trn1/inf2)."""
    cores = int(PRICE_TABLE[instance_type].units().get("neuron_cores", 2)) if instance_type in PRICE_TABLE else 2
    return [n for n in (1, 2, 4, 8, 16, 32) if n <= cores]


def suggest_neuron_workers(trial: Any, study: TrainingStudy) -> None:
    """The training study's workers on a Neuron node, but with NaN capture on: a capture
    replays one worker's step, so it needs workers=1."""
    if not study.nan_capture:
        trial.suggest_categorical("workers", neuron_worker_choices(study.instance_type))


def check_neuron_node_type(instance_type: Optional[str]) -> None:
    """On a cluster the driver's own instance (the head) is not where trials run: the
    compiler target, the price and the node type the autoscaler starts all come from the
    node type named."""
    if not instance_type:
        raise ConfigError("--instance-type", "the Neuron node type to sweep on the cluster (one of "
                          + ", ".join(t for t in PRICE_TABLE if neuron_target_for_instance(t)) + ")", None)


def neuron_capabilities(target: str, probed_here: bool = False) -> Capabilities:
    """What a Neuron target's NeuronCores compute natively (NATIVE_TYPES): the
    --auto-cast-type values and precisions they would only emulate (none on any target
    NEURON_TARGETS lists)."""
    core = NEURON_CORE_BY_TARGET[target]
    native = NATIVE_TYPES[core]
    facts = {"target": target, "neuron_core": core,
             **{f"{dtype}_native": dtype in native for dtype in NEURON_AUTO_CAST_TYPES}}
    emulated = {}
    not_native = {dtype: f"{core} ({target}) has no {dtype} arithmetic" for dtype in NEURON_AUTO_CAST_TYPES
                  if dtype not in native}
    if not_native:
        emulated["neuron_auto_cast_type"] = not_native
    where = "the NeuronCore here is not probed" if probed_here else "no NeuronCore here to probe"
    return Capabilities(f"Neuron target {target} ({core})", f"the table for Neuron target {target} ({where})",
                        facts, emulated)


def neuron_device_resources(config: "TrialConfig") -> dict[str, float]:
    """What one worker of a Neuron trial asks Ray for: its CPUs and one NeuronCore. Ray's
    NeuronAcceleratorManager gives the worker core ids from the node's ``neuron_cores``
    and sets NEURON_RT_VISIBLE_CORES to them, so concurrent workers never share a core.
    The stand-in platform (neuron_standin.py) asks with this same function."""
    return {"CPU": config.cpus_per_worker, "neuron_cores": 1}


def check_neuron_instance_type(config: "TrialConfig") -> Optional[str]:
    """The Neuron target of the config's pinned instance type (None when none is pinned);
    a type that is not a Neuron one is refused."""
    if not config.instance_type:
        return None
    target = neuron_target_for_instance(config.instance_type)
    if target is None:
        raise ConfigError("instance_type", f"a Neuron instance type ({', '.join(_TARGET_BY_FAMILY)} families)",
                          config.instance_type)
    return target


def neuron_cc_flags(config: "TrialConfig") -> str:
    knobs: NeuronKnobs = config.knobs
    flags = []
    if knobs.neuron_target:
        flags.append(f"--target={knobs.neuron_target}")
    if knobs.neuron_model_type:
        flags.append(f"--model-type={knobs.neuron_model_type}")
    if knobs.neuron_optlevel:
        flags.append(f"--optlevel={knobs.neuron_optlevel}")
    auto_cast = knobs.neuron_auto_cast
    if get_precision(config.precision).autocasts:
        # torch.autocast decides the casts; the compiler must not cast again.
        auto_cast = "none"
    if auto_cast:
        flags.append(f"--auto-cast={auto_cast}")
    if knobs.neuron_auto_cast_type:
        flags.append(f"--auto-cast-type={knobs.neuron_auto_cast_type}")
    return " ".join(flags)


class NeuronPlatform(XlaPlatform):
    name = "neuron"
    description = "AWS NeuronCores (trn1, trn1n, inf2, trn2) via torch-neuronx"
    # fp32: the compiler's own auto-cast policy applies (see neuron_auto_cast).
    # bf16-autocast: torch.autocast('xla', bf16) with --auto-cast=none.
    # bf16: weights in bf16 with stochastic rounding; replaces the deprecated XLA_USE_BF16.
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none",)  # torch.compile(openxla) is not supported by torch-neuronx
    Knobs = NeuronKnobs
    cost_unit = "neuron_cores"
    hardware = "NEURON"
    # The Neuron runtime reads NEURON_RT_* once, when it starts in a process, and holds
    # its NeuronCores until the process ends: every trial gets a fresh process.
    reuses_processes = False
    # The Neuron persistent cache (aws-neuron-sdk, general/arch/neuron-features/neuron-caching.rst):
    # a directory or s3:// URL; unset, /var/tmp/neuron-compile-cache on each node.
    compiler_packages = ()
    compile_cache_variable = "NEURON_COMPILE_CACHE_URL"
    compile_cache_unset = "/var/tmp/neuron-compile-cache"
    remote_compile_cache = True
    trial_owns_cpus = False  # a worker computes on its NeuronCore

    def study_baseline(self, study: TrainingStudy) -> dict[str, Any]:
        # The compiler's own defaults, spelled out so the baseline is a point of the space.
        return {**super().study_baseline(study), "neuron_target": neuron_target_for_instance(study.instance_type),
                "neuron_model_type": "generic", "neuron_optlevel": 2, "neuron_auto_cast": "matmult",
                "neuron_auto_cast_type": "bf16"}

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """The XLA knobs, workers, and seed 000's compiler experiment: model type, optlevel
        and, with fp32, what the compiler casts down and to which type."""
        super().study_space(trial, precision, study)
        suggest_neuron_workers(trial, study)
        trial.suggest_categorical("neuron_model_type", ["generic", "transformer"])
        trial.suggest_categorical("neuron_optlevel", [1, 2, 3])
        if precision != "fp32":  # torch decides the casts; the compiler must not (validate)
            return {"neuron_auto_cast": None, "neuron_auto_cast_type": None}
        if trial.suggest_categorical("neuron_auto_cast", ["none", "matmult", "all"]) == "none":
            return {"neuron_auto_cast_type": None}
        trial.suggest_categorical("neuron_auto_cast_type", ["bf16", "fp8_e4m3"])
        return None

    def check_cluster_node_type(self, instance_type: Optional[str]) -> None:
        check_neuron_node_type(instance_type)

    def detect(self) -> Detection:
        if importlib.util.find_spec("torch_neuronx") is None:
            return Detection(False, "torch_neuronx is not importable (it ships in the Neuron DLAMI's venv)")
        devices = sorted(glob.glob("/dev/neuron[0-9]*"))
        if not devices:
            return Detection(False, "torch_neuronx is importable but no /dev/neuron* device is present")
        return Detection(True, f"{len(devices)} Neuron device(s): {', '.join(devices)}")

    def capabilities(self, config) -> Capabilities:
        target = (getattr(getattr(config, "knobs", None), "neuron_target", None)
                  or neuron_target_for_instance(getattr(config, "instance_type", None)))
        if target is None:
            return not_known("AWS NeuronCores", "the config names no Neuron target (neuron_target, or a Neuron "
                                                "instance_type such as trn1.2xlarge)")
        return neuron_capabilities(target, probed_here=self.detect().available)

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        knobs: NeuronKnobs = config.knobs
        precision = get_precision(config.precision)
        if precision.autocasts and knobs.neuron_auto_cast not in (None, "none"):
            raise ConfigError("neuron_auto_cast", f"'none' (or unset) with precision {precision.name!r}",
                              knobs.neuron_auto_cast,
                              "torch.autocast already casts; use precision 'fp32' to let the compiler cast.")
        if knobs.neuron_auto_cast_type and knobs.neuron_auto_cast in (None, "none"):
            raise ConfigError("neuron_auto_cast", "'matmult' or 'all' when neuron_auto_cast_type is set",
                              knobs.neuron_auto_cast,
                              f"--auto-cast-type={knobs.neuron_auto_cast_type} has no effect without auto-cast.")
        target = check_neuron_instance_type(config)
        if target is not None:
            if knobs.neuron_target and knobs.neuron_target != target:
                raise ConfigError("neuron_target", f"{target!r} (or unset) on {config.instance_type}",
                                  knobs.neuron_target, "The compiled graphs would not run on the trials' nodes.")

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        return neuron_device_resources(config)

    def train_backend(self, config: "TrialConfig"):
        from accelsweep.trainables.platforms.neuron_backend import NeuronXLAConfig

        return NeuronXLAConfig()

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        env = {"NEURON_CC_FLAGS": neuron_cc_flags(config)}
        # Weights held in bf16 lose small updates to round-to-nearest; the runtime's
        # stochastic rounding keeps them on average (what XLA_USE_BF16 used to switch on).
        bf16_weights = get_precision(config.precision).parameters == "bfloat16"
        env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if bf16_weights else "0"
        # One cache (a directory every node sees, or s3://) for all trials and sweeps: a
        # graph compiled once is never compiled again (compile_cache_env).
        return {**env, **self.compile_cache_env(config)}

    def compile_cache(self, config: "TrialConfig") -> Optional[str]:
        # Neuron keys its own cache on neuronx-cc's version and NEURON_CC_FLAGS
        # (compiler_packages is empty: trainables/compile_cache.py says why).
        return cache_location(config.compile_cache, self.name)

    def runtime_env(self) -> dict[str, str]:
        return {}  # torch-neuronx brings its own PJRT device (NEURON); torch_device checks what it got

    def describe_device(self, device) -> str:
        return f"neuron: NeuronCore ({device})"

    def explain_failure(self, error, config, since):
        return neuron_errors.explain(error, neuron_cc_flags(config),
                                     neuron_errors.compile_log_roots(self.compile_cache(config)), since)

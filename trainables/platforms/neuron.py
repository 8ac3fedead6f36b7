"""AWS Trainium / Inferentia NeuronCores through torch-neuronx (an XLA device).

Everything here that needs no NeuronCore is tested on any machine: detection, the
NEURON_CC_FLAGS composed from knobs, the runtime environment and the Ray resources.
The training itself is the XLA code path, tested with torch-xla on the CPU.
"""

from __future__ import annotations

import glob
import importlib.util
from typing import TYPE_CHECKING, Optional

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms.xla import XlaPlatform
from accelsweep.trainables.platforms.base import Detection

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig

# Instance family -> neuronx-cc --target.
_TARGET_BY_FAMILY = {"inf2": "inf2", "trn1": "trn1", "trn1n": "trn1n", "trn2": "trn2"}


def neuron_target_for_instance(instance_type: Optional[str]) -> Optional[str]:
    """``trn1.32xlarge`` -> ``trn1``; None for anything that is not a Neuron instance."""
    if not instance_type:
        return None
    return _TARGET_BY_FAMILY.get(instance_type.split(".", 1)[0])


def neuron_cc_flags(config: "TrialConfig") -> str:
    flags = []
    if config.neuron_target:
        flags.append(f"--target={config.neuron_target}")
    if config.neuron_model_type:
        flags.append(f"--model-type={config.neuron_model_type}")
    if config.neuron_optlevel:
        flags.append(f"--optlevel={config.neuron_optlevel}")
    auto_cast = config.neuron_auto_cast
    if config.precision == "bf16-autocast":
        # torch.autocast decides the casts; the compiler must not cast again.
        auto_cast = "none"
    if auto_cast:
        flags.append(f"--auto-cast={auto_cast}")
    if config.neuron_auto_cast_type:
        flags.append(f"--auto-cast-type={config.neuron_auto_cast_type}")
    return " ".join(flags)


class NeuronPlatform(XlaPlatform):
    name = "neuron"
    description = "AWS NeuronCores (trn1, trn1n, inf2, trn2) via torch-neuronx"
    # fp32: the compiler's own auto-cast policy applies (see neuron_auto_cast).
    # bf16-autocast: torch.autocast('xla', bf16) with --auto-cast=none.
    # bf16: weights in bf16 with stochastic rounding; replaces the deprecated XLA_USE_BF16.
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none",)  # torch.compile(openxla) is not supported by torch-neuronx
    knobs = frozenset({"batches_per_execution", "compile_cache", "neuron_model_type", "neuron_optlevel",
                       "neuron_auto_cast", "neuron_auto_cast_type", "neuron_target"})
    cost_unit = "neuron_cores"
    # The Neuron runtime reads NEURON_RT_* once, when it starts in a process, and holds
    # its NeuronCores until the process ends: every trial gets a fresh process.
    reuses_processes = False

    def detect(self) -> Detection:
        if importlib.util.find_spec("torch_neuronx") is None:
            return Detection(False, "torch_neuronx is not importable (it ships in the Neuron DLAMI's venv)")
        devices = sorted(glob.glob("/dev/neuron[0-9]*"))
        if not devices:
            return Detection(False, "torch_neuronx is importable but no /dev/neuron* device is present")
        return Detection(True, f"{len(devices)} Neuron device(s): {', '.join(devices)}")

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        if config.precision == "bf16-autocast" and config.neuron_auto_cast not in (None, "none"):
            raise ConfigError("neuron_auto_cast", "'none' (or unset) with precision 'bf16-autocast'",
                              config.neuron_auto_cast,
                              "torch.autocast already casts; use precision 'fp32' to let the compiler cast.")
        if config.neuron_auto_cast_type and config.neuron_auto_cast in (None, "none"):
            raise ConfigError("neuron_auto_cast", "'matmult' or 'all' when neuron_auto_cast_type is set",
                              config.neuron_auto_cast,
                              f"--auto-cast-type={config.neuron_auto_cast_type} has no effect without auto-cast.")
        if config.instance_type:
            target = neuron_target_for_instance(config.instance_type)
            if target is None:
                raise ConfigError("instance_type", f"a Neuron instance type ({', '.join(_TARGET_BY_FAMILY)} families)",
                                  config.instance_type)
            if config.neuron_target and config.neuron_target != target:
                raise ConfigError("neuron_target", f"{target!r} (or unset) on {config.instance_type}",
                                  config.neuron_target, "The compiled graphs would not run on the trials' nodes.")

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        # Ray sets NEURON_RT_VISIBLE_CORES for each worker from this request.
        return {"CPU": config.cpus_per_worker, "neuron_cores": 1}

    def train_backend(self, config: "TrialConfig"):
        from accelsweep.trainables.platforms.neuron_backend import NeuronXLAConfig

        return NeuronXLAConfig()

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        env = {"NEURON_CC_FLAGS": neuron_cc_flags(config)}
        env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if config.precision == "bf16" else "0"
        if config.compile_cache:
            # One cache (a directory every node sees, or s3://) for all trials and sweeps:
            # a graph compiled once is never compiled again.
            env["NEURON_COMPILE_CACHE_URL"] = config.compile_cache
        return env

    def describe_device(self, device) -> str:
        return f"neuron: NeuronCore ({device})"

    def explain_failure(self, error, config, since):
        from accelsweep.trainables.platforms import neuron_errors

        return neuron_errors.explain(error, neuron_cc_flags(config),
                                     neuron_errors.compile_log_roots(config.compile_cache), since)

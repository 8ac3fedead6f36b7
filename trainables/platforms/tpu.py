"""Cloud TPUs. Training goes through PyTorch/XLA with ``PJRT_DEVICE=TPU`` (the xla
platform's code path, on TPU's PJRT client); kernel microbenchmarks run JAX and Pallas
natively there. Each trial asks Ray for one ``TPU`` (Ray's TPU resource, one chip).

The driver side (detection, resources, environment, validation) is tested anywhere; the
trial side is the xla platform's, tested on torch-xla's CPU client."""

from __future__ import annotations

import glob
import importlib.util
from typing import TYPE_CHECKING, Any, Optional

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms.base import Detection, TrainingStudy
from accelsweep.trainables.platforms.capabilities import Capabilities
from accelsweep.trainables.platforms.xla import XlaPlatform

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig


class TpuPlatform(XlaPlatform):
    name = "tpu"
    description = "Cloud TPU through PyTorch/XLA (PJRT_DEVICE=TPU)"
    cost_unit = "TPU"
    hardware = "TPU"
    jax_backend = "tpu"
    # XLA's TPU compiler ships in libtpu: its version names the compile cache's directory too.
    compiler_packages = ("torch", "torch-xla", "libtpu")
    trial_owns_cpus = False  # a trial computes on its chip

    def detect(self) -> Detection:
        # TPU VMs expose their chips as /dev/accel* (v4 and later) or /dev/vfio/* (v5e, v6e).
        chips = glob.glob("/dev/accel*") + [p for p in glob.glob("/dev/vfio/*") if not p.endswith("/vfio")]
        if not chips:
            return Detection(False, "no TPU chips (/dev/accel* or /dev/vfio/*) on this machine")
        if importlib.util.find_spec("torch_xla") is None and importlib.util.find_spec("jax") is None:
            return Detection(False, f"{len(chips)} TPU device node(s), but neither torch_xla nor jax is installed")
        return Detection(True, f"{len(chips)} TPU device node(s)")

    @staticmethod
    def pjrt_device() -> str:
        return "TPU"

    def capabilities(self, config) -> Capabilities:
        # "By default, TPUs perform matrix multiplication operations with bfloat16 values and
        # accumulations with IEEE float32 values" (cloud.google.com/tpu/docs/bfloat16): bf16 is
        # native on every TPU. Nothing else is documented per generation here: nothing removed.
        return Capabilities("Cloud TPU", "the Cloud TPU docs (bf16 is every TPU's matmul type; no TPU generation "
                                         "is read)", {"bf16_native": True})

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        # The generic knobs only: batches_per_execution stays 1 until the study has run on a TPU.
        return None

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        if config.workers > 1:
            raise ConfigError("workers", "1 on platform 'tpu'", config.workers,
                              "Several TPU workers (torch_xla SPMD or xmp.spawn per host) are not wired up yet.")

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        return {"CPU": config.cpus_per_worker, "TPU": 1}

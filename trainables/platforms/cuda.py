"""NVIDIA GPUs through PyTorch CUDA. Ray sets CUDA_VISIBLE_DEVICES per trial, so the
trial's GPU is always cuda:0 inside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from accelsweep.trainables.platforms.base import (Detection, Platform, PlatformKnobs, boolean, channels_last_format,
                                                  optional_str)

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


@dataclass(frozen=True)
class CudaKnobs(PlatformKnobs):
    # Model weights and inputs in channels_last (NHWC): what cuDNN's tensor-core
    # convolutions want.
    channels_last: bool = False
    # The GPU model trials must run on, as Ray names it ("H100", "A10G"); None: any GPU.
    accelerator_type: Optional[str] = None

    def __post_init__(self) -> None:
        boolean("channels_last", self.channels_last)
        optional_str("accelerator_type", self.accelerator_type, "a Ray accelerator type such as 'H100'")


class CudaPlatform(Platform):
    name = "cuda"
    description = "NVIDIA GPU, eager or torch.compile (inductor)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "inductor")
    Knobs = CudaKnobs
    autocast_device_type = "cuda"
    cost_unit = "GPU"

    def detect(self) -> Detection:
        try:
            import torch
        except ImportError as error:
            return Detection(False, f"torch is not importable ({error})")
        if not torch.cuda.is_available():
            return Detection(False, "torch.cuda.is_available() is False (no NVIDIA GPU or driver)")
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return Detection(True, f"{torch.cuda.device_count()} GPU(s): {', '.join(names)}")

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        resources = {"CPU": config.cpus_per_worker, "GPU": 1}
        if config.knobs.accelerator_type:
            # Ray's custom resource for a GPU model; a tiny amount only pins the node type.
            resources[f"accelerator_type:{config.knobs.accelerator_type}"] = 0.001
        return resources

    def train_backend(self, config: "TrialConfig"):
        from ray.train.torch import TorchConfig

        return TorchConfig(backend="nccl")

    def distribute(self, model, device):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index])

    def device(self, config: "TrialConfig") -> "torch.device":
        import torch

        return torch.device("cuda", 0)

    def memory_format(self, config: "TrialConfig") -> "torch.memory_format":
        return channels_last_format(config.knobs.channels_last)

    def sync(self, device: "torch.device") -> None:
        import torch

        torch.cuda.synchronize(device)

    def reset_peak_memory(self, device: "torch.device") -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)

    def peak_memory_mb(self, device: "torch.device") -> float:
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20

    def describe_device(self, device: "torch.device") -> str:
        import torch

        return f"cuda: {torch.cuda.get_device_name(device)}"

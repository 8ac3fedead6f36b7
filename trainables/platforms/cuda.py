"""NVIDIA GPUs through PyTorch CUDA. Ray sets CUDA_VISIBLE_DEVICES per trial, so the
trial's GPU is always cuda:0 inside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelsweep.trainables.platforms.base import Detection, Platform

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


class CudaPlatform(Platform):
    name = "cuda"
    description = "NVIDIA GPU, eager or torch.compile (inductor)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "inductor")
    knobs = frozenset({"channels_last", "accelerator_type"})
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
        if config.accelerator_type:
            # Ray's custom resource for a GPU model; a tiny amount only pins the node type.
            resources[f"accelerator_type:{config.accelerator_type}"] = 0.001
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

    def autocast(self, config: "TrialConfig"):
        import contextlib

        import torch

        if config.precision == "bf16-autocast":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

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

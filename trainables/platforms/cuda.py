"""NVIDIA GPUs through PyTorch CUDA. Ray sets CUDA_VISIBLE_DEVICES per trial, so the
trial's GPU is always cuda:0 inside it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from accelsweep.trainables.measure import Window
from accelsweep.trainables.errors import boolean, optional_str
from accelsweep.trainables.platforms.base import (Detection, Platform, PlatformKnobs, PlatformUnavailable,
                                                  channels_last_format)

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
    jax_backend = "gpu"
    call_timer = "cuda events"

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

    def torch_device(self) -> "torch.device":
        import torch

        if not torch.cuda.is_available():
            raise PlatformUnavailable(f"platform {self.name} needs a CUDA GPU, but torch.cuda.is_available() is False "
                                      f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                                      f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): nothing timed")
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

    def memory_in_use_mb(self, device: "torch.device") -> float:
        import torch

        return torch.cuda.memory_allocated(device) / 2**20

    def describe_device(self, device: "torch.device") -> str:
        import torch

        return f"cuda: {torch.cuda.get_device_name(device)}"

    def time_calls(self, call: Callable[[], Any], device: "torch.device", min_calls: int,
                   min_seconds: float) -> Window:
        """Each call's GPU time from a pair of CUDA events; one synchronize at the window's
        end, so the host never stalls the stream mid-window."""
        import torch

        torch.cuda.synchronize()
        start = time.perf_counter()
        events = []
        while len(events) < min_calls or time.perf_counter() - start < min_seconds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call()
            end.record()
            events.append((begin, end))
            if len(events) % 64 == 0:
                end.synchronize()  # keep the host at most 64 calls ahead, so the clock above means something
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return Window(steps=len(events), seconds=seconds,
                      step_seconds=[begin.elapsed_time(end) / 1e3 for begin, end in events])

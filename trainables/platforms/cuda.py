"""NVIDIA GPUs through PyTorch CUDA. Ray sets CUDA_VISIBLE_DEVICES per trial, so the
trial's GPU is always cuda:0 inside it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from accelsweep.trainables.timing.device import (AsyncBatchWindow, CallWaitsForDevice, DeviceTraceUnavailable,
                                                         HeldStream, HeldWindow, async_batch_window, held_batch_window,
                                                         traced_batch_window)
from accelsweep.trainables.timing.windows import Window, time_window
from accelsweep.trainables.errors import boolean, optional_str
from accelsweep.trainables.platforms.base import (Detection, Platform, PlatformKnobs, PlatformUnavailable,
                                                  TrainingStudy, channels_last_format)
from accelsweep.trainables.platforms.capabilities import Capabilities, emulated_bf16, not_known
from accelsweep.trainables.platforms.jax_trace import JaxDeviceTrace

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


SM = tuple[int, int]  # a compute capability: (major, minor)

# What a compute capability gives, as PyTorch and NVIDIA check it:
# - bf16 arithmetic from sm80: torch.cuda.is_bf16_supported(including_emulation=False) is
#   `major >= 8`; below it torch only emulates bf16. TF32 likewise (torch.cuda.is_tf32_supported).
# - fp8 matmuls from sm89: torch._scaled_mm "is only supported on CUDA devices with compute
#   capability >= 9.0 or 8.9" (aten/src/ATen/native/cuda/Blas.cpp).
BF16_SM = TF32_SM = (8, 0)
FP8_SM = (8, 9)
# The attention implementations (the image-classification workload's ``attention`` knob)
# that need a newer GPU than some have: SDPA's backends by their check_*_hardware_support in
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (flash and cuDNN sm80+, memory-
# efficient sm50+; their upper bound, sm121 in torch 2.14, moves with each release), and
# FlashAttention-2, which supports "Ampere, Ada, or Hopper GPUs" (Dao-AILab/flash-attention's
# README). SDPA's math backend and timm's own module run on any GPU.
ATTENTION_MIN_SM: dict[str, tuple[SM, str]] = {
    "sdpa-flash": ((8, 0), "SDPA's flash backend"),
    "sdpa-cudnn": ((8, 0), "SDPA's cuDNN backend"),
    "sdpa-efficient": ((5, 0), "SDPA's memory-efficient backend"),
    "flash-attn": ((8, 0), "FlashAttention-2"),
}
# The attention implementations the training study searches on a GPU: SDPA, the
# dispatcher's choice, and each of its backends forced (kernels/attention).
STUDY_ATTENTIONS = ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
# Compute capability by Ray accelerator type (CudaKnobs.accelerator_type), from NVIDIA's
# lists (developer.nvidia.com/cuda-gpus and /cuda-legacy-gpus). AWS's A10G is not on them.
COMPUTE_CAPABILITY: dict[str, SM] = {
    "P100": (6, 0), "V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "L4": (8, 9), "L40S": (8, 9), "H100": (9, 0),
    "H200": (9, 0), "B200": (10, 0), "GB200": (10, 0), "B300": (10, 3), "GB300": (10, 3),
}


def cuda_capabilities(capability: SM, name: str, source: str) -> Capabilities:
    """What a GPU of compute capability ``capability`` does natively, and the precisions
    and attention implementations it only emulates or lacks."""
    sm = f"{capability[0]}.{capability[1]}"
    facts = {"gpu": name, "compute_capability": sm, "bf16_native": capability >= BF16_SM,
             "tf32": capability >= TF32_SM, "fp8": capability >= FP8_SM}
    facts.update({attention.replace("-", "_"): capability >= needs
                  for attention, (needs, _) in ATTENTION_MIN_SM.items()})
    emulated = {}
    if capability < BF16_SM:
        emulated.update(emulated_bf16(f"no native bf16 on {name} (compute capability {sm}): bf16 arithmetic needs "
                                      "sm80 or newer (torch.cuda.is_bf16_supported(including_emulation=False))"))
    lacking = {attention: f"{what} needs compute capability {needs[0]}.{needs[1]} or newer; {name} has {sm}"
               for attention, (needs, what) in ATTENTION_MIN_SM.items() if capability < needs}
    if lacking:
        emulated["attention"] = lacking
    return Capabilities(f"{name} (compute capability {sm})", source, facts, emulated)


# What an NVIDIA driver leaves on a host, in a container given GPUs, or under WSL 2 (/dev/dxg).
NVIDIA_DRIVER_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")


def local_gpu() -> Union[tuple[SM, str], str]:
    """GPU 0 of this machine: (compute capability, name), from torch when it sees a GPU,
    else from nvidia-smi; or why neither could say."""
    try:
        import torch

        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)
    except ImportError:
        pass
    if shutil.which("nvidia-smi") is None:
        return "no GPU visible to torch and no nvidia-smi on this machine"
    try:
        answer = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
        capability, name = answer.splitlines()[0].split(",", 1)  # "9.0, NVIDIA H100 80GB HBM3"
        major, minor = capability.strip().split(".")
        return (int(major), int(minor)), name.strip()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return f"nvidia-smi did not give GPU 0's compute capability ({error})"


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
    description = "NVIDIA GPU, eager or torch.compile (inductor; max-autotune; reduce-overhead: CUDA graphs)"
    precisions = ("fp32", "bf16-autocast", "fp16-autocast", "bf16")
    compile_modes = ("none", "inductor", "max-autotune", "reduce-overhead")
    Knobs = CudaKnobs
    autocast_device_type = "cuda"
    cost_unit = "GPU"
    jax_backend = "gpu"
    call_timer = HeldWindow.timer  # "cuda events around a held batch"
    # Inductor's GPU kernels are Triton's: its version names the compile cache's directory too.
    compiler_packages = ("torch", "triton")
    training_precision = "bf16-autocast"  # the seeds' GPU runs
    loader_processes = True
    host_read_cost = ("a cudaStreamSynchronize: the host waits for the GPU's queue to drain "
                      "(torch.cuda.set_sync_debug_mode('warn') reports each)")
    study_batch_sizes = (16, 32, 64, 128)  # one GPU, not a NeuronCore: the seed's 16 and up

    def detect(self) -> Detection:
        # Importing torch costs a sweep's driver seconds of CPU that it otherwise never
        # spends on a host without a GPU; torch finds no GPU where the driver left no files.
        if not any(os.path.exists(path) for path in NVIDIA_DRIVER_FILES):
            return Detection(False, f"no NVIDIA driver on this machine (none of {', '.join(NVIDIA_DRIVER_FILES)})")
        try:
            import torch
        except ImportError as error:
            return Detection(False, f"torch is not importable ({error})")
        if not torch.cuda.is_available():
            return Detection(False, "torch.cuda.is_available() is False (no NVIDIA GPU or driver)")
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return Detection(True, f"{torch.cuda.device_count()} GPU(s): {', '.join(names)}")

    def capabilities(self, config) -> Capabilities:
        # A config pinned to a GPU model runs there, whatever this machine has.
        pinned = getattr(getattr(config, "knobs", None), "accelerator_type", None)
        if pinned in COMPUTE_CAPABILITY:
            return cuda_capabilities(COMPUTE_CAPABILITY[pinned], pinned,
                                     f"the table for accelerator type {pinned} (NVIDIA's compute capability list)")
        if pinned:
            return not_known(f"NVIDIA {pinned}", f"accelerator type {pinned!r} is not in the compute capability table "
                                                 f"({', '.join(COMPUTE_CAPABILITY)}), and this machine's GPU need not "
                                                 "be one")
        found = local_gpu()
        if isinstance(found, str):
            return not_known("NVIDIA GPU", found)
        capability, name = found
        return dataclasses.replace(cuda_capabilities(capability, name, f"GPU 0 on this machine (compute capability "
                                                                       f"{capability[0]}.{capability[1]})"),
                                   read_here=True)

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """channels_last, every compile mode and, with 16-bit inputs, the attention kernels: a
        forced SDPA backend needs them for flash and cuDNN, so with fp32 the trial keeps timm's
        own SDPA. The space is the same on every GPU; a GPU that lacks a value (sm < 80: bf16,
        flash, cuDNN) has it removed before any trial (``capabilities``)."""
        trial.suggest_categorical("channels_last", [False, True])
        trial.suggest_categorical("torch_compile", list(self.compile_modes))
        if precision == "fp32":
            return {"attention": "sdpa"}
        trial.suggest_categorical("attention", list(STUDY_ATTENTIONS))
        return None

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
        # CUDA starts lazily, at the first allocation; the loop resets and reads the memory
        # statistics before that, and on a fresh process torch 2.11 refuses them ("Invalid
        # device argument").
        torch.cuda.init()
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

    def memory_capacity_mb(self, device: "torch.device") -> float:
        import torch

        return torch.cuda.get_device_properties(device).total_memory / 2**20

    def memory_in_use_mb(self, device: "torch.device") -> float:
        import torch

        return torch.cuda.memory_allocated(device) / 2**20

    def describe_device(self, device: "torch.device") -> str:
        import torch

        return f"cuda: {torch.cuda.get_device_name(device)}"

    def time_calls(self, call: Callable[[], Any], device: "torch.device", min_calls: int,
                   min_seconds: float) -> Window:
        """Device time per call, from held batches (trainables/timing/device.py): the stream
        is held by a spin kernel while a batch of calls is enqueued, and CUDA events around
        the batch time the GPU's work alone, never the host's launches. A call that waits
        for the GPU itself (torchvision's NMS reads its kept count back) cannot be held:
        it is timed on the host clock around each call and a synchronize, and says so."""
        stream = self.held_stream()
        try:
            return held_batch_window(call, stream, min_calls, min_seconds, clock=self.host_clock)
        except CallWaitsForDevice:
            window = time_window(lambda: (call(), stream.synchronize()), stream.synchronize, min_calls, min_seconds,
                                 clock=self.host_clock)
            return HeldWindow(steps=window.steps, seconds=window.seconds, step_seconds=window.step_seconds,
                              timer=CALL_SYNCHRONISES_TIMER)

    def held_stream(self) -> HeldStream:
        return _CudaStream()

    def host_clock(self) -> float:
        return time.perf_counter()

    def time_jax_calls(self, call: Callable[[], Any], wait: Callable[[Any], Any], min_calls: int,
                       min_seconds: float) -> Window:
        """JAX gives no stream to hold: batches of async calls, one block_until_ready each,
        timed by the GPU's own record (CUPTI through jax.profiler, trainables/platforms/jax_trace.py).
        Where that record cannot be taken, the host clock over each batch, and the window's
        timer says so and why (for a launch-bound call that is the host's dispatch)."""
        try:
            return traced_batch_window(call, wait, min_calls, min_seconds, JaxDeviceTrace(), clock=self.host_clock)
        except DeviceTraceUnavailable as unavailable:
            window = async_batch_window(call, wait, min_calls, min_seconds, clock=self.host_clock)
            window.timer = f"{AsyncBatchWindow.timer} (the device trace was unavailable: {unavailable})"
            return window


# The timer of a call that synchronises with the host (CudaPlatform.time_calls).
CALL_SYNCHRONISES_TIMER = "host clock around each call and a synchronize (the call waits for the GPU itself)"


class _CudaStream:
    """The current CUDA stream as a HeldStream: ``torch.cuda._sleep`` spins it for a number
    of GPU clock cycles, and CUDA events mark and time it."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda
        self.cycles_per_s = self._spin_rate()

    def _spin_rate(self) -> float:
        """Cycles of ``_sleep`` per second, measured (the first spin loads the kernel). Only
        a first guess: held_batch_window measures each hold and corrects for the GPU's clock."""
        cycles = 1_000_000
        for _ in range(2):
            begin = self.mark()
            self.cuda._sleep(cycles)
            end = self.mark()
            end.synchronize()
        return cycles / self.between(begin, end)

    def hold(self, seconds: float) -> None:
        self.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))

    def mark(self) -> "torch.cuda.Event":
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def reached(self, marker: "torch.cuda.Event") -> bool:
        return marker.query()

    def between(self, first: "torch.cuda.Event", second: "torch.cuda.Event") -> float:
        return first.elapsed_time(second) / 1e3

    def synchronize(self) -> None:
        self.cuda.synchronize()

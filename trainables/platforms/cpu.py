"""The host CPU: eager PyTorch or torch.compile (inductor), intra-op threads as a knob."""

from __future__ import annotations

import os
import platform as host
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from accelsweep.trainables.errors import ConfigError, boolean, positive_int
from accelsweep.trainables.platforms.base import Detection, Platform, PlatformKnobs, channels_last_format

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host.processor() or host.machine()


def _read_status_mb(field: str) -> float:
    """A memory figure of /proc/self/status (VmHWM: peak RSS, VmRSS: RSS now), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


@dataclass(frozen=True)
class CpuKnobs(PlatformKnobs):
    # Intra-op threads (torch.set_num_threads, set per trial); None: cpus_per_worker.
    threads: Optional[int] = None
    # Model weights and inputs in channels_last (NHWC) memory format: faster convolutions
    # with oneDNN on many CPUs (the CPU post's knob).
    channels_last: bool = False

    def __post_init__(self) -> None:
        if self.threads is not None:
            positive_int("threads", self.threads)
        boolean("channels_last", self.channels_last)


class CpuPlatform(Platform):
    name = "cpu"
    description = "host CPU, eager or torch.compile (inductor)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "inductor")
    Knobs = CpuKnobs
    autocast_device_type = "cpu"
    cost_unit = "CPU"
    host_clock_times_steps = True  # CPU kernels run synchronously on the calling thread
    jax_backend = "cpu"

    def detect(self) -> Detection:
        return Detection(True, f"{os.cpu_count()} logical CPUs ({cpu_model_name()})")

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        threads = config.knobs.threads
        if threads is not None and threads > config.cpus_per_worker:
            raise ConfigError("threads", f"<= cpus_per_worker ({config.cpus_per_worker})", threads,
                              "More intra-op threads than CPUs held only oversubscribes the cores.")

    def threads(self, config: "TrialConfig") -> int:
        """The intra-op threads a trial runs with: the knob, else every CPU it holds."""
        threads = config.knobs.threads
        return threads if threads is not None else config.cpus_per_worker

    def memory_format(self, config: "TrialConfig") -> "torch.memory_format":
        return channels_last_format(config.knobs.channels_last)

    def device(self, config: "TrialConfig") -> "torch.device":
        import torch

        # Set per trial: a reused trial process keeps whatever the last trial chose.
        torch.set_num_threads(self.threads(config))
        return self.torch_device()

    def torch_device(self) -> "torch.device":
        import torch

        return torch.device("cpu")

    def sync(self, device: "torch.device") -> None:
        pass  # nothing is queued: CPU ops have finished when they return

    def reset_peak_memory(self, device: "torch.device") -> None:
        # Linux: writing 5 to clear_refs resets VmHWM (peak RSS) for this process, so a
        # reused trial process reports this trial's peak, not an earlier trial's. Where it
        # cannot (a sandbox without clear_refs), the peak is the process's lifetime one.
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
            self._peak_was_reset = True
        except OSError:
            self._peak_was_reset = False

    def peak_memory_mb(self, device: "torch.device") -> float:
        # The process's peak RSS: torch, Ray and the interpreter (hundreds of MB) included;
        # workload_memory_mb is the part above what the process held before the workload.
        try:
            return _read_status_mb("VmHWM")
        except OSError:
            return float("nan")

    def memory_in_use_mb(self, device: "torch.device") -> float:
        if not getattr(self, "_peak_was_reset", False):
            return float("nan")  # a peak that may be an earlier trial's: no workload figure
        try:
            return _read_status_mb("VmRSS")
        except OSError:
            return float("nan")

    def describe_device(self, device: "torch.device") -> str:
        import torch

        return f"cpu: {cpu_model_name()}, {torch.get_num_threads()} intra-op threads"

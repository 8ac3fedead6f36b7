"""PyTorch/XLA devices (PJRT). The same code path Neuron uses, minus its compiler: here
it is tested for real on the CPU with PJRT_DEVICE=CPU.

XLA is lazy: ops record a graph, ``torch_xla.sync()`` cuts and runs it. MpDeviceLoader
cuts the graph once per batch and uploads ``batches_per_execution`` batches at a time;
``xm.optimizer_step`` reduces gradients across workers before the step.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any, Iterable

from trainables.platforms.base import Detection, Platform

if TYPE_CHECKING:
    import torch

    from trainables.config import TrialConfig


class XlaPlatform(Platform):
    name = "xla"
    description = "PyTorch/XLA device (PJRT_DEVICE, CPU by default)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "openxla")
    knobs = frozenset({"batches_per_execution"})
    cost_unit = "CPU"

    def detect(self) -> Detection:
        if importlib.util.find_spec("torch_xla") is None:
            return Detection(False, "torch_xla is not installed (pip install torch==2.9.0 torch_xla==2.9.0)")
        return Detection(True, f"torch_xla importable, PJRT_DEVICE={self.pjrt_device()}")

    @staticmethod
    def pjrt_device() -> str:
        return os.environ.get("PJRT_DEVICE", "CPU")

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        return {"PJRT_DEVICE": self.pjrt_device()}

    def device(self, config: "TrialConfig") -> "torch.device":
        import torch_xla

        return torch_xla.device()

    def device_batches(self, loader: Iterable, device: "torch.device", config: "TrialConfig") -> Iterable:
        import torch_xla.distributed.parallel_loader as parallel_loader

        return parallel_loader.MpDeviceLoader(
            loader, device, batches_per_execution=config.batches_per_execution
        )

    def optimizer_step(self, optimizer: Any) -> None:
        import torch_xla.core.xla_model as xm

        xm.optimizer_step(optimizer)

    def autocast(self, config: "TrialConfig"):
        import contextlib

        import torch

        if config.precision == "bf16-autocast":
            return torch.autocast("xla", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self, device: "torch.device") -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()  # cut and launch any pending graph
        xm.wait_device_ops()  # then wait for the device to finish it

    def peak_memory_mb(self, device: "torch.device") -> float:
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(device)
        except (RuntimeError, ValueError):
            return float("nan")  # not every PJRT client reports memory (the CPU one may not)
        peak = info.get("peak_bytes_used", info.get("bytes_used"))
        return float("nan") if peak is None else peak / 2**20

    def describe_device(self, device: "torch.device") -> str:
        import torch_xla.core.xla_model as xm

        return f"xla: {xm.xla_device_hw(device)} ({device})"

    def compile_stats(self) -> dict[str, float]:
        import torch_xla.debug.metrics as metrics

        data = metrics.metric_data("CompileTime")
        if data is None:
            return {"xla_compiles": 0.0, "xla_compile_s": 0.0}
        count, total_ns, _samples = data
        return {"xla_compiles": float(count), "xla_compile_s": total_ns / 1e9}

"""PyTorch/XLA devices (PJRT). The same code path Neuron uses, minus its compiler: here
it is tested for real on the CPU with PJRT_DEVICE=CPU.

XLA is lazy: ops record a graph, ``torch_xla.sync()`` cuts it, compiles it (once per
distinct graph) and runs it. ``batches_per_execution`` (k) traces k training steps into
one graph (fewer launches, a bigger graph to compile). torch-xla's MpDeviceLoader counts
its groups from its own start, which the loop's timing syncs do not reset, so its groups
drift and each new drift is a new graph to compile; here ``_ExecutionGroups`` cuts the
graph instead, counting from every ``sync``, and MpDeviceLoader only uploads in the
background. Graphs stay steady when the loop syncs after a multiple of k steps.
``xm.optimizer_step`` all-reduces the gradients across replicas, then steps.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from accelsweep.trainables.compile_cache import cache_location
from accelsweep.trainables.errors import ConfigError, positive_int
from accelsweep.trainables.platforms.base import (Detection, Platform, PlatformKnobs, PlatformUnavailable,
                                                  TrainingStudy, platform_knob)
from accelsweep.trainables.platforms.capabilities import Capabilities, not_known
from accelsweep.trainables.platforms.cpu import CpuPlatform

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


# XLA's CPU compiler rewrites bf16 ops as f32 ones ("Convert BF16 and F8 operations to F32
# ... so that the CPU backend can support BF16/F8 operations without directly implementing
# a BF16/F8 lowering for most ops": the FloatNormalization pass in openxla/xla
# xla/service/cpu/cpu_compiler.cc). Only a dot that a library takes (oneDNN, XNNPACK:
# cpu_float_support.h, which asks the CPU's features) is left in bf16. So on a CPU without
# bf16 instructions every bf16 op is emulated; on one with them dots may run in bf16, and
# bf16 is kept there (not known to be slower).
XLA_CPU_BF16 = "upcast to f32 by XLA's CPU compiler (FloatNormalization), except dots a library runs in bf16"


def xla_cpu_capabilities(cpu: Capabilities) -> Capabilities:
    """The XLA CPU client's capabilities on a CPU with ``cpu`` (CpuPlatform.capabilities)."""
    hardware = f"XLA CPU client on {cpu.hardware}"
    if not cpu.known:
        return Capabilities(hardware, cpu.source, read_here=cpu.read_here)
    source = f"{cpu.source}, and XLA's CPU compiler (xla/service/cpu/cpu_compiler.cc)"
    emulated = {knob: {value: f"{reason}; XLA's CPU compiler upcasts bf16 ops to f32 (FloatNormalization)"
                       for value, reason in values.items()} for knob, values in cpu.emulated.items()}
    return Capabilities(hardware, source, {**cpu.facts, "xla_cpu_bf16": XLA_CPU_BF16}, emulated,
                        read_here=cpu.read_here)


class _ExecutionGroups:
    """Device batches, with the graph cut before every ``per_execution``-th batch
    counted from the last cut. ``restart`` is called after any other cut (a sync)."""

    def __init__(self, batches: Iterable, per_execution: int):
        self._batches: Iterator = iter(batches)
        self._per_execution = per_execution
        self._traced = 0  # batches handed out since the graph was last cut

    def __iter__(self) -> "_ExecutionGroups":
        return self

    def __next__(self):
        if self._traced >= self._per_execution:
            import torch_xla

            torch_xla.sync()  # the last k steps become one graph
            self._traced = 0
        batch = next(self._batches)
        self._traced += 1
        return batch

    def restart(self) -> None:
        self._traced = 0


@dataclass(frozen=True)
class XlaKnobs(PlatformKnobs):
    """The knobs of every XLA platform (xla, tpu; neuron adds its compiler's)."""

    # Training steps traced into one graph and run as one execution (see the module
    # docstring); the loop warms up and times whole groups. (Where compiled graphs are
    # cached is the generic ``compile_cache`` field: trainables/compile_cache.py.)
    # Searched: the seed's MpDeviceLoader ran 10 steps a graph.
    batches_per_execution: int = platform_knob(1, searched=(1, 4, 10))

    def __post_init__(self) -> None:
        positive_int("batches_per_execution", self.batches_per_execution)


# What a smoke run searches for batches_per_execution (XlaPlatform.study_space): the one-step
# graph and the smallest multi-step one.
SMOKE_BATCHES_PER_EXECUTION = (1, 2)


class XlaPlatform(Platform):
    name = "xla"
    description = "PyTorch/XLA device (PJRT_DEVICE, CPU by default)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "openxla")
    Knobs = XlaKnobs
    # torch.autocast("xla") works on every PJRT device, the CPU included;
    # torch_xla.amp.autocast would ignore it on anything but TPU and Neuron.
    autocast_device_type = "xla"
    cost_unit = "CPU"
    torch_on_xla = True
    # The hardware torch-xla must report (xm.xla_device_hw); None: whatever PJRT_DEVICE names.
    hardware: Optional[str] = None
    # The op is traced and launched every call, as in a model; its graph compiles once.
    call_timer = "host clock around trace, torch_xla.sync and wait_device_ops"
    # torch-xla's persistent cache, read when the first graph compiles (torch_xla/runtime.py:
    # initialize_cache "must be called before any computations have been performed").
    compiler_packages = ("torch", "torch-xla")
    compile_cache_variable = "XLA_PERSISTENT_CACHE_PATH"
    compile_cache_unset = "none (torch-xla keeps no persistent cache unless told)"
    trial_owns_cpus = True  # the XLA CPU client computes on every core it is given
    max_study_batch = 16  # seed 000's batch per NeuronCore, kept on every XLA device
    host_read_cost = ("a graph cut: the pending lazy graph is compiled (once per distinct graph) and run "
                      "before the value reaches the host; a host value in a device op is a host-to-device copy")

    def __init__(self) -> None:
        # Batch iterators of this process whose group count a sync must restart.
        self._groups: "weakref.WeakSet[_ExecutionGroups]" = weakref.WeakSet()
        self._memory_info_unsupported = False

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """The XLA knobs. A smoke run (seconds a trial) traces at most 2 steps into a graph: XLA's
        CPU compiler took 46 s for a 10-step graph of the micro ViT on 2 cores (a trial of the
        XLA smoke sweep, benchmarks/results/test_suite.md; neuronx-cc's time is not measured here)."""
        for name, values in self.Knobs.searched().items():
            if name == "batches_per_execution" and study.smoke:
                values = SMOKE_BATCHES_PER_EXECUTION
            trial.suggest_categorical(name, list(values))
        return None

    def detect(self) -> Detection:
        if importlib.util.find_spec("torch_xla") is None:
            return Detection(False, "torch_xla is not installed (pip install torch==2.9.0 torch_xla==2.9.0)")
        return Detection(True, f"torch_xla importable, PJRT_DEVICE={self.pjrt_device()}")

    @staticmethod
    def pjrt_device() -> str:
        return os.environ.get("PJRT_DEVICE", "CPU")

    def capabilities(self, config) -> Capabilities:
        device = self.pjrt_device()
        if device != "CPU":
            return not_known(f"PJRT_DEVICE={device}", "the xla platform reads only the CPU client's hardware "
                                                     "(platforms tpu and neuron read theirs)")
        return xla_cpu_capabilities(CpuPlatform().capabilities(config))

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        if config.resident_batches:
            # Not built here: the steps' graph cuts (_ExecutionGroups) wrap MpDeviceLoader's
            # uploads, and a cycle of kept device batches would have to be cut alike.
            raise ConfigError("resident_batches", f"0 on platform {self.name!r}", config.resident_batches,
                              "Batches kept on the device are built for the cpu and cuda platforms; here "
                              "MpDeviceLoader already uploads them in the background.")
        # Tried with torch-xla 2.9 on PJRT_DEVICE=CPU (CPU_NUM_DEVICES=2, torch_xla.launch,
        # dist "xla" backend): the all-reduce waits for a second participant in the same
        # process and XLA aborts after its rendezvous timeout. The CPU client's collectives
        # are in-process only, so a process per worker cannot all-reduce on it.
        if self.name == "xla" and config.workers > 1:
            raise ConfigError("workers", "1 on platform 'xla'", config.workers,
                              "Several XLA workers need a device backend: use platform 'neuron' (Ray's Neuron "
                              "XLA backend) or 'cpu' (DDP over gloo).")

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        return {**self.runtime_env(), **self.compile_cache_env(config)}

    def compile_cache(self, config: "TrialConfig") -> Optional[str]:
        # Every XLA trial compiles (lazy tensors), torch.compile or not. The CPU client
        # writes the cache but cannot load executables back (torch-xla 2.9: "Deserializing
        # serialized executable not supported"): there a cache is set only where one is
        # named; TPU and GPU clients load theirs, and get the per-user default too.
        return cache_location(config.compile_cache, self.name, self.compiler_packages, self.compiler_flags(config),
                              default=self.pjrt_device() != "CPU")

    def compiler_flags(self, config: "TrialConfig") -> str:
        # XLA's own compiler flags, and libtpu's on a TPU: not known to be in torch-xla's key.
        return " ".join(os.environ.get(name, "") for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")).strip()

    def compile_cache_env(self, config: "TrialConfig") -> dict[str, str]:
        location = self.compile_cache(config)
        return {self.compile_cache_variable: location} if location else {}

    def steps_per_execution(self, config: "TrialConfig") -> int:
        return config.knobs.batches_per_execution

    def runtime_env(self) -> dict[str, str]:
        return {"PJRT_DEVICE": self.pjrt_device()}  # torch-xla's PJRT client, read when it starts

    def torch_device(self) -> "torch.device":
        try:
            import torch_xla
            import torch_xla.core.xla_model as xm
        except ImportError as error:
            raise PlatformUnavailable(f"platform {self.name} needs torch-xla ({error}; on Neuron it comes with "
                                      "torch-neuronx)") from None
        device = torch_xla.device()
        found = xm.xla_device_hw(device)
        if self.hardware and found != self.hardware:
            raise PlatformUnavailable(f"platform {self.name} needs torch-xla on {self.hardware}, but its device is "
                                      f"{found} (PJRT_DEVICE={os.environ.get('PJRT_DEVICE', 'unset')}): nothing timed")
        return device

    def device_batches(self, loader: Iterable, device: "torch.device", config: "TrialConfig") -> Iterable:
        import torch_xla.distributed.parallel_loader as parallel_loader

        # MpDeviceLoader uploads in the background; told never to cut the graph itself
        # (it would cut every k batches counted from its own start, not from our syncs).
        uploaded = parallel_loader.MpDeviceLoader(loader, device, batches_per_execution=sys.maxsize)
        groups = _ExecutionGroups(uploaded, self.steps_per_execution(config))
        self._groups.add(groups)
        return groups

    def distribute(self, model: Any, device: "torch.device") -> Any:
        return model  # xm.optimizer_step all-reduces the gradients itself

    def optimizer_step(self, optimizer: Any) -> None:
        import torch_xla.core.xla_model as xm

        xm.optimizer_step(optimizer)

    def sync(self, device: "torch.device") -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()  # cut and launch any pending graph
        xm.wait_device_ops()  # then wait for the device to finish it
        for groups in list(self._groups):
            groups.restart()  # the next group starts here

    def peak_memory_mb(self, device: "torch.device") -> float:
        import torch_xla.core.xla_model as xm

        if self._memory_info_unsupported:
            return float("nan")
        try:
            # {"bytes_used", "bytes_limit", "peak_bytes_used"}; the peak is since the
            # process started (PJRT has no reset). The CPU client raises RuntimeError
            # "UNIMPLEMENTED: GetAllocatorStats is not supported".
            info = xm.get_memory_info(device)
        except (RuntimeError, ValueError):
            self._memory_info_unsupported = True
            return float("nan")
        peak = info.get("peak_bytes_used", info.get("bytes_used"))
        return float("nan") if peak is None else peak / 2**20

    def describe_device(self, device: "torch.device") -> str:
        import torch_xla.core.xla_model as xm

        return f"xla: {xm.xla_device_hw(device)} ({device})"

    def compile_stats(self) -> dict[str, float]:
        import torch_xla.debug.metrics as metrics

        # One CompileTime sample per PJRT compile, in ns: (total samples, sum, recent
        # samples); None before the first compile. In-memory cache hits (CachedCompile)
        # and persistent-cache loads (PersistentCacheHit) add no sample.
        count, total_ns, _samples = metrics.metric_data("CompileTime") or (0, 0, None)
        return {"xla_compiles": float(count), "xla_compile_s": total_ns / 1e9,
                "xla_cache_hits": float(metrics.counter_value("PersistentCacheHit") or 0)}

    def compile_count(self) -> float:
        return self.compile_stats()["xla_compiles"]

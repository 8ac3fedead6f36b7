"""The kernel microbenchmark harness: one implementation of one op, checked, then timed.

    from trainables.microbench import KernelConfig, run_microbench
    run_microbench(KernelConfig(op="giou", impl="torch-naive", batch=64, boxes=256))

Inputs are fresh random arrays (seeded). The implementation's output is compared with
the op's numpy float64 reference before anything is timed: a wrong kernel raises
``KernelMismatch`` (a failed trial), never a fast one. Then warm-up calls (compilation,
caches) are not timed, and each call is timed to its device's completion: JAX's
``block_until_ready``, a CUDA synchronize, or nothing on a CPU where the call returns
done. Calls repeat in windows of at least N calls and T seconds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from trainables.config import ConfigError, DictConfig, non_negative_float, one_of, positive_int
from trainables.measure import percentile, time_window

KERNEL_PLATFORMS = ("cpu", "cuda")  # the platform registry has no tpu entry yet
KERNEL_METRICS = ("latency_p50_s", "latency_p10_s", "latency_p90_s", "latency_cv", "max_abs_error",
                  "items_per_s")


class KernelMismatch(RuntimeError):
    """The implementation's output differs from the reference beyond tolerance."""


@dataclass(frozen=True)
class KernelConfig(DictConfig):
    op: str = "giou"
    impl: str = "torch-naive"
    platform: str = "cpu"
    batch: int = 1
    boxes: int = 256
    dtype: str = "float32"
    warmup_calls: int = 3
    window_min_calls: int = 10
    window_min_s: float = 0.3
    windows: int = 3
    seed: int = 0
    cpus_per_worker: int = 1
    workers: int = 1  # a microbenchmark is one process

    def __post_init__(self) -> None:
        from kernels.registry import get_op

        spec = get_op(self.op)
        implementation = spec.impl(self.impl)
        one_of("platform", self.platform, KERNEL_PLATFORMS)
        if self.platform not in implementation.platforms:
            runs_here = ", ".join(i.name for i in spec.impls_for(self.platform)) or "none"
            raise ConfigError("impl", f"an implementation that runs on {self.platform} ({runs_here})", self.impl,
                              f"{self.impl} runs on {', '.join(implementation.platforms)}.")
        positive_int("batch", self.batch)
        if "batch" not in spec.shape_params and self.batch != 1:
            raise ConfigError("batch", f"1 for op {self.op!r} (it takes one image)", self.batch)
        positive_int("boxes", self.boxes)
        one_of("dtype", self.dtype, tuple(spec.tolerance))
        positive_int("warmup_calls", self.warmup_calls)
        positive_int("window_min_calls", self.window_min_calls)
        non_negative_float("window_min_s", self.window_min_s)
        positive_int("windows", self.windows)
        positive_int("seed", self.seed, minimum=0)
        positive_int("cpus_per_worker", self.cpus_per_worker)
        if self.workers != 1:
            raise ConfigError("workers", "1 for a kernel microbenchmark", self.workers)

    def shape(self) -> dict[str, int]:
        from kernels.registry import get_op

        return {name: getattr(self, name) for name in get_op(self.op).shape_params}


def _framework_io(framework: str, platform: str, threads: int):
    """(to_framework, wait_for, to_numpy, device name) for an implementation's framework."""
    import numpy as np

    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
        # A reused trial process must not carry torch.compile state from another shape
        # (it would recompile with dynamic shapes: a different kernel than asked for).
        torch._dynamo.reset()
        device = torch.device("cuda" if platform == "cuda" else "cpu")
        wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def wait_for(output):
            wait()
            return output

        # clone(): torch-allocated (64-byte aligned) memory; numpy's alignment varies run to run,
        # and vectorised CPU kernels run at different speeds on it.
        return (lambda a: torch.from_numpy(a).to(device).clone()), wait_for, (lambda o: o.cpu().numpy()), str(device)
    if framework == "jax":
        import jax

        return jax.device_put, jax.block_until_ready, np.asarray, str(jax.devices()[0])
    return (lambda a: a), (lambda o: o), np.asarray, "cpu (numpy)"


def run_microbench(config: KernelConfig, report: Optional[Callable[[dict], None]] = None) -> dict:
    import numpy as np

    from kernels.registry import get_op

    spec = get_op(config.op)
    implementation = spec.impl(config.impl)
    kernel = implementation.load()
    to_framework, wait_for, to_numpy, device = _framework_io(implementation.framework, config.platform,
                                                            config.cpus_per_worker)
    arrays = spec.make_inputs(config.seed, **config.shape())
    expected = spec.canonical(spec.reference(*arrays))
    inputs = [to_framework(a.astype(config.dtype)) for a in arrays]

    got = spec.canonical(to_numpy(wait_for(kernel(*inputs))))
    if np.shape(got) != np.shape(expected):
        raise KernelMismatch(f"{config.impl} output shape {np.shape(got)} != reference {np.shape(expected)}")
    max_abs_error = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
    tolerance = spec.tolerance[config.dtype]
    if not max_abs_error <= tolerance:
        raise KernelMismatch(f"{config.impl} differs from the reference by {max_abs_error:.3g} "
                             f"(tolerance {tolerance:g} for {config.dtype}): not timed")

    def call() -> None:
        wait_for(kernel(*inputs))

    loop_start = time.perf_counter()
    for _ in range(config.warmup_calls):
        call()
    items = spec.items(**config.shape())
    interpreted = config.platform in implementation.interpreted_on
    latencies: list[float] = []
    window_medians: list[float] = []
    result: dict = {}
    for index in range(1, config.windows + 1):
        window = time_window(call, lambda: None, config.window_min_calls, config.window_min_s)
        latencies += window.step_seconds
        window_medians.append(percentile(window.step_seconds, 50))
        p50 = percentile(latencies, 50)
        result = {
            "latency_p50_s": p50,
            "latency_p10_s": percentile(latencies, 10),
            "latency_p90_s": percentile(latencies, 90),
            # How much the figure moves from window to window: the measurement's own noise.
            "latency_cv": (statistics.pstdev(window_medians) / statistics.fmean(window_medians)
                           if len(window_medians) > 1 else float("nan")),
            "max_abs_error": max_abs_error,
            "items_per_s": items / p50 if p50 > 0 else float("nan"),
            "calls": len(latencies),
            "loop_s": time.perf_counter() - loop_start,
            "windows_done": index,
            "interpreted": int(interpreted),
            "device": device + (" (Pallas interpret mode: not a speed figure)" if interpreted else ""),
            "impl": config.impl,
        }
        if report is not None:
            report(result)
    return result


def kernel_trainable(searched: Mapping[str, Any], base: Mapping[str, Any], cost=None) -> None:
    from ray import tune

    run_microbench(KernelConfig.from_dict({**base, **searched}), report=tune.report)
